"""The bookkeeping options every trainer shares (output, checkpoints, logs, resume, seed, hardware), read by
training/run.py; a trainer redeclares only a field whose default differs (`fields.redeclare`). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mirrorbert.settings.fields import option
from mirrorbert.settings.option_help import COUNT
from mirrorbert.settings.validation import Options

CHECKPOINTS_SUFFIX = ".checkpoints"


@dataclass(kw_only=True)
class RunOptions(Options):
    """Options of a training run that are not its method; each field is a command-line option of the same name."""

    output: str | None = option(None, shared="output", note="the trained model's folder", group="output",
                                required=True, resume_safe=True)
    overwrite: bool = option(False, shared="overwrite", group="output", resume_safe=True)
    seed: int = option(42, shared="seed", group="optimisation", card=True)
    device: str = option("auto", shared="device", group="hardware", resume_safe=True)
    precision: str = option("auto", shared="precision", group="hardware", card=True)
    threads: int | None = option(None, shared="threads", group="hardware", resume_safe=True)
    save_every: int = option(0, help="write a checkpoint every N steps", note="0: only at the end or on interrupt",
                             range="[0, inf)", group="hardware", resume_safe=True)
    checkpoint_dir: str | None = option(None, help="where checkpoints go", unset=f"<output>{CHECKPOINTS_SUFFIX}",
                                        group="hardware", resume_safe=True)
    keep_checkpoints: int = option(2, help="how many checkpoints to keep", range=COUNT, group="hardware",
                                   resume_safe=True)
    resume: str | None = option(None, help="continue from a checkpoint folder (step-N) or a checkpoint root",
                                group="hardware", resume_safe=True)
    log_dir: str | None = option(None, help="write TensorBoard scalars here", group="hardware", resume_safe=True)
    log_every: int = option(10, help="log training metrics every N steps", range=COUNT, group="hardware",
                            resume_safe=True)
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress", group="hardware",
                                 resume_safe=True)
    # run Python code shipped with the model (auto_map): the command line or Python only, never a config file
    trust_remote_code: bool = option(False, shared="trust_remote_code", command_line_only=True, resume_safe=True)

    def resolved_checkpoint_dir(self) -> Path:
        """`--checkpoint-dir`, or beside the output (`<output>.checkpoints`)."""
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return Path(f"{Path(self.output).as_posix().rstrip('/')}{CHECKPOINTS_SUFFIX}")


__all__ = ["RunOptions"]
