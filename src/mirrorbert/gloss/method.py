"""GR-BERT as a `Method` of the training engine: triplet batches of each epoch's seeded order, MLM + gloss
loss per step, held-out gloss-matching accuracy at every epoch end, and the best epoch's weights kept."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mirrorbert.gloss.config import GlossPretrainConfig
from mirrorbert.gloss.model import collate, gloss_matching_accuracy
from mirrorbert.gloss.parts import cpu_state, save_parts
from mirrorbert.reporting.metrics import MetricLogger
from mirrorbert.runtime.device import autocast, make_grad_scaler
from mirrorbert.runtime.randomness import derived_generator
from mirrorbert.safeguards.writes import make_temporary, mark_folder, record_files, remove_tree
from mirrorbert.training.loss_record import LossRecord
from mirrorbert.training.optim import backward_and_step, build_optimizer, build_scheduler
from mirrorbert.training.plan import BatchPlan
from mirrorbert.training.run import keeps_checkpoints

logger = logging.getLogger(__name__)

STREAM_ORDER, STREAM_MASK, STREAM_HARD = 11, 12, 13


@dataclass
class GlossData:
    """The triplets as the method reads them: raw and encoded, split, with the gloss inventory and the masker."""

    train_t: list
    held_t: list
    train_enc: list
    held_enc: list
    inventory: Any
    masker: Any  # an MlmMasker when --mlm-prob > 0
    gloss_length: int
    fingerprint: str


class GlossMethod:
    """GR-BERT for the engine: triplet batches of the epoch's order, held-out evaluation at every epoch end."""

    def __init__(self, cfg: GlossPretrainConfig, model, tokenizer, data: GlossData, plan: BatchPlan, run_ctx):
        self.cfg, self.model, self.tokenizer, self.plan = cfg, model, tokenizer, plan
        self.data, self.per_epoch, self.total_steps = data, plan.batches_per_epoch, plan.total_steps
        self.device, self.precision = run_ctx.device, run_ctx.precision
        self.warmup_steps = int(round(cfg.warmup * plan.total_steps))
        self.optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, "linear", self.warmup_steps, plan.total_steps)
        self.scaler = make_grad_scaler(self.device, self.precision)
        # the best epoch's model is kept on disk too when the run keeps checkpoints, so a resumed run knows it
        self.ckpt_root = cfg.resolved_checkpoint_dir()
        self.checkpointing = keeps_checkpoints(cfg, run_ctx.resume is not None)
        self.epoch, self.next_batch = 0, 0
        self.losses = LossRecord(self.per_epoch)  # the reported means (a window, the last epoch), through checkpoints
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.best_state: dict[str, Any] | None = None
        self.metrics = MetricLogger(cfg.log_dir)

    def batches(self):
        while True:  # each pass starts where after_step left the position: the next epoch at its batch 0
            yield from self.plan.iter_batches(self.epoch, self.next_batch)

    def train_step(self, index, engine) -> dict[str, str]:
        cfg, step = self.cfg, engine.step
        generator = derived_generator(cfg.seed, STREAM_MASK, step)
        batch = collate(
            [self.data.train_enc[i] for i in index], self.data.train_t, self.tokenizer,
            inventory=self.data.inventory if cfg.hard_negatives else None,
            rng=random.Random(cfg.seed * 1_000_003 + STREAM_HARD * 7919 + step),
            masker=None if self.data.masker is None else partial(self.data.masker, generator=generator),
            max_gloss_length=self.data.gloss_length,
        ).to(self.device)
        with autocast(self.device, self.precision):
            out = self.model(batch)
        engine.check_finite(out.loss)
        backward_and_step(out.loss, self.optimizer, self.scheduler, self.scaler, self.model.parameters(),
                          cfg.max_grad_norm)
        self.next_batch += 1
        self.losses.add(float(out.loss.item()))
        if (step + 1) % cfg.log_every == 0 or step + 1 == self.total_steps:  # --log-every: TensorBoard scalars
            self.metrics.log(step + 1, loss=self.losses.last, gr_loss=float(out.gr.item()),
                             mlm_loss=float(out.mlm.item()), batch_accuracy=out.accuracy,
                             lr=self.scheduler.get_last_lr()[0])
        return {"loss": f"{self.losses.last:.3f}", "gr": f"{out.gr.item():.3f}", "mlm": f"{out.mlm.item():.3f}",
                "acc": f"{out.accuracy:.2f}"}

    def after_step(self, step: int) -> bool:
        if self.next_batch < self.per_epoch:
            return False
        self.epoch, self.next_batch = self.epoch + 1, 0
        self.losses.end_epoch()
        self.record_eval(self.epoch, step)
        return True  # a checkpoint at every epoch end (when checkpointing)

    def finish(self) -> None:
        self.losses.finish()
        if self.next_batch != 0:  # --steps ended mid-epoch: evaluate the final model too
            self.record_eval(self.epoch + 1, self.total_steps)

    def record_eval(self, tag_epoch: int, step: int) -> None:
        if not self.data.held_enc:
            return
        res = gloss_matching_accuracy(self.model, self.tokenizer, self.data.held_t, self.data.held_enc,
                                      batch_size=self.cfg.eval_batch_size, max_gloss_length=self.data.gloss_length,
                                      precision=self.precision)
        if not res:
            return
        entry = {"epoch": tag_epoch, "step": step, **{k: round(float(v), 6) for k, v in res.items()}}
        self.history.append(entry)
        self.metrics.log(step, heldout_accuracy=res["accuracy"], heldout_accuracy_word=res["accuracy_word"])
        logger.info("epoch %d (step %d): held-out gloss-matching accuracy %.4f (within word %.4f, %d triplets)",
                    tag_epoch, step, res["accuracy"], res["accuracy_word"], int(res["n"]))
        if step > 0 and (self.best is None or res["accuracy"] > self.best["accuracy"]):
            self.best = {"epoch": tag_epoch, "step": step, "accuracy": entry["accuracy"],
                         "accuracy_word": entry["accuracy_word"]}
            self.best_state = cpu_state(self.model.inference_model)
            if self.checkpointing:
                self.save_best_dir()

    def save_best_dir(self) -> None:
        """Keep the best model on disk too, so that a resumed run still knows it."""
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        mark_folder(self.ckpt_root)  # a later run over this folder needs --resume or --overwrite
        final = self.ckpt_root / "best-model"
        tmp = make_temporary(final, folder=True)
        self.model.save_inference(tmp, self.tokenizer)
        record_files(tmp, "best-model")  # what --overwrite may later prove it wrote
        remove_tree(final)  # a link there: only the link
        os.replace(tmp, final)

    def save_model(self, folder: Path) -> None:
        save_parts(self.model, self.tokenizer, folder)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "next_batch": self.next_batch, "history": self.history, "best": self.best,
                "losses": self.losses.state()}

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"data_sha256": self.data.fingerprint, "arch": self.cfg.arch, "config": self.cfg.to_dict()}
