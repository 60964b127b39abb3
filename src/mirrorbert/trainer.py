"""Mirror-BERT training: duplicated views, in-batch InfoNCE, checkpoints, exact resume, atomic save."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from mirrorbert import jsonio
from mirrorbert.config import TrainConfig, resolve_pooling, validate
from mirrorbert.data import TrainingStrings, strings_for_config
from mirrorbert.distributed import init_from_env, sharded_encoding
from mirrorbert.encoder import Encoder
from mirrorbert.errors import UserError
from mirrorbert.gradcache import cached_embeddings
from mirrorbert.loss import build_loss, mirror_infonce
from mirrorbert.packing import packing_flag
from mirrorbert.phases import PhaseTimer
from mirrorbert.preflight import inspect_model
from mirrorbert.safety import weights_size
from mirrorbert.training.collapse import check_collapse
from mirrorbert.training.checkpoints import (
    CheckpointManager, check_resume_config, guard_training_run, load_checkpoint, restore_training_state,
)
from mirrorbert.training.device import (
    autocast, compile_model, enable_gradient_checkpointing, make_grad_scaler, peak_memory_bytes,
    resolve_precision, set_threads, tf32_matmuls,
)
from mirrorbert.training.engine import Engine
from mirrorbert.training.eval_after import check_eval_after, evaluate_after_training
from mirrorbert.training.metrics import MetricLogger, library_versions
from mirrorbert.training.optim import backward_and_step, build_optimizer, build_scheduler
from mirrorbert.training.randomness import derived_generator, replay_rng, seed_everything
from mirrorbert.training.signals import InterruptFlag
from mirrorbert.views import DropHead, SecondViews, drop_tokenless, dropout_overrides, tokenize_once

logger = logging.getLogger(__name__)

# Random streams derived from the seed, one per purpose, so that resuming can regenerate them.
STREAM_ORDER, STREAM_MASK = 1, 2
# Options that may change on --resume: bookkeeping, budget, and where things are (the data fingerprint is checked).
RESUME_HARMLESS = ("output", "overwrite", "resume", "checkpoint_dir", "keep_checkpoints", "save_every", "log_dir",
                   "log_every", "show_progress", "steps", "epochs", "device", "model", "data", "column", "field",
                   "words_top", "lang", "random_strings", "limit", "skip_bad_lines", "eval_after", "data_dir",
                   "trust_remote_code")


@dataclass
class TrainResult:
    output: Path | None
    steps: int
    final_loss: float | None
    wall_time_s: float
    interrupted: bool = False
    checkpoint: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)
    stop_signal: str | None = None  # "SIGTERM" (preempted) or "SIGINT" when interrupted
    # (seconds, strings, non-padding tokens) per optimiser step, for benchmarks and diagnostics
    step_log: list[tuple[float, int, int]] = field(default_factory=list)


@dataclass
class _Plan:
    """How the strings are cut into batches; a pure function of the data, batch size and seed."""

    n: int
    batch_size: int
    total_steps: int
    seed: int

    @property
    def batches_per_epoch(self) -> int:
        # A trailing batch of one string has no negatives, so it is dropped.
        return self.n // self.batch_size + (1 if self.n % self.batch_size >= 2 else 0)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = torch.randperm(self.n, generator=derived_generator(self.seed, STREAM_ORDER, epoch)).tolist()
        return [order[i:i + self.batch_size] for i in range(0, self.n, self.batch_size)][: self.batches_per_epoch]


def planned_steps(cfg: TrainConfig, n_strings: int) -> int:
    """The optimiser steps a run makes: --steps, or the epochs' batches (known before any model loads)."""
    return cfg.steps or cfg.epochs * _Plan(n_strings, min(cfg.batch_size, n_strings), 0, cfg.seed).batches_per_epoch


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


def embed_views(encoder: Encoder, first: list[list[int]], second: list[list[int]], controlled_dropout: bool,
                device: torch.device, precision: str) -> torch.Tensor:
    """Rows [f(x_1)..f(x_B), f(xbar_1)..f(xbar_B)]; normally one forward pass over both views.

    With controlled dropout the views run as two passes that replay the same random state, so every
    dropout (and drophead) mask is identical for x and x-bar: f(x) = f(x-bar) when the inputs are equal.
    """
    with autocast(device, precision):
        if controlled_dropout:
            with replay_rng():
                a = encoder.embed(first)
            b = encoder.embed(second)
            return torch.cat([a, b])
        return encoder.embed(first + second)


def mirror_step_loss(encoder: Encoder, first: list[list[int]], second: list[list[int]], pad_id: int,
                     temperature: float, controlled_dropout: bool, device: torch.device, precision: str,
                     loss_fn=None, gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     grad_cache_chunk: int | None = None) -> torch.Tensor:
    """Loss of one batch (kept for callers of the first version; `pad_id` is the tokenizer's own).

    `loss_fn` (from `loss.build_loss`) maps the [2B, d] embeddings to the loss; default InfoNCE at
    `temperature`. `gather` turns this process's rows into the global batch's (several processes), so the
    loss is eq. 1 over the global batch. With `grad_cache_chunk` the views are embedded that many at a
    time with cached gradients (gradcache.py): same loss and gradients at the activation memory of one chunk.
    """
    if grad_cache_chunk:
        embeddings = cached_embeddings(lambda chunk: embed_views(encoder, chunk, [], False, device, precision),
                                       first + second, grad_cache_chunk)
    else:
        embeddings = embed_views(encoder, first, second, controlled_dropout, device, precision)
    if gather is not None:
        embeddings = gather(embeddings)
    return loss_fn(embeddings) if loss_fn is not None else mirror_infonce(embeddings, temperature)


def train(cfg: TrainConfig, strings: TrainingStrings | None = None) -> TrainResult:
    """Run Mirror-BERT tuning as configured and write the model to `cfg.output`."""
    validate(cfg)
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


class MirrorMethod:
    """Mirror-BERT for the engine: batches of the epoch's order, two views each, InfoNCE over the pair."""

    def __init__(self, cfg: TrainConfig, encoder: Encoder, token_ids: list[list[int]], views: SecondViews,
                 plan: _Plan, dist_ctx, device: torch.device, precision: str, fingerprint: str, timer: PhaseTimer):
        self.timer = timer  # wall time per phase (phases.py): span masking is its own phase
        self.cfg, self.encoder, self.token_ids, self.views, self.plan = cfg, encoder, token_ids, views, plan
        self.dist, self.device, self.precision, self.fingerprint = dist_ctx, device, precision, fingerprint
        self.pad_id = encoder.tokenizer.pad_token_id if encoder.tokenizer.pad_token_id is not None else 0
        self.loss_fn = build_loss(cfg.loss, cfg.temperature)
        self.optimizer = build_optimizer(encoder, cfg.lr, cfg.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, cfg.schedule, cfg.warmup_steps, plan.total_steps)
        self.scaler = make_grad_scaler(device, precision)
        self.metrics = MetricLogger(cfg.log_dir if dist_ctx.is_main else None)
        self.epoch, self.next_batch, self.loss_value, self.epoch_done = 0, 0, None, False
        # final_loss is one (possibly short) batch; the epoch mean is the number to compare runs by
        self.epoch_losses: list[float] = []
        self.first_loss: float | None = None  # for the collapse check after training
        self.mean_loss_last_epoch: float | None = None
        self.seen_strings, self.seen_tokens, self.start = 0, 0, time.time()
        self.step_log: list[tuple[float, int, int]] = []

    def batches(self):
        while True:  # the engine stops at the budget
            order = self.plan.epoch_batches(self.epoch)
            with self.timer.phase("mask"):
                second = self.views.draw(derived_generator(self.cfg.seed, STREAM_MASK, self.epoch))
            for index in order[self.next_batch:]:
                yield index, second

    def train_step(self, batch, engine) -> dict[str, str]:
        index, second_views = batch  # the global batch; this process embeds its shard
        started, local = time.perf_counter(), self.dist.shard(index)
        self.dist.seed_step(self.cfg.seed, engine.step)
        loss = mirror_step_loss(self.encoder, [self.token_ids[i] for i in local], [second_views[i] for i in local],
                                self.pad_id, self.cfg.temperature, self.cfg.controlled_dropout, self.device,
                                self.precision, self.loss_fn, lambda rows: self.dist.gather_views(rows, len(index)),
                                self.cfg.grad_cache_chunk)
        engine.check_finite(loss)
        backward_and_step(loss, self.optimizer, self.scheduler, self.scaler, max_grad_norm=self.cfg.max_grad_norm)
        self.loss_value = loss.item()
        self.epoch_losses.append(self.loss_value)
        if self.first_loss is None:
            self.first_loss = self.loss_value
        tokens = sum(len(self.token_ids[i]) + len(second_views[i]) for i in index)
        self.seen_strings, self.seen_tokens = self.seen_strings + len(index), self.seen_tokens + tokens
        self.step_log.append((time.perf_counter() - started, len(index), tokens))
        self.next_batch += 1
        return {"loss": f"{self.loss_value:.4f}", "strings_s": f"{self.seen_strings / self.elapsed():.1f}"}

    def after_step(self, step: int) -> bool:
        if step % self.cfg.log_every == 0 or step == self.plan.total_steps:
            self.metrics.log(step, loss=self.loss_value, lr=self.scheduler.get_last_lr()[0],
                             strings_per_s=self.seen_strings / self.elapsed())
            logger.debug("step %d loss %.8f", step, self.loss_value)
        if self.next_batch >= self.plan.batches_per_epoch:  # the next epoch gets its own order and masks
            self.epoch, self.next_batch = self.epoch + 1, 0
            self.mean_loss_last_epoch, self.epoch_losses = sum(self.epoch_losses) / len(self.epoch_losses), []
        return False

    def finish(self) -> None:
        if self.epoch_losses:  # stopped inside an epoch (--steps): the mean of that epoch's batches so far
            self.mean_loss_last_epoch = sum(self.epoch_losses) / len(self.epoch_losses)

    def elapsed(self) -> float:
        return max(time.time() - self.start, 1e-9)

    def save_model(self, folder: Path) -> None:
        self.encoder.write(folder)

    def checkpoint_state(self) -> dict[str, Any]:
        # the losses travel with the checkpoint: a run resumed at its last step still reports them
        return {"epoch": self.epoch, "next_batch": self.next_batch, "loss": self.loss_value,
                "first_loss": self.first_loss, "mean_loss_last_epoch": self.mean_loss_last_epoch}

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"data_sha256": self.fingerprint, "config": self.cfg.to_dict(), "world_size": self.dist.world_size}


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
    timer = PhaseTimer()  # wall time per phase -> info["timings"]; -v logs it (phases.py)
    with timer.phase("data"):
        strings = strings or strings_for_config(cfg)
    seed_everything(cfg.seed)
    resume = load_checkpoint(cfg.resume) if cfg.resume else None
    if resume is not None:
        check_resume_config(resume.path, resume.meta.get("config"), cfg.to_dict(), RESUME_HARMLESS)
        if resume.meta.get("data_sha256") not in (None, strings.fingerprint):
            raise UserError(f"--resume {resume.path}: the training data differ from the run that wrote this checkpoint")
        check_resume_step(resume.path, int(resume.meta.get("step", 0)), planned_steps(cfg, len(strings.strings)))
    encoder, token_ids, views, pooling, drophead = _build_encoder(cfg, strings, resume, device, timer)
    with timer.phase("compile"):
        compiled = cfg.compile and compile_model(
            encoder.model, warm_up=lambda: _compile_warm_up(encoder, token_ids[:2], device, precision))
    batch_size = min(cfg.batch_size, len(token_ids))
    if batch_size < cfg.batch_size:
        logger.warning("--batch-size %d is larger than the data (%d strings): using %d", cfg.batch_size,
                       len(token_ids), batch_size)
    plan = _Plan(len(token_ids), batch_size, 0, cfg.seed)
    plan.total_steps = cfg.steps or cfg.epochs * plan.batches_per_epoch
    method = MirrorMethod(cfg, encoder, token_ids, views, plan, dist_ctx, device, precision, strings.fingerprint, timer)
    engine = Engine(method, total_steps=plan.total_steps, dist=dist_ctx, save_every=cfg.save_every,
                    checkpoints=CheckpointManager(cfg.resolved_checkpoint_dir(), keep=cfg.keep_checkpoints),
                    checkpointing=cfg.save_every > 0 or cfg.checkpoint_dir is not None or resume is not None,
                    desc="mirror", show_progress=cfg.show_progress, timer=timer)
    if resume is not None:
        extra = restore_training_state(resume, method.optimizer, method.scheduler, method.scaler)
        engine.step, method.epoch, method.next_batch = extra["step"], extra["epoch"], extra["next_batch"]
        method.loss_value = extra.get("loss")
        method.first_loss = extra.get("first_loss", method.first_loss)
        method.mean_loss_last_epoch = extra.get("mean_loss_last_epoch", method.mean_loss_last_epoch)
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
        return TrainResult(None, outcome.steps, method.loss_value, wall, interrupted=True,
                           checkpoint=outcome.checkpoint, step_log=method.step_log, stop_signal=outcome.signal)
    with InterruptFlag("finishing and saving the trained model first"):  # a SIGTERM now would lose the steps
        return _finish(cfg, method, strings, pooling, batch_size, outcome, wall, compiled, encoder, eval_tasks,
                       dist_ctx, timer, engine)


def _finish(cfg, method, strings, pooling, batch_size, outcome, wall, compiled, encoder, eval_tasks, dist_ctx, timer,
            engine) -> TrainResult:
    """After the last step: the run's record, the collapse check, --eval-after, the output."""
    info = _run_info(cfg, method, strings, pooling, batch_size, outcome.steps, wall, compiled)
    encoder.eval()
    info["collapse"] = check_collapse(encoder, strings.strings, method.first_loss, method.mean_loss_last_epoch,
                                      outcome.steps, cfg.seed, lr=cfg.lr, pooling=pooling)
    if eval_tasks:
        with sharded_encoding(dist_ctx), timer.phase("eval"):  # every rank evaluates, sharing the encoding work
            info["eval_after"] = evaluate_after_training(encoder, eval_tasks, cfg.data_dir)
    info["timings"] = timer.report()  # up to here: the save cannot time itself into its own file
    output = engine.save_final(cfg.output, lambda folder: encoder.write(folder, info), overwrite=cfg.overwrite)
    info["timings"] = timer.report()  # now with the save, for the caller and the -v line
    logger.debug("phase timings (s): %s", jsonio.dumps(info["timings"]))
    logger.info("model written to %s (%d steps, final loss %s)", output, outcome.steps, method.loss_value)
    if cfg.max_length < encoder.max_length:  # say it: the saved limit is not the one the strings were cut at
        logger.info("trained on strings cut at %d tokens; the saved model encodes up to %d (its own limit; "
                    "max_length=%d when loading encodes as in training)", cfg.max_length, encoder.max_length,
                    cfg.max_length)
    return TrainResult(output, outcome.steps, method.loss_value, wall, checkpoint=outcome.checkpoint, info=info,
                       step_log=method.step_log)


def _build_encoder(cfg: TrainConfig, strings: TrainingStrings, resume, device: torch.device, timer: PhaseTimer):
    """The encoder to train (from the checkpoint when resuming), its token ids and the second-view masker."""
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
        token_ids = tokenize_once(encoder.tokenizer, strings.strings, cfg.max_length)
        token_ids = drop_tokenless(encoder.tokenizer, strings, token_ids)
        views = SecondViews(encoder.tokenizer, strings.strings, token_ids, cfg.mask_unit, cfg.mask_span,
                            cfg.mask_min_chars, cfg.max_length)
    views.warn_if_never_applies()
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(encoder.model)
    return encoder, token_ids, views, pooling, drophead


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
        "final_loss": method.loss_value,
        "mean_loss_last_epoch": method.mean_loss_last_epoch,
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


__all__ = ["train", "TrainResult", "mirror_step_loss", "steps_per_epoch"]
