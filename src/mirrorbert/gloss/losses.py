"""GR-BERT losses: the gloss-regularising InfoNCE and the masked-LM loss on target positions.

The gloss regulariser pulls a word's contextual representation towards the embedding of the
gloss that describes its meaning in that context, and away from the other glosses in the
batch (in-batch negatives) and from one other gloss of the same word (a hard negative that
forces sense distinctions rather than topic matching). Similarity is cosine over a
temperature tau = 0.05, as in the paper.
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
DEFAULT_TAU = 0.05


def cosine_logits(queries: torch.Tensor, candidates: torch.Tensor, tau: float = DEFAULT_TAU) -> torch.Tensor:
    """``cos(q_i, e_j) / tau`` for all pairs: [B, d] x [G, d] -> [B, G], computed in float32."""
    q = F.normalize(queries.float(), dim=-1)
    e = F.normalize(candidates.float(), dim=-1)
    return q @ e.T / tau


def gloss_infonce(
    queries: torch.Tensor,
    glosses: torch.Tensor,
    targets: torch.Tensor,
    tau: float = DEFAULT_TAU,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """InfoNCE of each query against all gloss embeddings; ``targets[i]`` indexes its gloss.

    ``glosses`` holds every distinct gloss of the batch (positives and hard negatives), so
    the other rows are the negatives. ``candidate_mask`` ([B, G], True = allowed) can remove
    candidates from a query's softmax (e.g. duplicates of its own gloss).
    """
    logits = cosine_logits(queries, glosses, tau)
    if candidate_mask is not None:
        logits = logits.masked_fill(~candidate_mask.bool(), float("-inf"))
    return F.cross_entropy(logits, targets.long())


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100 (0 when there are none).

    ``logits`` is either [..., V] aligned with ``labels`` [...], or already gathered at the
    labelled positions ([N, V] with ``labels`` [N]).
    """
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep], labels[keep].long())


def gloss_candidates(positives: Sequence[str], hard_negatives: Sequence[str | None]) -> tuple[list[str], list[int]]:
    """Distinct glosses of a batch and each triplet's target index among them.

    Deduplication matters: two triplets of the same synset share a gloss, and a hard
    negative may be another triplet's positive; encoding each text once keeps identical
    glosses from being counted as negatives of themselves.
    """
    index: dict[str, int] = {}
    candidates: list[str] = []

    def add(g: str) -> int:
        if g not in index:
            index[g] = len(candidates)
            candidates.append(g)
        return index[g]

    targets = [add(g) for g in positives]
    for g in hard_negatives:
        if g is not None:
            add(g)
    return candidates, targets


def pick_hard_negative(word: str, gloss: str, inventory: Mapping[str, Sequence[str]], rng: random.Random) -> str | None:
    """A random other gloss of ``word`` (None when the word has a single gloss)."""
    others = [g for g in inventory.get(word.lower(), ()) if g != gloss]
    return rng.choice(others) if others else None
