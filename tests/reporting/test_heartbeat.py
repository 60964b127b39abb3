"""A line at least every interval while a command runs (reporting/heartbeat.py, scripts/heartbeat.sh)."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from mirrorbert.reporting import heartbeat, progress
from mirrorbert.reporting.heartbeat import Heartbeat, activity, beating
from mirrorbert.reporting.progress import LogProgress, progress_bar
from mirrorbert.reporting.timing import PhaseTimer
from support import write_stsb

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_beat(monkeypatch):
    """A heartbeat on a clock that moves only when told (its phases note when they opened on it), and its lines."""
    clock, lines = FakeClock(), []
    monkeypatch.setattr(heartbeat, "clock", clock)
    return Heartbeat("running eval", interval=30, emit=lines.append), clock, lines


def test_a_silent_phase_is_named_once_per_interval(fake_beat):
    beat, clock, lines = fake_beat
    timer = PhaseTimer()
    with timer.phase("load"):
        clock.now += 29
        beat.beat()
        assert lines == []  # not due yet
        clock.now += 1
        beat.beat()
        clock.now += 10
        beat.beat()  # 10 s after the heartbeat's own line: not due
    assert lines == ["still loading the model: 30s"]
    with activity("building the offline reference corpus"):
        clock.now += 30
        beat.beat()
    assert lines[1] == "still building the offline reference corpus: 30s"


def test_a_line_written_by_anyone_resets_the_wait_and_is_quoted_when_nothing_is_open(fake_beat):
    beat, clock, lines = fake_beat
    clock.now += 20
    beat.written("loading /models/x")
    clock.now += 20
    beat.beat()
    assert lines == []  # 20 s since the last line
    clock.now += 10
    beat.beat()
    assert lines == ["still running eval: 50s; the last line, 30s ago: loading /models/x"]
    clock.now += 30
    beat.written(lines[-1])  # its own line, seen by the root logger's witness, is not quoted back
    beat.beat()
    clock.now += 30
    beat.beat()
    assert lines[-1] == "still running eval: 1m50s; the last line, 1m30s ago: loading /models/x"


def test_inside_a_long_step_the_open_bar_speaks_and_counts_it_as_its_line(fake_beat, monkeypatch):
    beat, clock, lines = fake_beat
    bar_lines = []
    monkeypatch.setattr(progress, "say", bar_lines.append)  # the bar's own lines; the heartbeat's go to `lines`
    with beating("running train", interval=3600):  # tracks the bars; its own thread stays quiet
        bar = LogProgress(total=10, desc="train", unit="step", interval=30)
        heartbeat.track(bar)
        clock.now += 10
        bar.update(1)
        clock.now += 25  # the second step takes long: no update for 25 s
        beat.beat()
        assert lines == ["train: 1/10 steps (10%), 0.0286 step/s, ETA 5m15s, elapsed 35s"]
        timer = PhaseTimer()
        with timer.phase("checkpoint"):  # a phase within the bar's loop: named, with the bar's line
            clock.now += 30
            beat.beat()
        assert lines[-1].startswith("still writing a checkpoint: 30s; train: 1/10 steps (10%)")
        clock.now += 5
        bar.update(1)  # 5 s after the heartbeat wrote its line: the bar waits for its own interval
        assert bar_lines == []
        bar.close()  # a bar that spoke (through the heartbeat) writes its last line
        assert bar_lines and bar_lines[-1].startswith("train: 2/10 steps")
        clock.now += 30
        beat.beat()
    assert lines[-1].startswith("still running eval: ")  # the closed bar is no longer spoken for


def test_a_phase_open_under_a_second_within_a_bar_gives_only_the_bar_line(fake_beat, monkeypatch):
    beat, clock, lines = fake_beat
    monkeypatch.setattr(progress, "say", lambda line: None)
    with beating("running train", interval=3600):
        bar = LogProgress(total=47, desc="mirror", unit="step", interval=30)
        heartbeat.track(bar)
        clock.now += 30
        with activity("masking a batch"):
            clock.now += 0.5
            beat.beat()
            assert lines[-1].startswith("mirror: 0/47 steps")  # a phase of half a second is noise
            clock.now += 30
            beat.beat()
            assert lines[-1].startswith("still masking a batch: 30s; mirror: 0/47 steps")
        bar.close()
    clock.now += 30
    with activity("masking a batch"):  # no bar: the phase is named however short
        clock.now += 0.5
        beat.beat()
    assert lines[-1] == "still masking a batch: 0s"


def test_a_tqdm_bar_on_a_terminal_is_redrawn_not_written_across(fake_beat):
    class Bar:
        desc, disable, refreshed = "encode", False, 0

        def refresh(self):
            self.refreshed += 1

    beat, clock, lines = fake_beat
    bar = Bar()
    with beating("running encode", interval=3600):
        heartbeat.track(bar)
        clock.now += 30
        beat.beat()
    assert bar.refreshed == 1 and lines == []


def test_no_heartbeat_without_progress_and_only_one_at_a_time():
    with beating("running encode", show=False) as beat:
        assert beat is None
        assert progress_bar(total=2, show=True) is not None  # nothing tracked, nothing started
    with beating("outer", interval=3600) as outer, beating("inner", interval=3600) as inner:
        assert outer is not None and inner is None
    assert not [t for t in __import__("threading").enumerate() if t.name == "mirrorbert-heartbeat"]


def _gaps(records, started, ended):
    times = [started] + sorted(r.created for r in records) + [ended]
    return [b - a for a, b in zip(times, times[1:])]


@pytest.fixture
def slow_interval(monkeypatch):
    monkeypatch.setenv("MIRRORBERT_PROGRESS_INTERVAL", "0.5")
    return 0.5


def test_a_slowed_train_writes_a_line_at_least_every_interval(tiny_bert, strings_file, tmp_path, monkeypatch, caplog,
                                                            slow_interval):
    """Each step sleeps four intervals: the heartbeat's lines fill the wait (margin: 1 s for a busy machine,
    below the 2 s a step is silent without them)."""
    from mirrorbert.cli.app import main
    from mirrorbert.mirror.step import MirrorMethod

    step = MirrorMethod.train_step

    def slow_step(self, batch, engine):
        time.sleep(4 * slow_interval)
        return step(self, batch, engine)

    monkeypatch.setattr(MirrorMethod, "train_step", slow_step)
    caplog.set_level(logging.INFO)
    started = time.time()
    assert main(["train", "--model", str(tiny_bert), "--data", str(strings_file), "--output", str(tmp_path / "m"),
                 "--steps", "2", "--batch-size", "4", "--max-length", "16", "--device", "cpu"]) == 0
    gaps = _gaps(caplog.records, started, time.time())
    assert max(gaps) < slow_interval + 1.0, gaps
    beats = [r.getMessage() for r in caplog.records if r.name == "mirrorbert.progress"]
    assert any(line.startswith("still training: ") and "/2 steps" in line for line in beats), beats


def test_a_slowed_eval_writes_a_line_at_least_every_interval(tiny_bert, tmp_path, monkeypatch, caplog, slow_interval):
    from mirrorbert.cli.app import main
    from mirrorbert.encoder.model import Encoder

    encode = Encoder.encode

    def slow_encode(self, *args, **kwargs):
        time.sleep(4 * slow_interval)
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "encode", slow_encode)
    write_stsb(tmp_path / "data")
    caplog.set_level(logging.INFO)
    started = time.time()
    assert main(["eval", "--model", str(tiny_bert), "--tasks", "sts", "--sts-sets", "stsb", "--data-dir",
                 str(tmp_path / "data"), "--output", str(tmp_path / "r.json"), "--device", "cpu"]) == 0
    gaps = _gaps(caplog.records, started, time.time())
    assert max(gaps) < slow_interval + 1.0, gaps
    assert any(r.getMessage().startswith("still ") for r in caplog.records if r.name == "mirrorbert.progress")


def test_the_set_up_scripts_heartbeat_names_what_it_waits_for(tmp_path):
    """scripts/heartbeat.sh: a command that is silent for two seconds gets lines at the interval (0.5 s here)."""
    script = f'. "{REPO}/scripts/heartbeat.sh"; heartbeat_run "installing the test extras" sleep 2; echo "rc=$?"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MIRRORBERT_PROGRESS_INTERVAL": "0.5"})
    assert done.stdout.strip() == "rc=0"
    beats = [line for line in done.stderr.splitlines() if "still installing the test extras" in line]
    assert len(beats) >= 2, done.stderr
    failed = subprocess.run(["bash", "-c", f'. "{REPO}/scripts/heartbeat.sh"; heartbeat_run "x" false; echo "rc=$?"'],
                            capture_output=True, text=True, timeout=60)
    assert failed.stdout.strip() == "rc=1"  # the command's status, not the heartbeat's
