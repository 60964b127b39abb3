"""The Mirror-BERT contrastive loss (paper eq. 1): InfoNCE over the 2B views of a batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mirror_infonce(embeddings: torch.Tensor, temperature: float) -> torch.Tensor:
    """Rows are [f(x_1)..f(x_B), f(xbar_1)..f(xbar_B)].

    For each of the 2B anchors the positive is its mirror view (i <-> i+B) and the negatives are the
    other 2B-2 views (both views of every other string); the anchor itself is excluded from the
    denominator. Similarity is cosine / temperature; the loss is the mean over all 2B anchors.
    """
    n = embeddings.shape[0]
    if n % 2 or n < 4:
        raise ValueError("mirror_infonce needs an even number of rows, from at least 2 strings")
    # half-precision embeddings (autocast) are upcast: the softmax over 2B logits needs fp32 range
    z = F.normalize(embeddings.float() if embeddings.dtype in (torch.float16, torch.bfloat16) else embeddings, dim=-1)
    logits = z @ z.T / temperature
    logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), float("-inf"))
    half = n // 2
    targets = torch.cat([torch.arange(half, n), torch.arange(0, half)]).to(z.device)
    return F.cross_entropy(logits, targets)
