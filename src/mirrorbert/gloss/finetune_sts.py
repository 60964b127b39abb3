"""Supervised STS-B fine-tuning (GR-BERT paper): a Siamese encoder regresses cos(u, v) onto the gold score scaled
to [0, 1] (MSE, as Sentence-BERT's CosineSimilarityLoss) on seeded subsets of STS-B train; the model after the
last epoch (no selection on dev) is scored by its STS-B test Spearman (x100), averaged over the seeds.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from mirrorbert.settings.fields import option
from mirrorbert.settings.option_help import MODEL_POSITIONS
from mirrorbert.settings.validation import Options

logger = logging.getLogger(__name__)

STREAM_SUBSET = 21


@dataclass(kw_only=True)
class FinetuneStsConfig(Options):
    """Options of `mirrorbert finetune-sts`; each field is the CLI option of the same name (settings/fields.py)."""

    model: str | None = option(None, shared="model", note="an MLM, a gloss-pretrain or train output", required=True)
    data_dir: str | None = option(None, shared="data_dir", note="holding sts/STSBenchmark")
    pooling: str | None = option(None, shared="pooling", note="mean where the model saved none")
    fractions: tuple[float, ...] = option((1.0, 0.5, 0.2), help="training fractions", range="(0, 1]")
    seeds: tuple[int, ...] = option((0, 1, 2, 3), shared="seeds")
    epochs: int = option(4, shared="epochs")
    batch_size: int = option(16, shared="batch_size", note="sentence pairs per step", range="[2, inf)")
    lr: float = option(2e-5, shared="lr")
    weight_decay: float = option(0.01, shared="weight_decay")
    warmup: float = option(0.1, shared="warmup")
    max_length: int = option(128, shared="max_length", note=MODEL_POSITIONS)
    device: str = option("auto", shared="device")
    precision: str = option("fp32", shared="precision")
    eval_batch_size: int = option(64, shared="eval_batch_size")
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress")
    trust_remote_code: bool = option(False, shared="trust_remote_code")


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

    from mirrorbert.encoder.architectures import usable_precision
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
    from mirrorbert.runtime.device import check_device_and_precision

    cfg.validate()
    check_device_and_precision(cfg.device, cfg.precision)
    train = load_set(cfg.data_dir, "stsb", "train")
    test = load_set(cfg.data_dir, "stsb", "test")
    result = FinetuneStsResult()
    for frac in cfg.fractions:
        for seed in cfg.seeds:
            result.runs.append(finetune_once(cfg, train, test, frac, seed))
    return result


__all__ = ["FinetuneStsConfig", "FinetuneStsResult", "finetune_sts", "cosine_regression_loss", "subset_indices"]

