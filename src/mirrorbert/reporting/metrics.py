"""Metric logging (optional TensorBoard) and the library versions recorded with a model."""

from __future__ import annotations

from pathlib import Path

import torch

from mirrorbert.errors import UserError


class MetricLogger:
    """Optional TensorBoard scalars; a no-op when no log dir is given."""

    def __init__(self, log_dir: str | Path | None):
        self.writer = None
        if log_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UserError("--log-dir needs TensorBoard: pip install 'mirrorbert[tensorboard]'") from None
            self.writer = SummaryWriter(str(log_dir))

    def log(self, step: int, **scalars: float) -> None:
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def library_versions() -> dict[str, str]:
    import platform

    import tokenizers
    import transformers

    from mirrorbert._version import __version__

    return {"mirrorbert": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "tokenizers": tokenizers.__version__}
