"""`train()`: a Mirror-BERT run from config to saved model: strings, model, the engine with `MirrorMethod`, the save.

The step itself (two views, InfoNCE, one update) is `mirror.step`."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import mirrorbert.jsonio as jsonio
from mirrorbert.encoder.architectures import usable_precision
from mirrorbert.data.strings import TrainingStrings, strings_for_config
from mirrorbert.data.readers import chunked
from mirrorbert.data.token_store import CHUNK, StoreStrings, TokenStore, open_token_store, store_key
from mirrorbert.encoder.dropout import DropHead, dropout_overrides
from mirrorbert.encoder.model import Encoder
from mirrorbert.encoder.packing import packing_flag
from mirrorbert.errors import UserError
from mirrorbert.mirror.collapse import check_collapse
from mirrorbert.mirror.config import TrainConfig, resolve_pooling
from mirrorbert.mirror.eval_after import check_eval_after, evaluate_after_training
from mirrorbert.mirror.step import MirrorMethod, _Plan, embed_views, planned_steps
from mirrorbert.mirror.views import SecondViews, note_tokenless
from mirrorbert.reporting.metrics import library_versions
from mirrorbert.reporting.timing import PhaseTimer
from mirrorbert.runtime.device import (
    compile_model, enable_gradient_checkpointing, peak_memory_bytes, resolve_precision, set_threads, tf32_matmuls,
)
from mirrorbert.runtime.distributed import init_from_env, sharded_encoding
from mirrorbert.runtime.randomness import replay_rng, seed_everything
from mirrorbert.safeguards.preflight import inspect_model
from mirrorbert.safeguards.writes import weights_size
from mirrorbert.training.checkpoints import (
    CheckpointManager, check_resume_config, guard_training_run, load_checkpoint, restore_training_state,
)
from mirrorbert.training.engine import Engine
from mirrorbert.training.signals import InterruptFlag

logger = logging.getLogger(__name__)

# Options that may change on --resume: bookkeeping, budget, and where things are (the data fingerprint is checked).
RESUME_HARMLESS = ("output", "overwrite", "resume", "checkpoint_dir", "keep_checkpoints", "save_every", "log_dir",
                   "log_every", "show_progress", "steps", "epochs", "device", "model", "data", "column", "field",
                   "words_top", "lang", "random_strings", "limit", "skip_bad_lines", "eval_after", "data_dir",
                   "trust_remote_code")


@dataclass
class TrainResult:
    output: Path | None
    steps: int
    final_loss: float | None  # mean over the last `final_loss_window_steps` steps (training/loss_record.py)
    wall_time_s: float
    interrupted: bool = False
    checkpoint: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)
    stop_signal: str | None = None  # "SIGTERM" (preempted) or "SIGINT" when interrupted
    # (seconds, strings, non-padding tokens) per optimiser step, for benchmarks and diagnostics
    step_log: list[tuple[float, int, int]] = field(default_factory=list)
    final_loss_window_steps: int = 0
    last_batch_loss: float | None = None  # one batch, possibly an epoch's short last one: not a run's measure


def check_resume_step(checkpoint: Path, step: int, total: int) -> None:
    """A checkpoint past the run's end would 'finish' with no training and write a model named after a
    step it never reached: refuse it before the model loads."""
    if step > total:
        raise UserError(f"--resume {checkpoint}: the checkpoint is at step {step}, past the end of this run "
                        f"(step {total}: --steps/--epochs); ask for more than {step} steps to continue it")


def load_model_config(name: str, cfg: TrainConfig | None = None):
    """The model's config, after the cheap checks (tokenizer, max length, mask token) of `preflight`."""
    config, _ = inspect_model(name, max_length=cfg.max_length if cfg else None,
                              need_mask=bool(cfg and cfg.mask_span > 0),
                              trust_remote_code=bool(cfg and cfg.trust_remote_code))
    return config


def train(cfg: TrainConfig, strings: TrainingStrings | None = None) -> TrainResult:
    """Run Mirror-BERT tuning as configured and write the model to `cfg.output` (`cfg` checked itself when made)."""
    if not cfg.output:
        raise UserError("--output is required: the folder to write the trained model to")
    with set_threads(cfg.threads), contextlib.ExitStack() as locks:
        # path rules, writability and locks, before anything is loaded
        guard_training_run(locks, output=cfg.output, overwrite=cfg.overwrite,
                  inputs={"--model": cfg.model, "--data": cfg.data, "--resume": cfg.resume,
                          "--data-dir": cfg.data_dir},
                  checkpoint_dir=cfg.resolved_checkpoint_dir(), resuming=cfg.resume is not None,
                  extra_outputs=[("--log-dir", cfg.log_dir)], model_bytes=weights_size(cfg.model))
        return _train(cfg, strings)


def _compile_warm_up(encoder: Encoder, sample: list[list[int]], device: torch.device, precision: str) -> None:
    """One forward and backward so torch.compile compiles (or fails) now; no trace in RNG or gradients."""
    with replay_rng():
        embed_views(encoder, sample, sample, False, device, precision).float().sum().backward()
    encoder.zero_grad(set_to_none=True)


def _train(cfg: TrainConfig, strings: TrainingStrings | None) -> TrainResult:
    eval_tasks = check_eval_after(cfg.eval_after, cfg.data_dir)
    dist_ctx = init_from_env(cfg.device)  # one process, or this process's rank under torchrun/accelerate
    with tf32_matmuls(dist_ctx.device):  # TF32 for this run only (Ampere+), the caller's settings back after
        return _train_on(cfg, strings, eval_tasks, dist_ctx)


def _train_on(cfg: TrainConfig, strings: TrainingStrings | None, eval_tasks, dist_ctx) -> TrainResult:
    device, started = dist_ctx.device, time.time()
    precision = resolve_precision(cfg.precision, device)
    if cfg.grad_cache_chunk and dist_ctx.world_size > 1:
        raise UserError("--grad-cache-chunk: not supported with several processes yet (DDP's gradient hooks "
                        "would fire inside the cached replay); use --gradient-checkpointing there")
    timer = PhaseTimer()  # wall time per phase -> info["timings"]; -v logs it (reporting/timing.py)
    with timer.phase("data"):
        strings = strings or strings_for_config(cfg, stream=True)
    seed_everything(cfg.seed)
    resume = load_checkpoint(cfg.resume) if cfg.resume else None
    if resume is not None:
        check_resume_config(resume.path, resume.meta.get("config"), cfg.to_dict(), RESUME_HARMLESS)
        if resume.meta.get("data_sha256") not in (None, strings.fingerprint):
            raise UserError(f"--resume {resume.path}: the training data differ from the run that wrote this checkpoint")
        check_resume_step(resume.path, int(resume.meta.get("step", 0)), planned_steps(cfg, len(strings.strings)))
    encoder, views, pooling, drophead = _build_encoder(cfg, strings, resume, device, timer, dist_ctx)
    precision = usable_precision(encoder.model, precision)
    n_strings = len(views.store)
    with timer.phase("compile"):
        compiled = cfg.compile and compile_model(
            encoder.model, warm_up=lambda: _compile_warm_up(encoder, views.store.token_ids([0, 1]), device, precision))
    batch_size = min(cfg.batch_size, n_strings)
    if batch_size < cfg.batch_size:
        logger.warning("--batch-size %d is larger than the data (%d strings): using %d", cfg.batch_size,
                       n_strings, batch_size)
    plan = _Plan(n_strings, batch_size, 0, cfg.seed)
    plan.total_steps = cfg.steps or cfg.epochs * plan.batches_per_epoch
    method = MirrorMethod(cfg, encoder, views, plan, dist_ctx, device, precision, strings.fingerprint, timer)
    engine = Engine(method, total_steps=plan.total_steps, dist=dist_ctx, save_every=cfg.save_every,
                    checkpoints=CheckpointManager(cfg.resolved_checkpoint_dir(), keep=cfg.keep_checkpoints),
                    checkpointing=cfg.save_every > 0 or cfg.checkpoint_dir is not None or resume is not None,
                    desc="mirror", show_progress=cfg.show_progress, timer=timer)
    if resume is not None:
        extra = restore_training_state(resume, method.optimizer, method.scheduler, method.scaler)
        engine.step, method.epoch, method.next_batch = extra["step"], extra["epoch"], extra["next_batch"]
        method.losses.restore(extra, f"--resume {resume.path}")
        engine.last_checkpoint = resume.path
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", resume.path, engine.step, method.epoch,
                    method.next_batch)
    dist_ctx.wrap(encoder)
    try:
        outcome = engine.run()
    finally:
        method.metrics.close()
        dist_ctx.unwrap(encoder)
        if drophead is not None:
            drophead.remove()
    wall = time.time() - started
    if outcome.interrupted:
        return TrainResult(None, outcome.steps, method.losses.final, wall, interrupted=True,
                           checkpoint=outcome.checkpoint, step_log=method.step_log, stop_signal=outcome.signal,
                           **_loss_extras(method))
    with InterruptFlag("finishing and saving the trained model first"):  # a SIGTERM now would lose the steps
        return _finish(cfg, method, strings, pooling, batch_size, outcome, wall, compiled, encoder, eval_tasks,
                       dist_ctx, timer, engine)


def _finish(cfg, method, strings, pooling, batch_size, outcome, wall, compiled, encoder, eval_tasks, dist_ctx, timer,
            engine) -> TrainResult:
    """After the last step: the run's record, the collapse check, --eval-after, the output."""
    info = _run_info(cfg, method, strings, pooling, batch_size, outcome.steps, wall, compiled)
    encoder.eval()
    info["collapse"] = check_collapse(encoder, strings.strings, method.losses.first, method.losses.mean_last_epoch,
                                      outcome.steps, cfg.seed, lr=cfg.lr, pooling=pooling)
    if eval_tasks:
        with sharded_encoding(dist_ctx), timer.phase("eval"):  # every rank evaluates, sharing the encoding work
            info["eval_after"] = evaluate_after_training(encoder, eval_tasks, cfg.data_dir)
    info["timings"] = timer.report()  # up to here: the save cannot time itself into its own file
    output = engine.save_final(cfg.output, lambda folder: encoder.write(folder, info), overwrite=cfg.overwrite)
    info["timings"] = timer.report()  # now with the save, for the caller and the -v line
    logger.debug("phase timings (s): %s", jsonio.dumps(info["timings"]))
    logger.info("model written to %s (%d steps, final loss %s: mean of the last %d)", output, outcome.steps,
                method.losses.final, len(method.losses.recent))
    if cfg.max_length < encoder.max_length:  # say it: the saved limit is not the one the strings were cut at
        logger.info("trained on strings cut at %d tokens; the saved model encodes up to %d (its own limit; "
                    "max_length=%d when loading encodes as in training)", cfg.max_length, encoder.max_length,
                    cfg.max_length)
    return TrainResult(output, outcome.steps, method.losses.final, wall, checkpoint=outcome.checkpoint, info=info,
                       step_log=method.step_log, **_loss_extras(method))


def _loss_extras(method: MirrorMethod) -> dict[str, Any]:
    return {"final_loss_window_steps": len(method.losses.recent), "last_batch_loss": method.losses.last}


def _build_encoder(cfg: TrainConfig, strings: TrainingStrings, resume, device: torch.device, timer: PhaseTimer,
                   dist_ctx=None):
    """The encoder to train (from the checkpoint when resuming) and the second-view masker over the token store."""
    with timer.phase("load"):
        base_config = load_model_config(cfg.model, cfg)
        pooling = resolve_pooling(cfg.pooling, base_config.model_type)
        encoder = Encoder.load(resume.model_dir if resume else cfg.model, pooling=pooling, device=str(device),
                               config_overrides=dropout_overrides(base_config, cfg.dropout),
                               trust_remote_code=cfg.trust_remote_code, cli=True)  # TrainConfig names options
    encoder.packing = packing_flag(cfg.packing)
    encoder.train()
    drophead = DropHead(encoder.model, cfg.drophead) if cfg.drophead > 0 else None
    with timer.phase("tokenise"):
        store = training_store(strings, encoder.tokenizer, cfg.max_length, dist_ctx)
        views = SecondViews(encoder.tokenizer, store, cfg.mask_unit, cfg.mask_span, cfg.mask_min_chars,
                            cfg.max_length)
    views.warn_if_never_applies()
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(encoder.model)
    return encoder, views, pooling, drophead


def training_store(strings: TrainingStrings, tokenizer, max_length: int, dist_ctx=None) -> TokenStore:
    """The strings' token store (data/token_store.py: built once, cached by content and tokenizer), with the
    strings that give no tokens reported; `strings.strings` then reads from the store, so the run keeps no
    Python list of every string. Under several processes rank 0 builds it and the others open what it wrote."""
    current = strings.strings
    if isinstance(current, StoreStrings) and current.store.meta.get("key") == store_key(
            strings.fingerprint, tokenizer, max_length):
        return current.store  # the same object trained on before: its strings are the store already

    def build() -> TokenStore:
        return open_token_store(chunked(current, CHUNK), strings.fingerprint, tokenizer, max_length,
                                source=f"--data {strings.source}")

    store = build() if dist_ctx is None else dist_ctx.on_main(build, None)
    if store is None:  # another rank: rank 0 has written (and checked) it, this one opens it
        store = build()
    note_tokenless(strings, store.dropped, store.meta.get("dropped_example"), len(store))
    strings.strings = store.strings
    return store


def _run_info(cfg: TrainConfig, method: MirrorMethod, strings: TrainingStrings, pooling: str, batch_size: int,
              steps: int, wall: float, compiled: bool) -> dict[str, Any]:
    """What `mirrorbert.json` records about the run."""
    device, elapsed = method.device, method.elapsed()
    masking = method.views.stats.shares()
    logger.info("span masking (%s, k=%d): %.1f%% of real tokens hidden, %.1f%% of strings masked", cfg.mask_unit,
                cfg.mask_span, 100 * masking["masked_token_share"], 100 * masking["masked_string_share"])
    return {
        "method": "mirror-bert",
        "config": {**cfg.to_dict(), "pooling": pooling, "batch_size": batch_size},
        "data": strings.summary(),
        "seed": cfg.seed,
        "steps": steps,
        "epochs": round(steps / max(1, method.plan.batches_per_epoch), 3),
        **method.losses.fields(),  # final_loss (a window's mean, named), last_batch_loss, mean_loss_last_epoch
        **masking,
        "wall_time_s": round(wall, 2),
        "strings_per_s": round(method.seen_strings / elapsed, 2),
        "real_tokens_per_s": round(method.seen_tokens / elapsed, 2),
        "device": str(device),
        "world_size": method.dist.world_size,
        "precision": method.precision,
        "compiled": bool(compiled),
        "peak_memory_bytes": peak_memory_bytes(device),
        "peak_memory_measure": "cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        "versions": library_versions(),
    }


def steps_per_epoch(n_strings: int, batch_size: int) -> int:
    """Public for users planning budgets: batches per epoch after dropping a trailing single string."""
    batch_size = min(batch_size, n_strings)
    return _Plan(n_strings, batch_size, 0, 0).batches_per_epoch


__all__ = ["train", "TrainResult", "steps_per_epoch"]
