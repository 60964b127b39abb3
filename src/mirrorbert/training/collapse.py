"""After training: did the embeddings collapse? One line with the likely cause and the fix, if so.

A collapsed encoder maps every string to nearly the same vector (mean pairwise cosine near 1): the
contrastive loss could not separate the views, typically because the MLM is too small or too briefly
pre-trained for the preset, the learning rate too high, or the temperature too low for word-level data.
The numbers are recorded in mirrorbert.json (`training.collapse`) either way.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Sequence

import numpy as np

logger = logging.getLogger(__name__)

#: mean pairwise cosine of a sample of strings above which the space counts as collapsed
COLLAPSE_COSINE = 0.99
#: the last epoch's mean loss at or above this share of the first step's loss counts as "stuck"
STUCK_LOSS_SHARE = 0.98
SAMPLE = 64


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = unit @ unit.T
    n = len(unit)
    return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


def check_collapse(encoder, strings: Sequence[str], first_loss: float | None, last_loss: float | None,
                   steps: int, seed: int = 0) -> dict[str, Any]:
    """Measure, warn in one line when collapsed or stuck, and return what to record."""
    sample = list(strings) if len(strings) <= SAMPLE else random.Random(seed).sample(list(strings), SAMPLE)
    report: dict[str, Any] = {"sample": len(sample), "threshold": COLLAPSE_COSINE}
    if len(sample) >= 2:
        report["mean_pairwise_cosine"] = round(mean_pairwise_cosine(encoder.encode(sample)), 6)
    collapsed = report.get("mean_pairwise_cosine", 0.0) > COLLAPSE_COSINE
    stuck = (first_loss is not None and last_loss is not None and steps >= 10
             and last_loss >= STUCK_LOSS_SHARE * first_loss)
    report.update(collapsed=collapsed, loss_stuck=bool(stuck), first_loss=first_loss, last_loss=last_loss)
    if collapsed:
        logger.warning("the embeddings collapsed: %d training strings have a mean pairwise cosine of %.4f "
                       "(> %.2f), so the model barely tells them apart; likely cause: a small or briefly "
                       "pre-trained MLM, or too high a learning rate; try a lower --lr, mean pooling "
                       "(--pooling mean) or a larger base model", len(sample), report["mean_pairwise_cosine"],
                       COLLAPSE_COSINE)
    elif stuck:
        logger.warning("the loss did not fall: %.4f at the first step, %.4f over the last epoch; likely cause: "
                       "the learning rate (try --lr 10x lower or higher) or too few steps", first_loss, last_loss)
    return report


__all__ = ["check_collapse", "mean_pairwise_cosine"]
