"""MLM pre-training as a `Method` of the training engine: packed windows, masks from (seed, epoch, batch),
accumulated steps, held-out evaluation, and the running metrics carried through checkpoints. Sequence i of a split
is `[CLS] + stream[i*(L-1) : (i+1)*(L-1)]` over its token stream (`data.token_stream`): windows tile the stream,
sentences continue across windows (RoBERTa's FULL-SENTENCES packing), only a split's last sequence pads."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from mirrorbert.data.token_stream import TokenizedCorpus
from mirrorbert.encoder.masked_lm import lm_head_of
from mirrorbert.mlm.config import PretrainConfig
from mirrorbert.mlm.masking import IGNORE_INDEX, MlmMasker
from mirrorbert.reporting.metrics import MetricLogger
from mirrorbert.runtime.device import autocast, make_grad_scaler
from mirrorbert.runtime.randomness import derived_generator
from mirrorbert.training.optim import backward_and_step, build_optimizer, build_scheduler
from mirrorbert.training.plan import BatchPlan
from mirrorbert.training.prefetch import prefetch

logger = logging.getLogger(__name__)

# Random streams derived from the seed (runtime/randomness.py: derived_generator), one per purpose.
STREAM_ORDER, STREAM_MASK, STREAM_EVAL = 10, 11, 12


class PackedSequences:
    """Fixed-length windows over a token stream, each prefixed by the start token ([CLS] / <s>)."""

    def __init__(self, stream: np.ndarray, seq_length: int, start_id: int, pad_id: int):
        self.stream = stream
        self.seq_length = int(seq_length)
        self.body = self.seq_length - 1
        self.start_id = int(start_id)
        self.pad_id = int(pad_id)

    def __len__(self) -> int:
        return -(-len(self.stream) // self.body)

    def batch(self, indices: Sequence[int] | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """`(input_ids, attention_mask)` as int64 [len(indices), seq_length]; only the final window pads."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"sequence index out of range [0, {n})")
        ids = np.full((len(idx), self.seq_length), self.pad_id, dtype=np.int64)
        att = np.zeros((len(idx), self.seq_length), dtype=np.int64)
        ids[:, 0] = self.start_id
        att[:, 0] = 1
        for row, i in enumerate(idx):
            lo = int(i) * self.body
            chunk = self.stream[lo : lo + self.body]
            ids[row, 1 : 1 + len(chunk)] = chunk
            att[row, : 1 + len(chunk)] = 1
        return torch.from_numpy(ids), torch.from_numpy(att)


def windows(corpus: TokenizedCorpus, split: str, seq_length: int) -> PackedSequences:
    """The split's windows of `seq_length` tokens."""
    return PackedSequences(corpus.stream(split), seq_length, corpus.meta["start_id"], corpus.meta["pad_id"])


@dataclass
class MlmData:
    """The corpus as the method reads it: the tokenizer, training and held-out windows, the masker, the cache key."""

    tokenizer: Any
    packed: PackedSequences
    eval_packed: PackedSequences | None
    masker: MlmMasker
    corpus_key: str


def mlm_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
             head: torch.nn.Module | None) -> tuple[torch.Tensor, int, int]:
    """(sum of token losses, number of targets, number predicted correctly); with the model's LM `head` the
    vocabulary projection is applied to the target positions only."""
    targets = labels != IGNORE_INDEX
    if head is not None:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)[0]
        logits = head(hidden[targets])
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).logits[targets]
    gold = labels[targets]
    loss = torch.nn.functional.cross_entropy(logits.float(), gold, reduction="sum")
    correct = int((logits.argmax(-1) == gold).sum().item()) if gold.numel() else 0
    return loss, int(gold.numel()), correct


def _training_batches(plan: BatchPlan, packed: PackedSequences, masker: MlmMasker, start_micro: int) -> Iterator[tuple]:
    """Micro-batches from micro-batch `start_micro` on: each epoch's order and each batch's masks are functions of
    (seed, epoch, batch), so a resumed run sees exactly the batches the uninterrupted one would."""
    epoch, first = divmod(start_micro, plan.batches_per_epoch)
    while True:
        for b, index in enumerate(plan.iter_batches(epoch, first), first):
            ids, att = packed.batch(index)
            corrupted, labels = masker(ids, att, derived_generator(plan.seed, STREAM_MASK, epoch, b))
            yield corrupted, att, labels
        epoch, first = epoch + 1, 0


# loss and correct summed over the window's targets (n), so its loss is the mean per masked token
_EMPTY_WINDOW = {"loss": 0.0, "n": 0, "correct": 0, "tokens": 0, "steps": 0}


class MlmMethod:
    """MLM pre-training for the engine: packed windows, masks from (seed, epoch, batch), accumulated steps."""

    def __init__(self, cfg: PretrainConfig, model, plan: BatchPlan, data: MlmData, run_ctx):
        self.cfg, self.model, self.plan, self.data = cfg, model, plan, data
        self.total_steps = plan.total_steps
        self.device, self.precision = run_ctx.device, run_ctx.precision
        self.head = lm_head_of(model)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.lr = cfg.lr if cfg.lr is not None else (5e-4 if cfg.architecture else 5e-5)  # the peak
        self.warmup = cfg.warmup_steps if cfg.warmup_steps is not None else min(10_000, round(0.06 * plan.total_steps))
        self.optimizer = build_optimizer(model, self.lr, cfg.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, "linear", self.warmup, plan.total_steps)
        self.scaler = make_grad_scaler(self.device, self.precision)
        self.start_step, self.tokens_seen, self.history = 0, 0, []
        # the training metrics since the last log line (--log-every), carried through checkpoints
        self.window = {**_EMPTY_WINDOW, "t": time.time()}
        self.run_tokens, self.loop_start = 0, time.time()
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] | None = None
        self.metrics = MetricLogger(cfg.log_dir)
        self.micro = None

    def restore(self, extra: dict[str, Any]) -> None:
        """Position, tokens, history and metric window from a checkpoint's extra state."""
        self.start_step, self.tokens_seen = int(extra["step"]), int(extra["tokens"])
        self.history = list(extra.get("history", []))
        self.window = {**_EMPTY_WINDOW, **(extra.get("window") or {}), "t": time.time()}

    def batches(self):
        cfg = self.cfg
        self.micro = prefetch(_training_batches(self.plan, self.data.packed, self.data.masker,
                                                self.start_step * cfg.grad_accum), cfg.prefetch_batches)
        self.run_tokens, self.loop_start = 0, time.time()
        while True:
            yield [next(self.micro) for _ in range(cfg.grad_accum)]

    def train_step(self, micro, engine) -> dict[str, str]:
        cfg, device = self.cfg, self.device
        n_targets = sum(int((labels != IGNORE_INDEX).sum()) for _, _, labels in micro)
        self.optimizer.zero_grad(set_to_none=True)
        step_loss, step_correct, step_tokens = 0.0, 0, 0
        for i, (ids, att, labels) in enumerate(micro):
            with autocast(device, self.precision):
                loss_sum, count, correct = mlm_loss(self.model, ids.to(device), att.to(device), labels.to(device),
                                                    self.head)
            step_loss += float(loss_sum.detach())
            step_correct += correct
            step_tokens += int(att.sum())
            engine.check_finite(step_loss)
            # Normalised by the targets of the whole step, so accumulation equals one big batch.
            backward_and_step(loss_sum / max(1, n_targets), self.optimizer, self.scheduler, self.scaler,
                              self.parameters, cfg.max_grad_norm, update=i == len(micro) - 1)
        self.tokens_seen += step_tokens
        self.run_tokens += step_tokens
        for key, value in (("loss", step_loss), ("n", n_targets), ("correct", step_correct), ("tokens", step_tokens),
                           ("steps", 1)):
            self.window[key] += value
        rate = self.run_tokens / max(time.time() - self.loop_start, 1e-9)
        return {"loss": f"{step_loss / max(1, n_targets):.3f}", "acc": f"{step_correct / max(1, n_targets):.3f}",
                "tok_s": f"{rate:.0f}"}

    def after_step(self, step: int) -> bool:
        cfg, window = self.cfg, self.window
        if step % cfg.log_every == 0 or step == self.plan.total_steps:
            now = time.time()
            self.last_train = {
                "step": step, "tokens": self.tokens_seen,
                "loss": window["loss"] / max(1, window["n"]), "accuracy": window["correct"] / max(1, window["n"]),
                "lr": self.scheduler.get_last_lr()[0], "tokens_per_s": window["tokens"] / max(now - window["t"], 1e-9),
                "window_steps": window["steps"],
            }
            self.history.append(self.last_train)
            self.metrics.log(step, **{f"train/{k}": v for k, v in self.last_train.items() if k != "step"})
            logger.debug("step %d: %s", step, self.last_train)
            self.window = {**_EMPTY_WINDOW, "t": now}
        if step % cfg.eval_every == 0 or step == self.plan.total_steps:
            self.last_eval = self.evaluate()
            if self.last_eval is not None:
                self.history.append({"step": step, "tokens": self.tokens_seen, **self.last_eval})
                self.metrics.log(step, **{k.replace("eval_", "eval/"): v for k, v in self.last_eval.items()})
                logger.info("step %d (%d tokens): held-out loss %.4f, masked-token accuracy %.4f",
                            step, self.tokens_seen, self.last_eval["eval_loss"], self.last_eval["eval_accuracy"])
        return False

    def evaluate(self) -> dict[str, float] | None:
        """Loss and masked-token accuracy on a fixed, evenly spaced subset of held-out sequences, fixed masks."""
        cfg, model, packed, device = self.cfg, self.model, self.data.eval_packed, self.device
        if packed is None or len(packed) == 0:
            return None
        n = min(len(packed), cfg.eval_sequences)
        index = np.unique(np.linspace(0, len(packed) - 1, n).round().astype(np.int64))
        model.eval()
        total_loss, total_n, total_correct = 0.0, 0, 0
        try:
            with torch.no_grad():
                for b, start in enumerate(range(0, len(index), cfg.batch_size)):
                    ids, att = packed.batch(index[start : start + cfg.batch_size])
                    corrupted, labels = self.data.masker(ids, att, derived_generator(cfg.seed, STREAM_EVAL, b))
                    with autocast(device, self.precision):
                        loss, count, correct = mlm_loss(model, corrupted.to(device), att.to(device), labels.to(device),
                                                        self.head)
                    total_loss += float(loss)
                    total_n += count
                    total_correct += correct
        finally:
            model.train()
        if total_n == 0:
            return None
        return {"eval_loss": total_loss / total_n, "eval_accuracy": total_correct / total_n, "eval_targets": total_n}

    def finish(self) -> None:
        pass

    def close(self) -> None:
        if self.micro is not None:
            self.micro.close()
        self.metrics.close()

    def save_model(self, folder) -> None:
        self.model.save_pretrained(folder)
        self.data.tokenizer.save_pretrained(folder)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"tokens": self.tokens_seen, "history": self.history,
                "window": {k: v for k, v in self.window.items() if k != "t"}}

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"pretrain": {"corpus_key": self.data.corpus_key, "config": self.cfg.to_dict(),
                             "total_steps": self.plan.total_steps}}
