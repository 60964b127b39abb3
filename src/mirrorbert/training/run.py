"""One training run, set up in one place for Mirror-BERT, MLM pre-training and GR-BERT: `run(recipe)` takes a
method's `Recipe` from guarding the outputs to its result (docs/development.md, "The run lifecycle")."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from mirrorbert.reporting.timing import PhaseTimer
from mirrorbert.runtime.device import resolve_device, resolve_precision, set_threads, tf32_matmuls
from mirrorbert.runtime.distributed import DistContext, init_from_env
from mirrorbert.runtime.randomness import seed_everything
from mirrorbert.safeguards.writes import RunPaths, guard_run, weights_size
from mirrorbert.settings.fields import names_with
from mirrorbert.training.checkpoints import (
    Checkpoint, CheckpointManager, check_checkpoint_root, check_resume_config, load_checkpoint, restore_training_state,
)
from mirrorbert.training.engine import Engine, Method, Outcome
from mirrorbert.training.signals import InterruptFlag

logger = logging.getLogger(__name__)


@dataclass
class GuardedPaths:
    """What a run reads and writes besides `--output` and the checkpoints, named as the options that give them."""

    inputs: dict[str, Any]
    extra_outputs: list[tuple[str, Any]] = field(default_factory=list)
    extra_files: list[tuple[str, Any]] = field(default_factory=list)
    model: str | None = None  # the starting weights, whose size the free-space check needs


@dataclass
class RunContext:
    """What the lifecycle has settled when the method builds: where it runs, in which precision, from where."""

    device: Any  # torch.device
    precision: str
    dist: DistContext
    timer: PhaseTimer
    started: float
    resume: Checkpoint | None = None

    def wall(self) -> float:
        return time.time() - self.started


class Recipe:
    """One training method's part of a run; subclasses fill in what differs (see the module docstring)."""

    label = "train"  # the progress bar's and the log's name for the run
    distributed = False  # may run as several processes under torchrun/accelerate

    def __init__(self, cfg) -> None:
        self.cfg = cfg  # a settings.run_options.RunOptions subclass, checked when made

    def guarded_paths(self) -> GuardedPaths:
        raise NotImplementedError

    def read_data(self, run: RunContext) -> None:
        """Read and check the training data (before the model: data mistakes are named first)."""

    def saved_config(self, resume: Checkpoint) -> Mapping[str, Any] | None:
        """The options the checkpoint was written with (compared with this run's)."""
        return resume.meta.get("config")

    def check_resume(self, resume: Checkpoint, run: RunContext) -> None:
        """Refuse a checkpoint of other data or another shape of run (before the model loads)."""

    def build(self, run: RunContext) -> Method:
        """The model, batches, optimiser, scheduler and scaler; the method carries its `total_steps`."""
        raise NotImplementedError

    def restore(self, method: Method, extra: dict[str, Any], resume: Checkpoint) -> None:
        """The method's own position and records from the checkpoint's extra state."""

    def stop_at(self, step: int) -> int | None:
        """A step to stop at before the budget's end (None: run to the end)."""
        return None

    def before_run(self, method: Method, engine: Engine) -> None:
        """Last work before the first step (a baseline evaluation, wrapping the model for several processes)."""

    def close(self, method: Method) -> None:
        """Release what `build` opened (threads, logs, hooks); runs whether or not training finished."""

    def stopped(self, method: Method, outcome: Outcome, run: RunContext):
        """The result of a run stopped before its end: where its checkpoint is."""
        raise NotImplementedError

    def finish(self, method: Method, outcome: Outcome, engine: Engine, run: RunContext):
        """After the last step: the run's record and the output (through `engine.save_final`)."""
        raise NotImplementedError


def run(recipe: Recipe):
    """Run `recipe` through the whole lifecycle; returns the recipe's result."""
    cfg = recipe.cfg
    paths = recipe.guarded_paths()
    with set_threads(cfg.threads), contextlib.ExitStack() as locks:
        resuming, checkpoint_dir = cfg.resume is not None, cfg.resolved_checkpoint_dir()
        guard_run(locks, RunPaths(cfg.output, paths.inputs, checkpoint_dir, extra_outputs=paths.extra_outputs,
                                  extra_files=paths.extra_files, model_bytes=weights_size(paths.model)),
                  overwrite=cfg.overwrite, resuming=resuming)
        if int(os.environ.get("RANK", "0") or 0) == 0:  # rank 0 holds the lock
            check_checkpoint_root(checkpoint_dir, resuming=resuming, overwrite=cfg.overwrite)
        dist = init_from_env(cfg.device) if recipe.distributed else DistContext(device=resolve_device(cfg.device))
        with tf32_matmuls(dist.device):  # TF32 for this run only (Ampere+), the caller's settings back after
            return _run(recipe, dist)


def _run(recipe: Recipe, dist: DistContext):
    cfg = recipe.cfg
    run_ctx = RunContext(dist.device, resolve_precision(cfg.precision, dist.device), dist, PhaseTimer(), time.time())
    with run_ctx.timer.phase("data"):
        recipe.read_data(run_ctx)
    seed_everything(cfg.seed)
    if cfg.resume:  # refused when an option that is not resume-safe, or the method's own facts, changed
        run_ctx.resume = resume = load_checkpoint(cfg.resume)
        check_resume_config(resume.path, recipe.saved_config(resume), cfg.to_dict(),
                            names_with(type(cfg), "resume_safe"))
        recipe.check_resume(resume, run_ctx)
    method = recipe.build(run_ctx)
    engine = _engine(recipe, method, run_ctx)
    try:
        recipe.before_run(method, engine)
        outcome = engine.run()
    finally:
        recipe.close(method)
    if outcome.stopped:
        return recipe.stopped(method, outcome, run_ctx)
    with InterruptFlag("finishing and saving the trained model first"):  # a SIGTERM now would lose the steps
        try:
            return recipe.finish(method, outcome, engine, run_ctx)
        except Exception as exc:  # noqa: BLE001  the steps are done: whatever failed, their state is kept
            if engine.saving or dist.world_size > 1:  # the save reported it, the state kept; or other ranks wait
                raise
            raise engine.failed_before_save(exc) from None


def keeps_checkpoints(cfg, resuming: bool) -> bool:
    """Whether a run writes a checkpoint at its end and whenever its method says one is due (epoch ends): asked
    for (--save-every, --checkpoint-dir) or continuing a run that had them."""
    return cfg.save_every > 0 or cfg.checkpoint_dir is not None or resuming


def _engine(recipe: Recipe, method: Method, run_ctx: RunContext) -> Engine:
    """The engine over `method`, at the checkpoint's position when resuming."""
    cfg, resume = recipe.cfg, run_ctx.resume
    checkpoints = CheckpointManager(cfg.resolved_checkpoint_dir(), keep=cfg.keep_checkpoints, every=cfg.save_every,
                                    at_end=keeps_checkpoints(cfg, resume is not None))
    engine = Engine(method, checkpoints=checkpoints, dist=run_ctx.dist,
                    desc=recipe.label, show_progress=cfg.show_progress, timer=run_ctx.timer)
    if resume is not None:
        extra = restore_training_state(resume, method.optimizer, method.scheduler, method.scaler)
        engine.step, engine.last_checkpoint, engine.resumed_from = int(extra["step"]), resume.path, resume.path
        recipe.restore(method, extra, resume)
        logger.info("resumed from %s at step %d", resume.path, engine.step)
    stop = recipe.stop_at(engine.step)
    if stop is not None:
        engine.stop_at = min(engine.total_steps, stop)
    return engine


__all__ = ["GuardedPaths", "Recipe", "RunContext", "keeps_checkpoints", "run"]
