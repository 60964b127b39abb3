"""After training: did the embeddings collapse (every string mapped to nearly the same vector: mean pairwise cosine
near 1)? One warning line with the likely fix, if so, or if the loss did not fall; the numbers are recorded in
mirrorbert.json (its `training` record, key `collapse`) either way.
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


#: below this many parameters a raw MLM counts as small: the paper's lr (set for a 110M-parameter BERT) barely moves it
SMALL_MODEL_PARAMETERS = 50_000_000
SMALL_MODEL_LR = 5e-4  # what lifts the quickstart's 11M-parameter reference MLM
PAPER_LR = 2e-5


def collapse_advice(lr: float | None, parameters: int | None, pooling: str | None = None, *,
                    raw_mlm: bool = True) -> str:
    """The fix to suggest for a collapsed space, for the lr trained at, the model's size and whether training
    started from a raw (never-tuned) MLM: a higher lr helps only a small raw MLM, never an already-tuned encoder."""
    tips = []
    small = parameters is not None and parameters < SMALL_MODEL_PARAMETERS
    if not raw_mlm:
        tips.append(f"a lower --lr (the paper's {PAPER_LR:g} or less) or fewer steps (this model was already tuned as "
                    f"a sentence encoder; a higher lr helps only a raw MLM)")
    elif small and (lr is None or lr < SMALL_MODEL_LR):
        tips.append(f"a higher --lr: this is a small model ({parameters / 1e6:.0f}M parameters), which the paper's "
                    f"2e-5 (set for a 110M-parameter BERT) barely moves; --lr {SMALL_MODEL_LR:g} is what the "
                    f"quickstart uses on its 11M-parameter reference MLM")
    elif small:  # already at the small-model lr: the MLM itself is the limit
        tips.append(f"a longer pre-trained or larger base model (this one has {parameters / 1e6:.0f}M parameters; "
                    f"the quickstart's QUICKSTART_BUDGET_S gives its reference MLM more tokens)")
    elif lr is not None and parameters is not None and lr > PAPER_LR:
        tips.append(f"a lower --lr (the paper's {PAPER_LR:g} for a BERT-base-size model)")
    elif lr is None or parameters is None:  # nothing known of the run: both directions, by model size
        tips.append(f"--lr {SMALL_MODEL_LR:g} on a small MLM (under {SMALL_MODEL_PARAMETERS // 1_000_000}M "
                    f"parameters, as the quickstart does), the paper's {PAPER_LR:g} on a BERT-base-size one")
    else:
        tips.append("a larger or longer pre-trained base model")
    if pooling == "cls":
        tips.append("mean pooling (--pooling mean)")
    return "; try " + ", or ".join(tips)


def check_collapse(encoder, strings: Sequence[str], first_loss: float | None, last_loss: float | None, steps: int, *,
                   seed: int = 0, advice: str | None = None) -> dict[str, Any]:
    """Measure, warn in one line when collapsed (with `advice`, default: `collapse_advice` knowing nothing of the
    run) or stuck, and return what to record. `strings` is only indexed (it may be the token store's)."""
    picks = range(len(strings)) if len(strings) <= SAMPLE else random.Random(seed).sample(range(len(strings)), SAMPLE)
    sample = [strings[i] for i in picks]
    report: dict[str, Any] = {"sample": len(sample), "threshold": COLLAPSE_COSINE}
    if len(sample) >= 2:
        report["mean_pairwise_cosine"] = round(mean_pairwise_cosine(encoder.encode(sample)), 6)
    collapsed = report.get("mean_pairwise_cosine", 0.0) > COLLAPSE_COSINE
    stuck = (first_loss is not None and last_loss is not None and steps >= 10
             and last_loss >= STUCK_LOSS_SHARE * first_loss)
    report.update(collapsed=collapsed, loss_stuck=bool(stuck), first_loss=first_loss, last_loss=last_loss)
    if collapsed:
        advice = collapse_advice(None, None) if advice is None else advice
        logger.warning("the embeddings collapsed: %d training strings have a mean pairwise cosine of %.4f "
                       "(> %.2f), so the model barely tells them apart%s", len(sample),
                       report["mean_pairwise_cosine"], COLLAPSE_COSINE, advice)
    elif stuck:
        logger.warning("the loss did not fall: %.4f at the first step, %.4f over the last epoch; likely cause: "
                       "the learning rate (try --lr 10x lower or higher) or too few steps", first_loss, last_loss)
    return report


__all__ = ["check_collapse", "collapse_advice", "mean_pairwise_cosine"]
