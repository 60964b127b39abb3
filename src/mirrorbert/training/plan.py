"""How a run's examples are cut into batches, one rule for the three methods, so their budgets cannot drift."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from mirrorbert.runtime.randomness import derived_generator


@dataclass
class BatchPlan:
    """Batches of `batch_size` from `n` examples in a seeded order per epoch (its own random `stream`): a pure
    function of its fields. A trailing single example is dropped (no negatives) unless `keep_short_last` (MLM)."""

    n: int
    batch_size: int
    seed: int
    stream: int = 0
    total_steps: int = 0
    keep_short_last: bool = False

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if rest >= (1 if self.keep_short_last else 2) else 0)

    def iter_batches(self, epoch: int, first: int = 0) -> Iterator[list[int]]:
        """The epoch's batches from batch `first` on, each a list of example indices, made one at a time from the
        epoch's permutation (an int64 tensor: 8 bytes an example, no Python list of them)."""
        order = torch.randperm(self.n, generator=derived_generator(self.seed, self.stream, epoch))
        for b in range(first, self.batches_per_epoch):
            yield order[b * self.batch_size:(b + 1) * self.batch_size].tolist()


def contrastive_plan(n: int, batch_size: int, seed: int, stream: int, steps: int | None, epochs: int) -> BatchPlan:
    """The plan of a contrastive method: the batch shrunk to the data when the data are fewer; its budget is
    `steps` when given, else whole epochs of batches."""
    plan = BatchPlan(n, min(batch_size, n), seed, stream)
    plan.total_steps = steps or epochs * plan.batches_per_epoch
    return plan


__all__ = ["BatchPlan", "contrastive_plan"]
