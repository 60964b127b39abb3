"""`--eval-after`: the evaluation suite on the trained encoder, before the final save.

The evaluation package sits above the engine, so it is imported only inside these two functions: a
run without `--eval-after` never loads it. The scores go into `mirrorbert.json` and the model card as data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)


def check_eval_after(tasks: str | Iterable[str] | None, data_dir: str | None) -> list[str]:
    """Validated task names (empty when none asked); fails before training on unknown tasks or data dir."""
    if tasks is None or (isinstance(tasks, str) and not tasks.strip()):
        return []
    from mirrorbert.evaluation import datasets
    from mirrorbert.evaluation.runner import parse_tasks
    from mirrorbert.errors import UserError

    try:
        names = parse_tasks(tasks)
        datasets.resolve_data_dir(data_dir)
    except UserError as exc:
        raise UserError(f"--eval-after: {str(exc).removeprefix('--tasks: ')}") from None
    return names


def evaluate_after_training(encoder, tasks: list[str], data_dir: str | None, batch_size: int = 64) -> dict[str, Any]:
    """Run the evaluation suite on the trained encoder: flat metrics ``{"task/metric": value}`` and statuses."""
    from mirrorbert.evaluation import evaluate

    result = evaluate(encoder, tasks, data_dir, batch_size=batch_size, model_name=str(encoder.source))
    metrics = {f"{task}/{key}": value for task, outcome in result.outcomes.items() for key, value in outcome.metrics.items()}
    not_run = {task: f"{o.status}: {o.message}" for task, o in result.outcomes.items() if o.status != "ok"}
    for task, message in not_run.items():
        logger.warning("--eval-after %s: %s", task, message)
    return {"tasks": list(tasks), "data_dir": result.data_dir, "scale": "fractions (x100 in the card)",
            "metrics": metrics, "not_run": not_run}
