"""Progress off a terminal: one plain line per interval with step/total, rate and ETA (reporting/progress.py)."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from mirrorbert.errors import UserError
from mirrorbert.reporting import heartbeat, progress
from mirrorbert.reporting.progress import LogProgress, progress_bar, progress_interval


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake(monkeypatch):
    """The bars' clock, moving only when told, and the lines they say."""
    clock, lines = FakeClock(), []
    monkeypatch.setattr(heartbeat, "clock", clock)
    monkeypatch.setattr(progress, "say", lines.append)
    return clock, lines


def test_a_line_every_interval_with_step_rate_and_eta(fake):
    clock, lines = fake
    bar = LogProgress(total=100, desc="mirror", unit="step", interval=30)
    for _ in range(100):
        clock.now += 2.0  # 0.5 step/s
        bar.update(1)
        bar.set_postfix({"loss": "0.1234"}, refresh=False)
    bar.close()
    # a line at 30, 60, ... 180 s (steps 15, 30, ... 90) and one when the loop ends at 200 s
    assert len(lines) == 7, lines
    assert lines[0] == "mirror: 15/100 steps (15%), 0.5 step/s, ETA 2m50s, elapsed 30s, loss=0.1234"
    assert lines[1] == "mirror: 30/100 steps (30%), 0.5 step/s, ETA 2m20s, elapsed 1m00s, loss=0.1234"
    steps = [int(re.match(r"mirror: (\d+)/100", line).group(1)) for line in lines]
    assert steps == [15, 30, 45, 60, 75, 90, 100]
    assert lines[-1] == "mirror: 100/100 steps (100%), 0.5 step/s, done in 3m20s, loss=0.1234"


def test_the_interval_is_wall_time_not_updates(fake):
    """Slow steps (60 s each, interval 30): a line at every step; a burst of fast ones: one line per interval."""
    clock, lines = fake
    bar = LogProgress(total=10, desc="t", interval=30)
    for _ in range(3):
        clock.now += 60
        bar.update()
    assert len(lines) == 3
    for _ in range(1000):
        clock.now += 0.01
        bar.update()
    assert len(lines) == 3  # 10 s of updates: no line yet


def test_a_short_loop_stays_silent_and_a_resumed_one_counts_its_rate_from_the_resume(fake):
    clock, lines = fake
    with LogProgress(total=5, interval=30) as bar:
        for _ in range(5):
            clock.now += 1
            bar.update()
    assert lines == []  # under one interval: no line, not even at the end
    bar = LogProgress(total=300, initial=200, desc="mirror", unit="step", interval=30)
    clock.now += 30
    bar.update(60)  # 60 steps in 30 s since the resume: 2 step/s, 40 left
    assert lines == ["mirror: 260/300 steps (87%), 2 step/s, ETA 20s, elapsed 30s"]


def test_iterating_and_scaled_units_without_a_total(fake):
    clock, lines = fake

    def chunks():
        for _ in range(4):
            clock.now += 20
            yield 1

    assert list(LogProgress(chunks(), desc="corpus wiki", unit="line", interval=30)) == [1, 1, 1, 1]
    assert lines == ["corpus wiki: 2 lines, 0.05 line/s, elapsed 40s", "corpus wiki: 4 lines, 0.05 line/s, elapsed 1m20s",
                     "corpus wiki: 4 lines, 0.05 line/s, done in 1m20s"]
    lines.clear()
    bar = LogProgress(total=4_000_000, unit="B", unit_scale=True, desc="tokenising corpus", interval=30)
    clock.now += 40
    bar.update(1_500_000)
    assert lines == ["tokenising corpus: 1.5M/4M B (38%), 37.5k B/s, ETA 1m07s, elapsed 40s"]


def test_progress_bar_picks_tqdm_on_a_terminal_and_lines_elsewhere(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(progress_bar(total=3, desc="x"), LogProgress)
    assert not isinstance(progress_bar(total=3, show=False), LogProgress)  # --no-progress: nothing at all
    monkeypatch.setattr(sys, "stderr", Tty())
    from tqdm.auto import tqdm

    bar = progress_bar(total=3, desc="x")
    assert isinstance(bar, tqdm) and not isinstance(bar, LogProgress)
    bar.close()


def test_lines_go_through_logging_or_straight_to_stderr(monkeypatch, caplog):
    clock = FakeClock()
    monkeypatch.setattr(heartbeat, "clock", clock)
    with caplog.at_level(logging.INFO, logger="mirrorbert.progress"):
        bar = LogProgress(total=3, desc="enc", interval=1)
        clock.now += 1
        bar.update()
    assert [r.getMessage() for r in caplog.records if r.name == "mirrorbert.progress"] == \
        ["enc: 1/3 it (33%), 1 it/s, ETA 2s, elapsed 1s"]
    # a script that set up no logging still sees its progress (as a nohup'ed tqdm did)
    monkeypatch.setattr(heartbeat.logger, "hasHandlers", lambda: False)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    clock.now += 1
    bar.update()
    assert err.getvalue() == "enc: 2/3 it (67%), 1 it/s, ETA 1s, elapsed 2s\n"


def test_the_end_is_one_line_with_the_last_steps_postfix(fake):
    """The last update leaves the line to `close`: one 100% line, with what the last step set (not two 100%
    lines, the first showing the step before's loss); a loop of one long step still says it is done."""
    clock, lines = fake
    bar = LogProgress(total=2, desc="mirror", unit="step", interval=30)
    for loss in ("1.2000", "1.1000"):
        clock.now += 40
        bar.set_postfix({"loss": loss}, refresh=False)
        bar.update(1)
    bar.close()
    assert lines == ["mirror: 1/2 steps (50%), 0.025 step/s, ETA 40s, elapsed 40s, loss=1.2000",
                     "mirror: 2/2 steps (100%), 0.025 step/s, done in 1m20s, loss=1.1000"]
    lines.clear()
    one = LogProgress(total=1, desc="save", interval=30)
    clock.now += 60
    one.update(1)
    one.close()
    assert lines == ["save: 1/1 it (100%), 0.0167 it/s, done in 1m00s"]


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan"])
def test_a_bad_interval_is_one_clear_error(monkeypatch, value):
    monkeypatch.setenv("MIRRORBERT_PROGRESS_INTERVAL", value)
    with pytest.raises(UserError, match="MIRRORBERT_PROGRESS_INTERVAL=.*expected a number of seconds > 0"):
        progress_interval()


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("MIRRORBERT_PROGRESS_INTERVAL", raising=False)
    assert progress_interval() == 30.0
    monkeypatch.setenv("MIRRORBERT_PROGRESS_INTERVAL", "0.5")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_bar(total=1).interval == 0.5
