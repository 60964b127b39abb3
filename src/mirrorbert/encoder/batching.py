"""Batching of tokenised views: padding (this module) or packing (`mirrorbert.encoder.packing`).

Sits between views and the encoder: it turns lists of token ids into model inputs and knows nothing
about the model beyond a pad id.
"""

from __future__ import annotations

from typing import Sequence

import torch


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int, length: int | None = None) -> dict[str, torch.Tensor]:
    """Pad only to the longest sequence of this batch (or to `length`, for a model that takes one length only)."""
    longest = max(max(len(s) for s in sequences), length or 0)
    input_ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, : len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}
