"""Unsupervised QNLI: ROC AUC of cosine(question, sentence) against the entailment labels (GLUE dev).

No classifier is trained: cosine similarity alone ranks the pairs; AUC is the Mann-Whitney statistic (ties count
one half). The ROC curve is written as a PNG when a plot folder is given.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import UserError
from mirrorbert.evaluation import datasets
from mirrorbert.evaluation.sts import TaskMetrics, TextEncoder, pair_similarities, pyplot_figure, save_figure

logger = logging.getLogger(__name__)

POSITIVE = "entailment"
NEGATIVE = "not_entailment"


def load_qnli(path: str | Path) -> tuple[list[str], list[str], np.ndarray]:
    """GLUE QNLI tsv (header index, question, sentence, label) -> questions, sentences, 0/1 labels."""
    path = Path(path)
    questions, sentences, labels = [], [], []
    lines = read_text_lines(path)
    header = (lines[0] if lines else "").split("\t")
    try:
        iq, isent, ilab = header.index("question"), header.index("sentence"), header.index("label")
    except ValueError:
        raise UserError(f"{path}:1: expected a header with question, sentence, label") from None
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) <= max(iq, isent, ilab):
            raise UserError(f"{path}:{lineno}: expected {len(header)} TAB-separated fields, got {len(fields)}")
        label = fields[ilab].strip()
        if label not in (POSITIVE, NEGATIVE):
            raise UserError(f"{path}:{lineno}: label must be {POSITIVE} or {NEGATIVE}, got {label!r}")
        questions.append(fields[iq])
        sentences.append(fields[isent])
        labels.append(1 if label == POSITIVE else 0)
    return questions, sentences, np.asarray(labels, dtype=np.int64)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve via average ranks (Mann-Whitney U / (n_pos * n_neg))."""
    from scipy.stats import rankdata

    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise UserError("ROC AUC needs both positive and negative labels")
    ranks = rankdata(scores)  # average ranks for ties
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def roc_curve_points(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) at every distinct threshold, from (0, 0) to (1, 1)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    tp = np.cumsum(y)
    fp = np.cumsum(~y)
    last_of_tie = np.r_[s[1:] != s[:-1], True]
    tpr = np.r_[0.0, tp[last_of_tie] / max(int(y.sum()), 1)]
    fpr = np.r_[0.0, fp[last_of_tie] / max(int((~y).sum()), 1)]
    return fpr, tpr


def plot_roc(fpr: np.ndarray, tpr: np.ndarray, auc: float, path: str | Path, title: str = "QNLI dev") -> Path:
    fig, ax = pyplot_figure(figsize=(4.5, 4.5))
    ax.plot(fpr, tpr, label=f"cosine (AUC = {auc * 100:.2f})")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8, label="chance")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(f"{title}: ROC of cosine(question, sentence)")
    ax.legend(loc="lower right")
    return save_figure(fig, path, dpi=120)


def evaluate_qnli(
    encoder: TextEncoder,
    data_dir: str | Path | None = None,
    *,
    plot_dir: str | Path | None = None,
    batch_size: int = 64,
    show_progress: bool = False,
    **_: Any,
) -> TaskMetrics:
    """QNLI dev ROC AUC (fraction) as ``primary``; ROC PNG in ``plot_dir`` when given."""
    folder = datasets.require(data_dir, "qnli")
    questions, sentences, labels = load_qnli(folder / "dev.tsv")
    sims = pair_similarities(encoder, questions, sentences, batch_size=batch_size, show_progress=show_progress)
    auc = roc_auc(sims, labels)
    out = TaskMetrics(auc=auc, primary=auc, n=float(len(labels)), positive_rate=float(labels.mean()))
    if plot_dir is not None:
        fpr, tpr = roc_curve_points(sims, labels)
        out.artifacts["QNLI ROC curve"] = str(plot_roc(fpr, tpr, auc, Path(plot_dir) / "qnli_roc.png"))
    return out
