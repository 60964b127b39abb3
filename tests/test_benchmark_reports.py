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

    from mirrorbert.mirror import train as trainer

    assert PHASE_LINE.split(":")[0] in inspect.getsource(trainer)


def side(median: float, first_two: tuple[float, float], outside: float) -> dict:
    return {"median_step_s": median, "first_two_steps_s": list(first_two), "outside_steps_s": outside}


def test_compile_warm_up_and_break_even():
    from compile_speed import EPOCH_STEPS, report

    class Args:
        layers, hidden, batch_size, steps, precision, threads = 4, 512, 200, 12, "fp32", None

    eager = side(8.0, (8.5, 8.0), 10.0)
    # cold: 100 s more outside the steps, first two steps 30 s above two steady ones; 2 s saved per step
    cold = side(6.0, (24.0, 18.0), 110.0)
    warm = side(6.0, (7.0, 6.0), 15.0)  # 5 s outside + 1 s in the first steps
    result = report(eager, cold, warm, Args())
    assert result["warm_up_s_cold"] == pytest.approx(130.0)
    assert result["break_even_steps_cold"] == pytest.approx(65.0) and not result["pays_within_epoch_cold"]
    assert result["warm_up_s_warm"] == pytest.approx(6.0)
    assert result["break_even_steps_warm"] == pytest.approx(3.0) and result["pays_within_epoch_warm"]
    assert result["speedup_per_step_warm"] == pytest.approx(8.0 / 6.0, abs=1e-3) and EPOCH_STEPS == 50
    slower = report(eager, side(9.0, (9.0, 9.0), 10.0), warm, Args())
    assert slower["break_even_steps_cold"] is None and not slower["pays_within_epoch_cold"]
