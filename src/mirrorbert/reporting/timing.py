"""Wall time per phase of a command: `PhaseTimer.phase(name)` adds the block's time to `name`, exclusive of nested
phases (so they add up to the run's wall time); `mark_main` and `pending_phase` record what comes before the
trainer's timer, which takes it over. Each open phase is an `activity` of the heartbeat. Standard library only."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

from mirrorbert.reporting.heartbeat import DOING, activity

_pending: dict[str, float] = {}  # phases recorded before a timer exists (command line), taken by the next one
_process_started: float | None = None  # perf_counter() value at process start, where it can be known


def process_age() -> float | None:
    """Seconds since this process started (interpreter start-up and imports included, from /proc: Linux only);
    None where unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22 (starttime); fields 1-2 end at ')'
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def mark_main() -> None:
    """Called first thing in the command's `main`: records the start-up (process start to `main`)."""
    global _process_started
    age = process_age()
    if age is not None:
        _process_started = time.perf_counter() - age
        _pending["startup"] = age


@contextlib.contextmanager
def pending_phase(name: str) -> Iterator[None]:
    """Time a block that runs before the trainer's timer exists (e.g. the command line reading the data)."""
    start = time.perf_counter()
    try:
        with activity(DOING.get(name, f"in phase {name}")):
            yield
    finally:
        _pending[name] = _pending.get(name, 0.0) + time.perf_counter() - start


class PhaseTimer:
    """Exclusive wall time per named phase; takes over what `mark_main`/`pending_phase` recorded."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict(_pending)
        self._before = sum(_pending.values())  # recorded before this timer existed
        _pending.clear()
        self._created = time.perf_counter()
        self._stack: list[list[float]] = []  # per open phase: [start, seconds spent in nested phases]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        frame = [time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            with activity(DOING.get(name, f"in phase {name}")):  # what the heartbeat says meanwhile
                yield
        finally:
            self._stack.pop()
            spent = time.perf_counter() - frame[0]
            self.seconds[name] = self.seconds.get(name, 0.0) + spent - frame[1]
            if self._stack:
                self._stack[-1][1] += spent

    def report(self) -> dict[str, float]:
        """Seconds per phase, plus `total` (since the process started where `mark_main` knew it, else since this
        timer was made plus the phases recorded before it) and `other` (the rest of `total`)."""
        named = sum(self.seconds.values())
        if _process_started is not None and "startup" in self.seconds:
            total = time.perf_counter() - _process_started
        else:
            total = time.perf_counter() - self._created + self._before
        out = {name: round(value, 3) for name, value in self.seconds.items()}
        out["other"] = round(max(0.0, total - named), 3)
        out["total"] = round(total, 3)
        return out


__all__ = ["PhaseTimer", "mark_main", "pending_phase", "process_age"]
