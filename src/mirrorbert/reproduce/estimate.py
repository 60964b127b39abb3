"""Per-cell time estimates of `mirrorbert reproduce`: this machine's measured throughput x the cell's work.

A cell's work: the texts a dry run of its evaluation encodes (:class:`CountingEncoder`) and the time of the rest;
training's steps x batch x two views. The throughput is timed with the base model on a sample of the cell's texts,
and corrected by the measured / predicted time of the cells already run (docs/design.md).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import random
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mirrorbert.search.exact import l2_normalize

logger = logging.getLogger(__name__)

#: Texts timed per calibration sample (a seeded sample of the cell's own texts).
SAMPLE = 96
#: A training step costs about three forward passes (forward + backward) per view, two views per string.
TRAIN_PASSES = 2 * 3
#: Cells whose measured / predicted time corrects the next estimates.
RECENT = 6


class CountingEncoder:
    """The evaluation encoder protocol without a model: records the texts, returns random unit vectors."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self.texts: list[str] = []

    def encode(self, texts, batch_size: int = 64, normalize: bool = False, show_progress: bool = False, **_: Any):
        texts = list(texts)
        self.texts.extend(texts)
        rng = np.random.default_rng(len(self.texts))
        vectors = rng.standard_normal((len(texts), self.dim)).astype(np.float32)
        return l2_normalize(vectors) if normalize else vectors


def dry_run(task: str, options: dict[str, Any], data_dir, batch_size: int, reference: bool) -> tuple[list[str], float]:
    """(every text the cell's evaluation encodes, seconds of the rest of it), from a run with counting encoders."""
    from mirrorbert.evaluation.runner import evaluate

    counter, before = CountingEncoder(), CountingEncoder()
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the real run says it (skipped sets and the like)
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="mirrorbert-estimate-") as plots:
            evaluate(counter, tasks=[task], data_dir=data_dir, plot_dir=Path(plots) / "plots", batch_size=batch_size,
                     task_options={task: dict(options)}, reference_encoder=before if reference else None)
    finally:
        logging.disable(previous)
    return counter.texts + before.texts, time.perf_counter() - start


def warm_up() -> None:
    """Import now what the first cells would otherwise pay for once (the trainer, the plotting library)."""
    for name in ("mirrorbert.mirror.train", "mirrorbert.evaluation.runner", "scipy.stats", "matplotlib"):
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            if name == "matplotlib":  # the backend the report and the evaluation plots use
                module.use("Agg")
                importlib.import_module("matplotlib.pyplot")


@dataclass
class Estimator:
    """Seconds per text (encoding, training) measured with the base encoder, and corrections from real cells."""

    encoder: Any
    batch_size: int
    load_s: float = 0.0  # loading a model of the base model's size
    _eval: dict[str, tuple[int, float]] = field(default_factory=dict)  # work key -> (texts, predicted s)
    _spent: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _warm: bool = False

    def _per_text(self, texts: list[str]) -> float:
        sample = texts if len(texts) <= SAMPLE else random.Random(0).sample(texts, SAMPLE)
        if not self._warm:  # the first call pays for thread pools and lazy initialisation
            self.encoder.encode(sample[:8], batch_size=self.batch_size)
            self._warm = True
        start = time.perf_counter()
        self.encoder.encode(sample, batch_size=self.batch_size)
        return (time.perf_counter() - start) / max(1, len(sample))

    def eval_prediction(self, task: str, options: dict[str, Any], data_dir, reference: bool,
                        loads: bool) -> float | None:
        """Seconds to encode what the evaluation encodes (twice with a reference model), plus a model load."""
        key = json.dumps([task, options, reference], sort_keys=True, default=str)  # key, not output
        if key not in self._eval:
            try:
                texts, other_s = dry_run(task, options, data_dir, self.batch_size, reference)
            except Exception:  # noqa: BLE001  (the real run reports it; this cell just has no estimate)
                logger.debug("no work count for %s", task, exc_info=True)
                texts, other_s = [], 0.0
            self._eval[key] = (len(texts), len(texts) * self._per_text(texts) + other_s) if texts else (0, 0.0)
        n, seconds = self._eval[key]
        return seconds + (self.load_s if loads else 0.0) if n else None

    def train_prediction(self, train_cfg) -> float:
        """Steps x batch x views x passes at the measured per-text time of the cell's training strings."""
        from mirrorbert.data.strings import strings_for_config

        key = json.dumps(["train", train_cfg.data, train_cfg.words_top, train_cfg.random_strings, train_cfg.limit,  # key, not output
                          train_cfg.column, train_cfg.max_length], default=str)
        if key not in self._eval:
            strings = strings_for_config(train_cfg).strings
            self._eval[key] = (len(strings), self._per_text(strings))
        n, per_text = self._eval[key]
        steps = train_cfg.steps or train_cfg.epochs * math.ceil(n / train_cfg.batch_size)
        return steps * train_cfg.batch_size * TRAIN_PASSES * per_text + 2 * self.load_s  # load, save

    def factor(self, kind: str) -> float:
        """Measured / predicted time of the last RECENT parts of this kind ("train:word", "eval:sts"), else of
        its family ("train", "eval"); 1 before any. A machine's load changes during a long run."""
        family = kind.split(":")[0]
        recent = (self._spent.get(kind) or self._spent.get(family) or [])[-RECENT:]
        predicted, actual = sum(p for p, _ in recent), sum(a for _, a in recent)
        return actual / predicted if predicted > 0 and actual > 0 else 1.0

    def estimate(self, parts: list[tuple[str, float]]) -> float | None:
        """Corrected seconds of a cell from its predicted parts [(kind, seconds)] (None: no part counted)."""
        return sum(self.factor(kind) * seconds for kind, seconds in parts) if parts else None

    def record(self, parts: list[tuple[str, float, float]]) -> None:
        """What a computed cell's parts took [(kind, predicted, measured)]: corrects later estimates."""
        for kind, predicted, actual in parts:
            if predicted > 0 and actual > 0:
                for key in (kind, kind.split(":")[0]):
                    self._spent.setdefault(key, []).append((predicted, actual))
