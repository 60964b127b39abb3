"""The end-to-end benchmark's report arithmetic (no timing here: synthetic runs in, figures out)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from end_to_end import PHASE_LINE, summarise_size  # noqa: E402


def ours(wall: float, steps: float, load: float) -> dict:
    phases = {"startup": 0.5, "load": load, "tokenise": 0.25, "mask": 0.25, "steps": steps, "save": 0.5,
              "other": 0.0}
    phases["total"] = sum(phases.values())
    return {"wall_s": wall, "phases": phases}


def test_ratio_outside_share_and_phase_medians():
    runs = [ours(20.0, 15.0, 2.0), ours(10.0, 6.0, 1.0), ours(30.0, 21.0, 3.0)]
    peer = [{"wall_s": w, "mode": "fit"} for w in (40.0, 50.0, 45.0)]
    report = summarise_size(runs, peer)
    assert report["ratio_vs_sentence_transformers"] == pytest.approx(45.0 / 20.0, abs=1e-3)
    # median over the runs of 1 - steps / wall: 0.25, 0.4, 0.3
    assert report["outside_steps_share"] == pytest.approx(0.3, abs=1e-3)
    phases = report["mirrorbert"]["phases_s_median"]
    assert phases["load"] == pytest.approx(2.0) and phases["steps"] == pytest.approx(15.0)
    # wall minus what the phases cover: 20 - 18.5, 10 - 8.5, 30 - 25.5
    assert phases["unaccounted"] == pytest.approx(1.5)
    assert report["sentence_transformers"]["mode"] == "fit"
    assert "total" not in phases


def test_the_phase_line_is_what_train_logs():
    import inspect

    from mirrorbert import trainer

    assert PHASE_LINE.split(":")[0] in inspect.getsource(trainer)
