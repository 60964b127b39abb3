"""The training loop, written once for Mirror-BERT, MLM pre-training and GR-BERT.

A method (see `Method`) supplies its batches from the current position, one optimiser step on a batch,
its bookkeeping after a step, and what a checkpoint holds. The engine owns everything else: the step
counter, the progress bar, periodic and final checkpoints, resume position, Ctrl-C and SIGTERM
(every process of a torchrun/accelerate job agrees at the next step boundary, rank 0 writes a
checkpoint, every process stops), non-finite losses, and a final save that never loses the trained state.

Preemption under a launcher: SIGTERM to torchrun reaches every worker at once (torchrun forwards it, then
sends SIGKILL after its shutdown timeout, 30 s by default). Each process only sets its flag; at the next
step boundary one all-reduce (`agree`) tells every process that some process saw a signal and which
(SIGTERM wins over Ctrl-C: a preemption), so all stop at the same step and rank 0 writes one checkpoint
while the others wait for it. Agreement is the test that the job is whole: if a process has died (a
crash, after which torchrun SIGTERMs the survivors), the all-reduce or a step's collective fails, and
`failure_guard` reports a failure naming the last good checkpoint instead. Repeated SIGTERMs (Slurm and
torchrun may both deliver one) are ignored until the checkpoint is written.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.writes import atomic_output_dir, remove_tree
from mirrorbert.training.checkpoints import CheckpointManager
from mirrorbert.training.signals import NO_SIGNAL, SIGTERM_SEEN, InterruptFlag, signal_name

logger = logging.getLogger(__name__)


class Method(Protocol):
    """What a training method gives the engine (duck-typed; the three trainers each define one)."""

    total_steps: int
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


class _SingleProcess:
    """The distributed hooks of one process: every one a no-op."""

    world_size, is_main = 1, True

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def agree(self, code: int) -> int:
        return int(code)

    def on_main(self, work: Callable[[], Any], others: Any) -> Any:
        return work()

    def failure_guard(self, last_checkpoint, interrupt=None):
        return contextlib.nullcontext()


@dataclass
class Outcome:
    steps: int
    interrupted: bool  # a signal stopped the run
    stopped: bool  # the run ended before its budget (interrupt, or a limit such as --stop-after-steps)
    checkpoint: Path | None
    signal: str | None = None  # the signal the processes agreed on: "SIGTERM" (preempted) or "SIGINT"

    @property
    def preempted(self) -> bool:
        return self.signal == "SIGTERM"


def stop_message(signal: str | None, steps: int, checkpoint: Path | None, rank: int = 0) -> str:
    """The line(s) a stopped run prints: what stopped it, at which step, where the checkpoint is, how to resume.

    "preempted" for SIGTERM (a scheduler or launcher), "interrupted" for Ctrl-C; ranks other than 0 say
    their rank and name the checkpoint rank 0 wrote.
    """
    what = "preempted" if signal == "SIGTERM" else "interrupted"
    if rank:
        return f"rank {rank}: {what} at step {steps}; checkpoint (written by rank 0): {checkpoint}"
    return (f"{what} at step {steps} ({signal or 'signal'}); checkpoint written to {checkpoint}; "
            f"resume with the same command plus --resume {checkpoint}")


class _NoTimer:
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield


class Engine:
    """The loop over one `Method`; `checkpoints` says where, how often (`every`) and whether at the end."""

    def __init__(self, method: Method, *, total_steps: int, checkpoints: CheckpointManager, stop_at: int | None = None,
                 dist=None, desc: str = "train", show_progress: bool = True, timer=None):
        self.method, self.total_steps, self.checkpoints = method, total_steps, checkpoints
        self.timer = timer or _NoTimer()  # wall time per phase (steps, checkpoint, save): reporting/timing.py
        self.step, self.last_checkpoint = 0, None
        self.stop_at = total_steps if stop_at is None else min(total_steps, stop_at)
        self.dist = dist or _SingleProcess()
        self.desc, self.show_progress = desc, show_progress
        self.resumed_from: Path | None = None

    def resume_at(self, step: int, checkpoint: Path) -> None:
        """Continue from `checkpoint`, written after `step` steps (its training state restored by the caller)."""
        self.step, self.last_checkpoint, self.resumed_from = step, checkpoint, checkpoint

    # ------------------------------------------------------------------ the loop
    def run(self) -> Outcome:
        from mirrorbert.reporting.progress import progress_bar

        progress = progress_bar(total=self.total_steps, initial=self.step, show=self.show_progress and self.dist.is_main,
                                desc=self.desc, unit="step")
        agreed = NO_SIGNAL
        # The flag is outermost: inside it a SIGTERM only sets the flag, also while the checkpoint of an
        # interrupted run is written (a second SIGTERM must not kill rank 0 mid-write). The guard
        # turns a failed collective into one line naming the last good checkpoint.
        with InterruptFlag() as interrupt, self.dist.failure_guard(lambda: self.last_checkpoint, interrupt):
            try:
                with self.timer.phase("steps"):
                    batches = self.method.batches()
                    while self.step < self.stop_at:
                        batch = next(batches, None)
                        if batch is None:
                            break
                        postfix = self.method.train_step(batch, self)
                        self.step += 1
                        progress.update(1)
                        progress.set_postfix(postfix, refresh=False)  # shown by the next update, at its refresh rate
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

    # ------------------------------------------------------------------ helpers for methods
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
        method, step = self.method, self.step
        with self.timer.phase("checkpoint"):
            self.last_checkpoint = self.dist.on_main(lambda: self.checkpoints.save(
                step, method.save_model, method.optimizer, method.scheduler, method.scaler,
                meta=method.checkpoint_meta(), extra_state={"step": step, **method.checkpoint_state()},
            ), self.checkpoints.root / f"step-{step}")
        return self.last_checkpoint

    # ------------------------------------------------------------------ the final save
    def save_final(self, output: str | Path, write_into: Callable[[Path], None], overwrite: bool = False,
                   resumable: bool = True) -> Path:
        """Write the output atomically on rank 0 (`write_into(folder)` fills it); never lose the trained state.

        If the output cannot be written (replaced by a file, its parent removed, disk full), the state is
        kept: in the checkpoint of this step, or a new one (when `resumable`: the weights are those of the
        last step), or else a temporary folder holding what the output would have held. The error is one
        line naming where, and the run ends non-zero.
        """
        def work() -> Path:
            try:
                with self.timer.phase("save"), atomic_output_dir(output, overwrite=overwrite) as tmp:
                    write_into(tmp)
            except (OSError, UserError) as exc:
                raise UserError(f"--output {output}: the model cannot be written there ({first_line(exc)}); "
                                f"{self._keep_state(write_into, resumable)}") from None
            self._say_what_is_left()
            return Path(output)

        # A SIGTERM now waits for the save on every process (the weights are trained: stopping now would
        # lose them); a second Ctrl-C still aborts.
        with InterruptFlag("finishing the save first"):
            return self.dist.on_main(work, Path(output))

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

    def _keep_state(self, write_into: Callable[[Path], None], resumable: bool) -> str:
        hint = "write it elsewhere with the same command plus --resume {} --output OTHER"
        here = self.last_checkpoint
        if here is not None and here.name == f"step-{self.step}" and here.is_dir():
            return f"the trained state is kept in {here}; " + hint.format(here)
        if resumable:
            try:
                kept = self.save_checkpoint()
                return f"the trained state is kept in {kept}; " + hint.format(kept)
            except (OSError, UserError) as exc:
                logger.warning("the checkpoint cannot be written either (%s)", first_line(exc))
        folder = Path(tempfile.mkdtemp(prefix="mirrorbert-kept-model-"))
        try:
            write_into(folder)
        except BaseException:
            remove_tree(folder)
            raise
        return f"the trained model is kept in {folder}"


__all__ = ["Engine", "Method", "Outcome", "stop_message"]
