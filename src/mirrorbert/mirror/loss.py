"""The Mirror-BERT losses over the 2B views of a batch: `MirrorInfoNCE` (paper eq. 1) and `MirrorMultiSimilarity`
(SapBERT's multi-similarity loss), each a module called on the rows [f(x_1)..f(x_B), f(xbar_1)..f(xbar_B)] and
computed in at least fp32 with autocast off, whatever the training precision; `mirrorbert train` and the
sentence-transformers integration call the same objects.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F

from mirrorbert.errors import UserError
from mirrorbert.settings.choices import LOSSES


@contextlib.contextmanager
def full_precision(embeddings: torch.Tensor):
    """Autocast off around the loss; half-precision embeddings are upcast to fp32 (fp64 stays fp64)."""
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        yield embeddings.float() if embeddings.dtype in (torch.float16, torch.bfloat16) else embeddings


def _unit_rows(embeddings: torch.Tensor) -> torch.Tensor:
    n = embeddings.shape[0]
    if n % 2 or n < 4:
        raise ValueError("the Mirror-BERT losses need an even number of rows, from at least 2 strings")
    return F.normalize(embeddings, dim=-1)


def _mirror_index(n: int, device: torch.device) -> torch.Tensor:
    half = n // 2
    return torch.cat([torch.arange(half, n), torch.arange(0, half)]).to(device)


def _positive_finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise UserError(f"{name}: must be a positive finite number, not {value!r}")
    return float(value)


class MirrorInfoNCE(torch.nn.Module):
    """InfoNCE over the 2B views (paper eq. 1): for each anchor the positive is its mirror view (i <-> i+B), the
    negatives the other 2B-2 views, the anchor excluded from the denominator; cosine / temperature, mean over
    all 2B anchors."""

    name = "infonce"

    def __init__(self, temperature: float = 0.04):
        super().__init__()
        self.temperature = _positive_finite(temperature, "temperature")

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        with full_precision(embeddings) as emb:
            z = _unit_rows(emb)
            n = z.shape[0]
            logits = z @ z.T / self.temperature
            logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), float("-inf"))
            return F.cross_entropy(logits, _mirror_index(n, z.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"loss": self.name, "temperature": self.temperature}


class MirrorMultiSimilarity(torch.nn.Module):
    """Multi-similarity loss (Wang et al. 2019) on triplets mined online, as SapBERT trains.

    The two views of a string are the only positives of each other; every other view is a negative. Mining keeps
    the triplets (a, p, n) with d(a, n) - d(a, p) <= margin, d the Euclidean distance of the unit vectors
    (pytorch-metric-learning's TripletMarginMiner, type "all"); per anchor the loss is (1/alpha) log(1 + sum_p
    e^{-alpha (cos - base)}) + (1/beta) log(1 + sum_n e^{beta (cos - base)}) over the mined pairs, averaged over
    all 2B anchors; zero (with zero gradients) when nothing is mined. Unlike the library, one mined triplet counts.
    """

    name = "ms"
    alpha, beta, base, margin = 1.0, 60.0, 0.5, 0.2  # SapBERT's (Liu et al. 2021), loss and miner

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        with full_precision(embeddings) as emb:
            z = _unit_rows(emb)
            n = z.shape[0]
            sim = z @ z.T
            mirror = _mirror_index(n, z.device)
            positive = torch.zeros(n, n, dtype=torch.bool, device=z.device)
            positive[torch.arange(n, device=z.device), mirror] = True
            negative = ~positive & ~torch.eye(n, dtype=torch.bool, device=z.device)
            with torch.no_grad():
                # the miner measures Euclidean distance between the unit vectors (the library's default)
                dist = torch.cdist(z, z, p=2)
                pos_dist = dist.gather(1, mirror[:, None])  # [n, 1]: to the anchor's one positive
                # a triplet (a, mirror(a), m) is mined when d(a, m) - d(a, mirror) <= margin
                neg_mined = negative & (dist - pos_dist <= self.margin)
                pos_mined = positive & neg_mined.any(dim=1, keepdim=True)
            if not bool(neg_mined.any()):
                return (embeddings * 0).sum().to(emb.dtype)
            zero = torch.zeros(n, 1, dtype=sim.dtype, device=sim.device)
            pos_terms = torch.cat([(self.alpha * (self.base - sim)).masked_fill(~pos_mined, float("-inf")), zero],
                                  dim=1)
            neg_terms = torch.cat([(self.beta * (sim - self.base)).masked_fill(~neg_mined, float("-inf")), zero],
                                  dim=1)
            per_anchor = torch.logsumexp(pos_terms, dim=1) / self.alpha + torch.logsumexp(neg_terms, dim=1) / self.beta
            return per_anchor.mean()

    def get_config_dict(self) -> dict[str, Any]:
        return {"loss": self.name, "alpha": self.alpha, "beta": self.beta, "base": self.base, "margin": self.margin}


def build_loss(name: str, temperature: float) -> MirrorInfoNCE | MirrorMultiSimilarity:
    """The loss named by `--loss`, called on the [2B, d] embeddings; `temperature` is InfoNCE's (checked whichever
    loss is named), the multi-similarity loss has SapBERT's fixed constants."""
    _positive_finite(temperature, "temperature")
    if name == MirrorInfoNCE.name:
        return MirrorInfoNCE(temperature)
    if name == MirrorMultiSimilarity.name:
        return MirrorMultiSimilarity()
    raise UserError(f"loss: unknown loss {name!r}; choose one of {', '.join(LOSSES)}")


__all__ = ["LOSSES", "MirrorInfoNCE", "MirrorMultiSimilarity", "build_loss"]
