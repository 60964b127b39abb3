"""One training run, set up in one place for Mirror-BERT, MLM pre-training and GR-BERT.

The lifecycle, in order (`run`):

1. guard: path rules, writability and locks of every output, before anything is read;
2. device, precision and processes (one process, or this rank of a torchrun/accelerate job);
3. the method reads its data (so a data mistake is named before a model loads), then the seed;
4. a `--resume` checkpoint is loaded and refused when an option that is not resume-safe changed
   (`settings.fields.resume_safe_names`) or the method's own facts differ (its data fingerprint);
5. the method builds its model, batches, optimiser, scheduler and scaler (`Recipe.build`);
6. the `Engine` is made and the checkpoint's position and training state restored;
7. the engine runs (preemption, Ctrl-C and non-finite losses are the engine's);
8. a stopped run returns where its checkpoint is; a finished one writes its output atomically, with a
   SIGTERM held until the save is done.

A method supplies a `Recipe`: what it reads and writes, how it builds its `Method` (training/engine.py), what
it checks on resume and what its result is. The three trainers are their recipes and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from mirrorbert.reporting.timing import PhaseTimer
from mirrorbert.runtime.device import resolve_device, resolve_precision, set_threads, tf32_matmuls
from mirrorbert.runtime.distributed import DistContext, init_from_env
from mirrorbert.runtime.randomness import seed_everything
from mirrorbert.safeguards.writes import weights_size
from mirrorbert.settings.fields import resume_safe_names
from mirrorbert.training.checkpoints import (
    Checkpoint, CheckpointManager, check_resume_config, guard_training_run, load_checkpoint, restore_training_state,
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
        guard_training_run(locks, output=cfg.output, overwrite=cfg.overwrite, inputs=paths.inputs,
                           checkpoint_dir=cfg.resolved_checkpoint_dir(), resuming=cfg.resume is not None,
                           extra_outputs=paths.extra_outputs, extra_files=paths.extra_files,
                           model_bytes=weights_size(paths.model))
        dist = init_from_env(cfg.device) if recipe.distributed else DistContext(device=resolve_device(cfg.device))
        with tf32_matmuls(dist.device):  # TF32 for this run only (Ampere+), the caller's settings back after
            return _run(recipe, dist)


def _run(recipe: Recipe, dist: DistContext):
    cfg = recipe.cfg
    run_ctx = RunContext(dist.device, resolve_precision(cfg.precision, dist.device), dist, PhaseTimer(), time.time())
    with run_ctx.timer.phase("data"):
        recipe.read_data(run_ctx)
    seed_everything(cfg.seed)
    if cfg.resume:
        run_ctx.resume = _checked_resume(recipe, run_ctx)
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
        return recipe.finish(method, outcome, engine, run_ctx)


def _checked_resume(recipe: Recipe, run_ctx: RunContext) -> Checkpoint:
    cfg = recipe.cfg
    resume = load_checkpoint(cfg.resume)
    saved, current = recipe.saved_config(resume), cfg.to_dict()
    if saved and saved.get("precision") == run_ctx.precision:  # a checkpoint that recorded the resolved precision
        current["precision"] = run_ctx.precision
    check_resume_config(resume.path, saved, current, resume_safe_names(type(cfg)))
    recipe.check_resume(resume, run_ctx)
    return resume


def keeps_checkpoints(cfg, resuming: bool) -> bool:
    """Whether a run writes a checkpoint at its end and whenever its method says one is due (epoch ends): asked
    for (--save-every, --checkpoint-dir) or continuing a run that had them."""
    return cfg.save_every > 0 or cfg.checkpoint_dir is not None or resuming


def _engine(recipe: Recipe, method: Method, run_ctx: RunContext) -> Engine:
    """The engine over `method`, at the checkpoint's position when resuming."""
    cfg, resume = recipe.cfg, run_ctx.resume
    checkpoints = CheckpointManager(cfg.resolved_checkpoint_dir(), keep=cfg.keep_checkpoints, every=cfg.save_every,
                                    at_end=keeps_checkpoints(cfg, resume is not None))
    engine = Engine(method, total_steps=method.total_steps, checkpoints=checkpoints, dist=run_ctx.dist,
                    desc=recipe.label, show_progress=cfg.show_progress, timer=run_ctx.timer)
    if resume is not None:
        extra = restore_training_state(resume, method.optimizer, method.scheduler, method.scaler)
        engine.resume_at(int(extra["step"]), resume.path)
        recipe.restore(method, extra, resume)
        logger.info("resumed from %s at step %d", resume.path, engine.step)
    stop = recipe.stop_at(engine.step)
    if stop is not None:
        engine.stop_at = min(engine.total_steps, stop)
    return engine


__all__ = ["GuardedPaths", "Recipe", "RunContext", "keeps_checkpoints", "run"]
