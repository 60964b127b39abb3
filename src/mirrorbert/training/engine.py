"""The training loop, written once for Mirror-BERT, MLM pre-training and GR-BERT: a `Method` supplies batches, steps
and checkpoint contents; the engine owns the step counter, progress, checkpoints, resume, Ctrl-C and SIGTERM (every
process stops at the same step), non-finite losses and a final save that never loses the trained state."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

from mirrorbert.errors import UserError, first_line
from mirrorbert.reporting.progress import progress_bar
from mirrorbert.runtime.distributed import DistContext
from mirrorbert.safeguards.writes import MARKER, atomic_output_dir, remove_tree
from mirrorbert.safeguards.writes.failures import WriteFailed
from mirrorbert.training.checkpoints import CheckpointManager
from mirrorbert.training.signals import NO_SIGNAL, SIGTERM_SEEN, InterruptFlag, signal_name

logger = logging.getLogger(__name__)


class Method(Protocol):
    """What a training method gives the engine (duck-typed; the three trainers each define one)."""

    total_steps: int
    precision: str  # what the steps run in (recorded in each checkpoint)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any

    def batches(self) -> Iterator[Any]:
        """Batches from the current position (resumed or 0) until the data runs out or forever."""

    def train_step(self, batch: Any, engine: Engine) -> dict[str, str]:
        """Forward, `engine.check_finite(loss)`, backward and update; returns the progress-bar fields."""

    def after_step(self, step: int) -> bool:
        """Bookkeeping after step `step` (metrics, epoch end, evaluation); True when a checkpoint is due now."""

    def finish(self) -> None:
        """Called once when training completes (not when interrupted), before the final checkpoint."""

    def save_model(self, folder: Path) -> None:
        """Write everything a resumed run loads as weights (the checkpoint's `model/` folder)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """The method's own resume position and history (the engine adds `step`)."""

    def checkpoint_meta(self) -> dict[str, Any]:
        """Facts checked on resume (config, data fingerprint)."""


@dataclass
class Outcome:
    steps: int
    interrupted: bool  # a signal stopped the run
    stopped: bool  # the run ended before its budget (interrupt, or a limit such as --stop-after-steps)
    checkpoint: Path | None
    signal: str | None = None  # the signal the processes agreed on: "SIGTERM" (preempted) or "SIGINT"


def stop_message(signal: str | None, steps: int, checkpoint: Path | None, rank: int = 0) -> str:
    """The line a stopped run prints: "preempted" (SIGTERM) or "interrupted", at which step, where the checkpoint
    is and how to resume; ranks other than 0 say their rank and name the checkpoint rank 0 wrote."""
    what = "preempted" if signal == "SIGTERM" else "interrupted"
    if rank:
        return f"rank {rank}: {what} at step {steps}; checkpoint (written by rank 0): {checkpoint}"
    return (f"{what} at step {steps} ({signal or 'signal'}); checkpoint written to {checkpoint}; "
            f"resume with the same command plus --resume {checkpoint}")


class Engine:
    """The loop over one `Method` (its `total_steps` steps); `checkpoints` says where, how often (`every`) and
    whether at the end."""

    def __init__(self, method: Method, *, checkpoints: CheckpointManager, dist=None, desc: str = "train",
                 show_progress: bool = True, timer=None):
        self.method, self.total_steps, self.checkpoints = method, method.total_steps, checkpoints
        self.timer = timer  # wall time per phase (steps, checkpoint, save): reporting/timing.py
        self.step, self.last_checkpoint = 0, None
        self.stop_at = self.total_steps  # a recipe may stop earlier (`Recipe.stop_at`)
        self.dist = dist or DistContext()  # one process: every collective a no-op
        self.desc, self.show_progress = desc, show_progress
        self.resumed_from: Path | None = None
        self.saving = False  # `save_final` began: it reports its own failure, the state kept

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()

    def run(self) -> Outcome:
        progress = progress_bar(total=self.total_steps, initial=self.step, show=self.show_progress and self.dist.is_main,
                                desc=self.desc, unit="step")
        agreed = NO_SIGNAL
        # The flag is outermost: inside it a SIGTERM only sets the flag, also while the checkpoint of an
        # interrupted run is written (a second SIGTERM must not kill rank 0 mid-write). The guard
        # turns a failed collective into one line naming the last good checkpoint.
        with InterruptFlag() as interrupt, self.dist.failure_guard(lambda: self.last_checkpoint, interrupt):
            try:
                with self._phase("steps"):
                    batches = self.method.batches()
                    while self.step < self.stop_at:
                        batch = next(batches, None)
                        if batch is None:
                            break
                        postfix = self.method.train_step(batch, self)
                        self.step += 1
                        progress.set_postfix(postfix, refresh=False)  # this step's, shown by its update
                        progress.update(1)
                        due = self.method.after_step(self.step)
                        every = self.checkpoints.every
                        if (self.checkpoints.at_end and due) or (every and self.step % every == 0):
                            self.save_checkpoint()
                        agreed = self.dist.agree(interrupt.code)  # every process stops at the same step
                        if agreed != NO_SIGNAL:
                            break
                    close = getattr(batches, "close", None)
                    if close is not None:
                        close()
            finally:
                progress.close()
            interrupted = agreed != NO_SIGNAL
            if interrupted:
                self._save_final_checkpoint()
        stopped = interrupted or self.step < self.total_steps
        # After the last step a SIGTERM waits: the steps are done, only bookkeeping and saves remain.
        with InterruptFlag("finishing the run first") as late, self.dist.failure_guard(lambda: self.last_checkpoint,
                                                                                        late):
            if not stopped:
                self.method.finish()
            if stopped or self.checkpoints.at_end:
                self._save_final_checkpoint()
        name = signal_name(agreed)
        if interrupted:
            logger.warning("%s at step %d (%s); checkpoint written to %s",
                           "preempted" if agreed == SIGTERM_SEEN else "interrupted", self.step, name,
                           self.last_checkpoint)
        return Outcome(self.step, interrupted, stopped, self.last_checkpoint, name)

    def _save_final_checkpoint(self) -> None:
        if self.last_checkpoint is None or self.last_checkpoint.name != f"step-{self.step}":
            self.save_checkpoint()

    def check_finite(self, loss: torch.Tensor | float) -> None:
        """Stop on a NaN/inf loss before it reaches the weights, naming the last good checkpoint."""
        if bool(torch.isfinite(torch.as_tensor(loss)).all()):
            return
        value = loss.item() if isinstance(loss, torch.Tensor) else loss
        where = f"last good checkpoint: {self.last_checkpoint}" if self.last_checkpoint else \
            "no checkpoint was written (use --save-every N)"
        raise UserError(f"loss is {value} at step {self.step + 1}: training stopped; {where}")

    def save_checkpoint(self) -> Path:
        """Rank 0 writes `step-N` (the others wait for it); every process learns its path."""
        with self._phase("checkpoint"):
            self.last_checkpoint = self.dist.on_main(self._write_checkpoint,
                                                     self.checkpoints.root / f"step-{self.step}")
        return self.last_checkpoint

    def _write_checkpoint(self) -> Path:
        """`step-N` written by this process (rank 0's part of `save_checkpoint`)."""
        method, step = self.method, self.step
        return self.checkpoints.save(
            step, method.save_model, method.optimizer, scheduler=method.scheduler, scaler=method.scaler,
            meta={**method.checkpoint_meta(), "precision": method.precision},  # the precision that ran
            extra_state={"step": step, **method.checkpoint_state()},
        )

    def save_final(self, output: str | Path, write_into: Callable[[Path], None], *, overwrite: bool = False,
                   resumable: bool = True) -> Path:
        """Write the output atomically on rank 0 (`write_into(folder)` fills it). Whatever the save raises, the
        trained state is first kept in the first place that takes it (this step's checkpoint, a new one when
        `resumable`, a folder beside the output, one in the temporary folder), then one UserError says what
        failed, where the state is and how to finish the save."""
        self.saving = True

        def work() -> Path:
            try:
                with self._phase("save"), atomic_output_dir(output, overwrite=overwrite) as tmp:
                    write_into(tmp)
            except Exception as exc:  # noqa: BLE001  any failure: the trained state is kept before it is reported
                logger.debug("the final save failed", exc_info=True)
                raise UserError(f"--output {output}: the trained model cannot be written there ({_why(exc)}); "
                                f"{self._keep_state(Path(output), write_into, resumable)}") from None
            self._say_what_is_left()
            return Path(output)

        with InterruptFlag("finishing the save first"):
            return self.dist.on_main(work, Path(output))

    def failed_before_save(self, exc: Exception) -> UserError:
        """The line of a run whose steps are done but whose last work (its record, `--eval-after`) failed before
        the output was written: the trained state is kept in this step's checkpoint first (one process)."""
        why = _why(exc)
        logger.debug("the run failed after its last step", exc_info=exc)
        try:
            here = self._step_checkpoint()
        except Exception as failed:  # noqa: BLE001
            return UserError(f"the run finished its {self.step} steps but failed before writing its output "
                             f"({why}), and its checkpoint cannot be written either ({_why(failed)}): the trained "
                             "state is lost")
        return UserError(f"the run finished its {self.step} steps but failed before writing its output ({why}); the "
                         f"trained state is kept in {here}; finish the save with the same command plus --resume {here}")

    def _has_step_checkpoint(self) -> bool:
        here = self.last_checkpoint
        return here is not None and here.name == f"step-{self.step}" and here.is_dir()

    def _step_checkpoint(self) -> Path:
        """This step's checkpoint: the last one written when it is this step's, else one written now by this
        process (rank 0 already, or the only one)."""
        if not self._has_step_checkpoint():
            self.last_checkpoint = self._write_checkpoint()
        return self.last_checkpoint

    def _say_what_is_left(self) -> None:
        """After the model is written: the checkpoints this run leaves, and (after a resume) the folder it
        resumed from, which a finished run neither needs nor removes."""
        if not self.checkpoints.at_end and self.resumed_from is None:
            return
        root = self.checkpoints.root
        steps = sorted(self.checkpoints.all_steps()) if root.is_dir() else []
        line = (f"checkpoints left in {root}: {', '.join(f'step-{s}' for s in steps)} (--keep-checkpoints "
                f"{self.checkpoints.keep}); remove the folder once the model is safe" if steps else "")
        old_root = self.resumed_from.parent if self.resumed_from is not None else None
        if old_root is not None and old_root.resolve() != root.resolve() and old_root.is_dir():
            line += ("; " if line else "") + (f"the checkpoints this run resumed from, in {old_root}, are left as "
                                              "they were: remove them once no run needs to resume from them")
        if line:
            logger.info(line)

    def _keep_state(self, output: Path, write_into: Callable[[Path], None], resumable: bool) -> str:
        """Keep the trained state in the first place that takes it; what to say about where it is."""
        resume = ("finish the save with the same command plus --resume {0} (and --output OTHER if {1} stays "
                  "unwritable)")
        failed = []
        root = self.checkpoints.root
        if resumable or self._has_step_checkpoint():
            made = not os.path.lexists(root)
            try:
                kept = self._step_checkpoint()
                return f"the trained state is kept in {kept}; " + resume.format(kept, output)
            except Exception as exc:  # noqa: BLE001  the same failure, most likely: try the next place
                failed.append(f"{root}: {_why(exc)}")
                with contextlib.suppress(OSError):
                    if made and root.is_dir() and set(os.listdir(root)) <= {MARKER}:  # made by this attempt, empty
                        remove_tree(root)
        for place in _kept_places(output):
            try:
                with atomic_output_dir(place, option="the kept model") as tmp:
                    write_into(tmp)
            except Exception as exc:  # noqa: BLE001
                failed.append(f"{place}: {_why(exc)}")
                continue
            old = f", after moving the old {output} away" if os.path.lexists(output) else ""
            return (f"the trained model is kept in {place}; finish the save by moving it into place "
                    f"(mv {shlex.quote(str(place))} {shlex.quote(str(output))}{old}) once {output} can be written")
        return f"it could not be kept anywhere either ({'; '.join(failed)}): the trained state is lost"


def _kept_places(output: Path) -> list[Path]:
    """Where a trained model that cannot be written to `output` is kept: beside it, then in the system's
    temporary folder (often another filesystem)."""
    name = f"{output.name}.kept-{os.getpid()}"
    return [output.parent / name, Path(tempfile.gettempdir()) / f"mirrorbert-{name}"]


def _why(exc: BaseException) -> str:
    """What went wrong, in a few words: a failed write's reason, mirrorbert's own line, or the library's type
    and first line."""
    if isinstance(exc, WriteFailed):
        return exc.why
    if isinstance(exc, UserError):
        return first_line(exc)
    return f"{type(exc).__name__}: {first_line(exc)}"


__all__ = ["Engine", "Method", "Outcome", "stop_message"]
