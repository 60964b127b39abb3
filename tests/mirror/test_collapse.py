"""The collapse check after training: one warning line with cause and fix, and the numbers recorded."""

from __future__ import annotations

import json
import logging

import numpy as np

from mirrorbert.mirror.collapse import check_collapse, collapse_advice, mean_pairwise_cosine


class ConstantEncoder:
    """Every string gets (almost) the same vector: a collapsed space."""

    def __init__(self, spread: float):
        self.rng, self.spread = np.random.default_rng(0), spread

    def encode(self, texts):
        base = np.ones((len(texts), 16), np.float32)
        return base + self.spread * self.rng.normal(size=base.shape).astype(np.float32)


def test_mean_pairwise_cosine_against_a_loop():
    v = np.random.default_rng(1).normal(size=(7, 5))
    u = v / np.linalg.norm(v, axis=1, keepdims=True)
    expected = np.mean([u[i] @ u[j] for i in range(7) for j in range(7) if i != j])
    assert abs(mean_pairwise_cosine(v) - expected) < 1e-12


def test_collapsed_space_warns_once_with_cause_and_fix(caplog):
    strings = [f"string {i}" for i in range(100)]
    with caplog.at_level(logging.WARNING):
        report = check_collapse(ConstantEncoder(1e-3), strings, first_loss=5.0, last_loss=1.0, steps=50)
    assert report["collapsed"] and report["mean_pairwise_cosine"] > 0.99 and report["sample"] == 64
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "collapsed" in lines[0] and "--lr" in lines[0]


def test_collapse_advice_points_the_way_the_quickstart_fixed_it(caplog):
    """A small MLM at the paper's 2e-5 collapses and is fixed by a higher lr (the quickstart's 5e-4), not a lower."""
    strings = [f"string {i}" for i in range(10)]
    with caplog.at_level(logging.WARNING):
        check_collapse(ConstantEncoder(1e-3), strings, first_loss=5.0, last_loss=1.0, steps=50,
                       advice=collapse_advice(2e-5, 11_000_000, "mean"))
    line = caplog.records[-1].getMessage()
    assert "a higher --lr" in line and "--lr 0.0005" in line and "11M parameters" in line and "lower" not in line
    assert "higher --lr" in collapse_advice(1e-4, 11_000_000)
    assert "lower --lr" in collapse_advice(1e-3, 110_000_000)  # far above the paper's lr on a BERT-base size
    small_at_5e4 = collapse_advice(5e-4, 11_000_000)  # the quickstart's setting: the MLM is the limit, not the lr
    assert "higher" not in small_at_5e4 and "lower" not in small_at_5e4 and "longer pre-trained" in small_at_5e4
    assert "higher" not in collapse_advice(2e-5, 110_000_000) and "lower" not in collapse_advice(2e-5, 110_000_000)
    assert "--pooling mean" in collapse_advice(2e-5, 110_000_000, "cls")


def test_an_already_tuned_small_encoder_is_not_told_to_raise_the_lr():
    """MiniLM-size (22M parameters) and already a sentence encoder: a higher lr is the wrong advice there."""
    for lr in (2e-5, 1e-4, None):
        advice = collapse_advice(lr, 22_000_000, "mean", raw_mlm=False)
        assert "a lower --lr" in advice and "higher --lr" not in advice and "5e-4" not in advice
    assert "--lr 0.0005" in collapse_advice(2e-5, 22_000_000, "mean", raw_mlm=True)


def test_healthy_space_is_quiet_and_a_stuck_loss_is_named(caplog):
    strings = [f"string {i}" for i in range(20)]
    with caplog.at_level(logging.WARNING):
        report = check_collapse(ConstantEncoder(10.0), strings, first_loss=5.0, last_loss=1.0, steps=50)
    assert not report["collapsed"] and not report["loss_stuck"] and not caplog.records
    with caplog.at_level(logging.WARNING):
        report = check_collapse(ConstantEncoder(10.0), strings, first_loss=5.0, last_loss=4.99, steps=50)
    assert report["loss_stuck"] and "did not fall" in caplog.records[-1].getMessage()


def test_training_records_the_check(tiny_bert, tmp_path, corpus):
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mirror.train import train

    data = tmp_path / "s.txt"
    data.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    train(TrainConfig(model=str(tiny_bert), data=str(data), output=str(tmp_path / "m"), batch_size=4, steps=2,
                      show_progress=False, pooling="mean"))
    record = json.loads((tmp_path / "m" / "mirrorbert.json").read_text())["training"]["collapse"]
    assert 0 < record["sample"] <= len(corpus) and -1 <= record["mean_pairwise_cosine"] <= 1
