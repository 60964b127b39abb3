"""The Mirror-BERT paper's evaluation suite: STS, word similarity, BEL, QNLI, BLI, isotropy.

``evaluate(encoder, tasks=[...], data_dir=...)`` runs tasks on any object with the encoder protocol
``encode(texts, batch_size=64, normalize=False, show_progress=False) -> np.ndarray``.
"""

from mirrorbert.evaluation.runner import DEFAULT_TASKS, TASKS, EvaluationResult, TaskOutcome, evaluate

__all__ = ["evaluate", "EvaluationResult", "TaskOutcome", "TASKS", "DEFAULT_TASKS"]
