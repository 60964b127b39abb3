"""Phase timings of `train` (reporting/timing.py) and the start-up cost of the command line."""

from __future__ import annotations

import json

import pytest

from mirrorbert.reporting import timing as phases
from support import heavy_modules_after as _modules_after


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nested_phases_count_exclusive_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(phases.time, "perf_counter", clock)
    monkeypatch.setattr(phases, "_pending", {})
    timer = phases.PhaseTimer()
    with timer.phase("steps"):
        clock.now += 2.0
        with timer.phase("mask"):
            clock.now += 0.5
        clock.now += 1.0
        with timer.phase("mask"):
            clock.now += 0.25
    clock.now += 0.125  # outside any phase
    report = timer.report()
    assert report["steps"] == pytest.approx(3.0)
    assert report["mask"] == pytest.approx(0.75)
    assert report["other"] == pytest.approx(0.125)
    assert report["total"] == pytest.approx(3.875)


def test_pending_phases_go_to_the_next_timer_only(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(phases.time, "perf_counter", clock)
    monkeypatch.setattr(phases, "_pending", {})
    with phases.pending_phase("data"):
        clock.now += 1.5
    first = phases.PhaseTimer()
    clock.now += 0.5
    assert first.report()["data"] == pytest.approx(1.5)
    assert first.report()["total"] == pytest.approx(2.0)
    assert "data" not in phases.PhaseTimer().report()


def test_process_age_is_plausible():
    age = phases.process_age()
    if age is None:
        pytest.skip("no /proc on this system")
    assert 0 <= age < 24 * 3600


def test_train_records_phase_timings(tiny_bert, corpus, tmp_path, caplog):
    import logging

    from mirrorbert.mirror.config import resolve_config
    from mirrorbert.mirror.train import train

    data = tmp_path / "data.txt"
    data.write_text("\n".join(corpus * 2) + "\n", encoding="utf-8")
    cfg = resolve_config({"model": str(tiny_bert), "data": str(data), "output": str(tmp_path / "out"),
                          "preset": "sentence", "batch_size": 8, "epochs": 2, "show_progress": False})
    with caplog.at_level(logging.DEBUG, logger="mirrorbert.mirror.train"):
        result = train(cfg)
    timings = result.info["timings"]
    for name in ("load", "tokenise", "mask", "steps", "save", "other", "total"):
        assert timings[name] >= 0, name
    named = sum(v for k, v in timings.items() if k not in ("other", "total"))
    assert named + timings["other"] == pytest.approx(timings["total"], abs=0.01)
    written = json.loads((tmp_path / "out" / "mirrorbert.json").read_text())["training"]["timings"]
    assert "steps" in written and "save" not in written  # the file is written by the save it would time
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase timings")]
    assert logged and json.loads(logged[-1].split(": ", 1)[1]) == timings


def test_help_imports_nothing_heavy():
    code = ("from mirrorbert.cli.app import main\n"
            "for argv in (['--help'], ['train', '--help'], ['eval', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n")
    assert _modules_after(code) == []


def test_a_bad_data_file_is_reported_before_torch_is_imported(tmp_path):
    code = ("from mirrorbert.cli.app import main\n"
            f"status = main(['train', '--data', {str(tmp_path / 'missing.txt')!r}, '--output', "
            f"{str(tmp_path / 'out')!r}])\n"
            "assert status == 2, status\n")
    assert _modules_after(code) == []
