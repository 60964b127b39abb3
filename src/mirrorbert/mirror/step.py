"""The Mirror-BERT step: a batch's two views, embedded with dropout on, InfoNCE over the pair, one update.
`MirrorMethod` is what `mirror.train` hands the training engine: the epoch's batches and `train_step`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

import torch

from mirrorbert.encoder.model import Encoder
from mirrorbert.mirror.config import TrainConfig
from mirrorbert.mirror.loss import build_loss
from mirrorbert.mirror.views import STREAM_ORDER, SecondViews
from mirrorbert.reporting.metrics import MetricLogger
from mirrorbert.runtime.device import autocast, make_grad_scaler
from mirrorbert.runtime.randomness import replay_rng
from mirrorbert.training.gradcache import cached_embeddings
from mirrorbert.training.loss_record import LossRecord
from mirrorbert.training.optim import backward_and_step, build_optimizer, build_scheduler
from mirrorbert.training.plan import BatchPlan, contrastive_plan
from mirrorbert.training.prefetch import prefetch
from mirrorbert.training.run import RunContext

logger = logging.getLogger(__name__)

PREFETCH = 2  # batches made ahead of the step on an accelerator: enough to hide masking, two batches of ids


def prefetch_depth(device: torch.device) -> int:
    """Batches whose views are made ahead in a thread: `PREFETCH` on an accelerator, none on a CPU."""
    return PREFETCH if device.type != "cpu" else 0


def mirror_plan(cfg: TrainConfig, n_strings: int) -> BatchPlan:
    """The run's batches and its optimiser steps (--steps, or the epochs' batches): known before any model loads."""
    return contrastive_plan(n_strings, cfg.batch_size, cfg.seed, STREAM_ORDER, cfg.steps, cfg.epochs)


def embed_views(encoder: Encoder, first: list[list[int]], second: list[list[int]], *, precision: str,
                controlled_dropout: bool = False) -> torch.Tensor:
    """Rows [f(x_1)..f(x_B), f(xbar_1)..f(xbar_B)] in `precision` on the encoder's device; normally one forward pass
    over both views. With controlled dropout the views run as two passes that replay the same random state, so
    every dropout (and drophead) mask is identical for x and x-bar."""
    with autocast(encoder.device, precision):
        if controlled_dropout:
            with replay_rng():
                a = encoder.embed(first)
            b = encoder.embed(second)
            return torch.cat([a, b])
        return encoder.embed(first + second)


def mirror_step_loss(encoder: Encoder, first: list[list[int]], second: list[list[int]], loss_fn, *, precision: str,
                     controlled_dropout: bool = False, gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     grad_cache_chunk: int | None = None) -> torch.Tensor:
    """Loss of one batch: `loss_fn` (mirror/loss.py) over the [2B, d] embeddings of both views; `gather` turns
    this process's rows into the global batch's; with `grad_cache_chunk` the views are embedded that many at a
    time with cached gradients (training/gradcache.py: the same loss and gradients)."""
    if grad_cache_chunk:
        embeddings = cached_embeddings(lambda chunk: embed_views(encoder, chunk, [], precision=precision),
                                       first + second, grad_cache_chunk)
    else:
        embeddings = embed_views(encoder, first, second, precision=precision, controlled_dropout=controlled_dropout)
    if gather is not None:
        embeddings = gather(embeddings)
    return loss_fn(embeddings)


class MirrorMethod:
    """Mirror-BERT for the engine: batches of the epoch's order, two views each, InfoNCE over the pair."""

    def __init__(self, cfg: TrainConfig, encoder: Encoder, views: SecondViews, plan: BatchPlan, run_ctx: RunContext,
                 fingerprint: str):
        self.timer = run_ctx.timer  # wall time per phase (reporting/timing.py): span masking is its own phase
        self.cfg, self.encoder, self.views, self.plan, self.total_steps = cfg, encoder, views, plan, plan.total_steps
        self.store = views.store  # the token ids (data/token_store.py), read a batch at a time
        self.dist, self.device, self.precision = run_ctx.dist, run_ctx.device, run_ctx.precision
        self.fingerprint = fingerprint
        self.loss_fn = build_loss(cfg.loss, cfg.temperature)
        self.optimizer = build_optimizer(encoder, cfg.lr, cfg.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, cfg.schedule, cfg.warmup_steps, plan.total_steps)
        self.scaler = make_grad_scaler(self.device, self.precision)
        self.metrics = MetricLogger(cfg.log_dir if self.dist.is_main else None)
        self.epoch, self.next_batch = 0, 0
        self.losses = LossRecord(plan.batches_per_epoch)  # the reported means, carried through checkpoints
        self.seen_strings, self.seen_tokens, self.start = 0, 0, time.time()
        self.step_log: list[tuple[float, int, int]] = []

    def batches(self):
        """Per batch (string indices, epoch, both views) from `self.epoch` / `next_batch` on, made `prefetch_depth`
        batches ahead in a thread; the "mask" phase is the time the step waits for them."""
        depth = prefetch_depth(self.device)
        views = self.views.for_thread() if depth else self.views
        made = prefetch(self._batches_with_views(views), depth, name="mirror-views")
        try:
            while True:
                with self.timer.phase("mask"):
                    batch = next(made, None)
                if batch is None:
                    return
                yield batch
        finally:
            made.close()

    def _batches_with_views(self, views: SecondViews):
        epoch, first_batch = self.epoch, self.next_batch
        while True:  # the engine stops at the budget; each epoch after the first starts at its batch 0
            for index in self.plan.iter_batches(epoch, first_batch):
                first = self.store.token_ids(index)
                yield index, epoch, (first, *views.make_views(index, self.cfg.seed, epoch, first))
            epoch, first_batch = epoch + 1, 0

    def train_step(self, batch, engine) -> dict[str, str]:
        index, epoch, (first, second, counts) = batch  # the global batch; this process embeds its shard
        started = time.perf_counter()
        self.views.stats.add(*counts)  # the views may have been made ahead: counted now that the batch is trained
        self.dist.seed_step(self.cfg.seed, engine.step)
        loss = mirror_step_loss(self.encoder, self.dist.shard(first), self.dist.shard(second), self.loss_fn,
                                precision=self.precision, controlled_dropout=self.cfg.controlled_dropout,
                                gather=lambda rows: self.dist.gather_views(rows, len(index)),
                                grad_cache_chunk=self.cfg.grad_cache_chunk)
        engine.check_finite(loss)
        backward_and_step(loss, self.optimizer, self.scheduler, self.scaler, max_grad_norm=self.cfg.max_grad_norm)
        self.losses.add(loss.item())
        tokens = sum(len(a) + len(b) for a, b in zip(first, second))
        self.seen_strings, self.seen_tokens = self.seen_strings + len(index), self.seen_tokens + tokens
        self.step_log.append((time.perf_counter() - started, len(index), tokens))
        self.next_batch += 1
        # the loss the run reports (training/loss_record.py): the mean of the last steps, not one (maybe short) batch
        return {"loss": f"{self.losses.final:.4f}", "strings_s": f"{self.seen_strings / self.elapsed():.1f}"}

    def after_step(self, step: int) -> bool:
        if step % self.cfg.log_every == 0 or step == self.plan.total_steps:
            self.metrics.log(step, loss=self.losses.last, lr=self.scheduler.get_last_lr()[0],
                             strings_per_s=self.seen_strings / self.elapsed())
            logger.debug("step %d loss %.8f", step, self.losses.last)
        if self.next_batch >= self.plan.batches_per_epoch:  # the next epoch gets its own order and masks
            self.epoch, self.next_batch = self.epoch + 1, 0
            self.losses.end_epoch()
        return False

    def finish(self) -> None:
        self.losses.finish()

    def elapsed(self) -> float:
        return max(time.time() - self.start, 1e-9)

    def save_model(self, folder: Path) -> None:
        self.encoder.write(folder)

    def checkpoint_state(self) -> dict[str, Any]:
        # the loss record travels with the checkpoint: a resumed run reports the whole epoch's mean and window
        return {"epoch": self.epoch, "next_batch": self.next_batch, "losses": self.losses.state()}

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"data_sha256": self.fingerprint, "config": self.cfg.to_dict(), "world_size": self.dist.world_size}


__all__ = ["MirrorMethod", "embed_views", "mirror_plan", "mirror_step_loss"]
