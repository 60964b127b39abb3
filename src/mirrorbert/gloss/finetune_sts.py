"""Supervised STS-B fine-tuning (GR-BERT paper, supervised STS): Siamese cosine regression.

Protocol: a Siamese encoder (one set of weights for both sentences, pooled vectors u, v) is
trained to regress cos(u, v) onto the gold score scaled to [0, 1] (MSE, as Sentence-BERT's
CosineSimilarityLoss) on all, 50% or 20% of STS-B train (seeded subsets, a new subset per
seed), 4 epochs, batch 16, AdamW lr 2e-5 with 10% warmup and linear decay; the STS-B test
Spearman correlation (x100) is averaged over 4 seeds, with the sample standard deviation.
No model selection on dev: the model after the last epoch is scored, so test is seen once.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.typed import check_finite_numbers, check_types

logger = logging.getLogger(__name__)

STREAM_SUBSET = 21


@dataclass
class FinetuneStsConfig:
    model: str = ""
    data_dir: str | None = None
    pooling: str | None = None  # default: the model's saved pooling, else mean
    fractions: tuple[float, ...] = (1.0, 0.5, 0.2)
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    epochs: int = 4
    batch_size: int = 16
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup: float = 0.1
    max_length: int = 128
    device: str = "auto"
    precision: str = "fp32"
    eval_batch_size: int = 64
    show_progress: bool = True
    trust_remote_code: bool = False  # --trust-remote-code (safeguards/model_loading.py)

    def validate(self) -> None:
        check_types(self)
        if not self.model:
            raise UserError("--model is required")
        if not self.fractions or any(not 0.0 < f <= 1.0 for f in self.fractions):
            raise UserError(f"--fractions must be in (0, 1], got {self.fractions}")
        if not self.seeds:
            raise UserError("--seeds: give at least one seed")
        from mirrorbert.settings.seeds import check_seed

        for seed in self.seeds:
            check_seed(seed, "--seeds")
        if self.epochs < 1 or self.batch_size < 2 or self.lr <= 0:
            raise UserError("--epochs must be >= 1, --batch-size >= 2 and --lr > 0")
        if not 0.0 <= self.warmup < 1.0:
            raise UserError(f"--warmup must be in [0, 1), got {self.warmup}")
        check_finite_numbers(self)
        if self.weight_decay < 0:
            raise UserError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        for name in ("max_length", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        from mirrorbert.runtime.device import check_device_and_precision  # torch: not at --help time

        check_device_and_precision(self.device, self.precision)


@dataclass
class StsRun:
    fraction: float
    seed: int
    train_pairs: int
    steps: int
    test_spearman: float  # x100
    wall_time_s: float


@dataclass
class FinetuneStsResult:
    runs: list[StsRun] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for frac in sorted({r.fraction for r in self.runs}, reverse=True):
            scores = [r.test_spearman for r in self.runs if r.fraction == frac]
            out[f"{frac:g}"] = {
                "mean": round(statistics.fmean(scores), 2),
                "std": round(statistics.stdev(scores), 2) if len(scores) > 1 else 0.0,
                "scores": [round(s, 2) for s in scores],
                "train_pairs": next(r.train_pairs for r in self.runs if r.fraction == frac),
            }
        return out


def subset_indices(n: int, fraction: float, seed: int) -> list[int]:
    """A seeded random subset of round(fraction * n) training pairs (all of them for 1.0)."""
    if fraction >= 1.0:
        return list(range(n))
    k = max(2, int(round(fraction * n)))
    return sorted(random.Random(seed * 1_000_003 + STREAM_SUBSET).sample(range(n), k))


def cosine_regression_loss(u, v, target):
    """MSE between cos(u, v) and the scaled gold score (Sentence-BERT's CosineSimilarityLoss)."""
    import torch.nn.functional as F

    return F.mse_loss(F.cosine_similarity(u.float(), v.float(), dim=-1), target.float())


def finetune_once(cfg: FinetuneStsConfig, train, test, fraction: float, seed: int) -> StsRun:
    """Fine-tune a fresh copy of the model on one subset with one seed; score STS-B test."""
    import torch
    from mirrorbert.reporting.progress import progress_bar

    from mirrorbert.encoder.model import Encoder
    from mirrorbert.evaluation.sts import score_pairs
    from mirrorbert.runtime.device import autocast, make_grad_scaler, resolve_device, resolve_precision
    from mirrorbert.training.optim import backward_and_step, build_optimizer, build_scheduler
    from mirrorbert.runtime.randomness import seed_everything
    from mirrorbert.encoder.batching import pad_batch

    started = time.time()
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device)
    seed_everything(seed)
    idx = subset_indices(len(train), fraction, seed)
    encoder = Encoder.load(cfg.model, pooling=cfg.pooling, device=str(device), trust_remote_code=cfg.trust_remote_code,
                           cli=True)  # errors name the options, as FinetuneStsConfig's own do
    from mirrorbert.encoder.architectures import usable_precision

    precision = usable_precision(encoder.model, precision)
    encoder.max_length = min(cfg.max_length, encoder.max_length)  # at most the model's positions, like gloss-pretrain
    encoder.train()
    ids1 = encoder.tokenize([train.s1[i] for i in idx])
    ids2 = encoder.tokenize([train.s2[i] for i in idx])
    gold = torch.tensor([train.scores[i] / 5.0 for i in idx], dtype=torch.float32)
    pad_id = encoder.tokenizer.pad_token_id if encoder.tokenizer.pad_token_id is not None else 0
    per_epoch = math.ceil(len(idx) / cfg.batch_size)
    total = per_epoch * cfg.epochs
    optimizer = build_optimizer(encoder, cfg.lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, "linear", int(round(cfg.warmup * total)), total)
    scaler = make_grad_scaler(device, precision)  # fp16: loss scaling, unscaled before any clipping; else None
    gen = torch.Generator().manual_seed(seed)
    step = 0
    with progress_bar(total=total, show=cfg.show_progress, desc=f"sts-b {fraction:g} seed {seed}", unit="step") as bar:
        for _ in range(cfg.epochs):
            order = torch.randperm(len(idx), generator=gen).tolist()
            for b in range(0, len(order), cfg.batch_size):
                rows = order[b:b + cfg.batch_size]
                a = {k: v.to(device) for k, v in pad_batch([ids1[i] for i in rows], pad_id).items()}
                c = {k: v.to(device) for k, v in pad_batch([ids2[i] for i in rows], pad_id).items()}
                with autocast(device, precision):
                    u, v = encoder(**a), encoder(**c)
                loss = cosine_regression_loss(u, v, gold[rows].to(device))
                backward_and_step(loss, optimizer, scheduler, scaler)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    encoder.eval()
    spearman = 100.0 * score_pairs(encoder, test, batch_size=cfg.eval_batch_size)
    logger.info("STS-B fraction %g seed %d: test Spearman %.2f (%d pairs, %d steps)", fraction, seed, spearman,
                len(idx), step)
    return StsRun(fraction, seed, len(idx), step, spearman, time.time() - started)


def finetune_sts(cfg: FinetuneStsConfig) -> FinetuneStsResult:
    """All fractions x seeds; STS-B train and test come from ``<data_dir>/sts/STSBenchmark``."""
    from mirrorbert.evaluation.sts import load_set

    cfg.validate()
    train = load_set(cfg.data_dir, "stsb", "train")
    test = load_set(cfg.data_dir, "stsb", "test")
    result = FinetuneStsResult()
    for frac in cfg.fractions:
        for seed in cfg.seeds:
            result.runs.append(finetune_once(cfg, train, test, frac, seed))
    return result


def parse_floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{option}: expected comma-separated numbers, got {text!r}") from None


def parse_ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{option}: expected comma-separated integers, got {text!r}") from None


__all__ = ["FinetuneStsConfig", "FinetuneStsResult", "finetune_sts", "cosine_regression_loss", "subset_indices"]

