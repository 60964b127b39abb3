"""The losses a run reports, means over stated windows of steps: `final_loss` of the last min(WINDOW_STEPS, steps
per epoch) steps, `mean_loss_last_epoch` of the last complete epoch (or of the batches so far); the sums travel in
every checkpoint, so a resumed run reports what the run without the stop reports."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from mirrorbert.errors import UserError

WINDOW_STEPS = 50


class LossRecord:
    """Per-step losses folded into the reported means; `state()` / `restore()` carry them through a resume."""

    def __init__(self, steps_per_epoch: int, window: int = WINDOW_STEPS):
        self.window = max(1, min(window, steps_per_epoch))
        self.recent: deque[float] = deque(maxlen=self.window)
        self.epoch_sum, self.epoch_steps = 0.0, 0
        self.first: float | None = None  # for the collapse check after training
        self.last: float | None = None
        self.mean_last_epoch: float | None = None

    def add(self, loss: float) -> None:
        self.recent.append(loss)
        self.epoch_sum += loss
        self.epoch_steps += 1
        self.last = loss
        if self.first is None:
            self.first = loss

    def finish(self) -> None:
        """A run that stops inside an epoch (--steps) reports the mean of that epoch's batches so far."""
        if self.epoch_steps:
            self.mean_last_epoch = self.epoch_sum / self.epoch_steps

    def end_epoch(self) -> None:
        self.finish()
        self.epoch_sum, self.epoch_steps = 0.0, 0

    @property
    def final(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def fields(self) -> dict[str, Any]:
        """The losses as the run's records name them (train JSON, mirrorbert.json, training info)."""
        return {"final_loss": self.final, "final_loss_window_steps": len(self.recent),
                "last_batch_loss": self.last, "mean_loss_last_epoch": self.mean_last_epoch}

    def state(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "epoch_sum": self.epoch_sum, "epoch_steps": self.epoch_steps,
                "first": self.first, "last": self.last, "mean_last_epoch": self.mean_last_epoch}

    def restore(self, extra: dict[str, Any], where: str) -> None:
        """The record a checkpoint holds (`extra["losses"]`); one missing or malformed is one UserError."""
        state = extra.get("losses")
        if not isinstance(state, dict) or not isinstance(state.get("recent"), list) or \
                not isinstance(state.get("epoch_steps"), int) or state["epoch_steps"] < 0:
            raise UserError(f"{where}: the training state is damaged (its loss record is not one mirrorbert writes)")
        self.recent.extend(_number(v, where, required=True) for v in state["recent"][-self.window:])
        self.epoch_sum, self.epoch_steps = _number(state.get("epoch_sum"), where) or 0.0, state["epoch_steps"]
        self.first, self.last = _number(state.get("first"), where), _number(state.get("last"), where)
        self.mean_last_epoch = _number(state.get("mean_last_epoch"), where)


def _number(value: Any, where: str, required: bool = False) -> float | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: the training state is damaged (a recorded loss is {value!r})")
    return float(value)


__all__ = ["LossRecord", "WINDOW_STEPS"]
