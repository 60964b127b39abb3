"""A line at least every interval while a command runs, whatever it is doing (`beating`): after
`MIRRORBERT_PROGRESS_INTERVAL` seconds (default 30) without any line, `Heartbeat.line` is written. Standard library
only: the command line imports this module."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from mirrorbert.errors import UserError

logger = logging.getLogger("mirrorbert.progress")

INTERVAL_ENV = "MIRRORBERT_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 30.0

# What a phase of `PhaseTimer` (reporting/timing.py) is doing, in the heartbeat's words.
DOING = {"startup": "starting", "data": "reading the data", "compile": "compiling the model",
         "load": "loading the model", "tokenise": "tokenising", "eval": "evaluating", "steps": "training",
         "mask": "masking a batch", "checkpoint": "writing a checkpoint", "save": "saving the model"}


def progress_interval() -> float:
    """Seconds between progress lines off a terminal, and at most between any two lines of a command:
    `MIRRORBERT_PROGRESS_INTERVAL`, else 30."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UserError(f"{INTERVAL_ENV}={raw!r}: expected a number of seconds > 0, e.g. 30")
    return value


@dataclass(eq=False)
class _Open:
    """A phase or progress bar that is open now."""

    what: str
    started: float = field(default_factory=lambda: clock())
    bar: Any = None


clock: Callable[[], float] = time.monotonic  # of the phases and the heartbeat (a test's fake clock replaces it)
_open: list[_Open] = []  # newest last; entered and left by any thread, changed under _lock
_lock = threading.Lock()
_beat: "Heartbeat | None" = None  # the running heartbeat, while a command runs


@contextlib.contextmanager
def activity(what: str) -> Iterator[None]:
    """Mark a phase (`what` as the heartbeat says it: "loading the model") open for the block."""
    entry = _Open(what)
    with _lock:
        _open.append(entry)
    try:
        yield
    finally:
        with _lock:
            _open.remove(entry)


def track(bar: Any) -> None:
    """A progress bar the heartbeat may speak for until it is closed (a `LogProgress` or a tqdm bar)."""
    if _beat is not None:
        with _lock:
            _open[:] = [entry for entry in _open if not _closed(entry.bar)]
            _open.append(_Open(getattr(bar, "desc", None) or "progress", bar=bar))


def _closed(bar: Any) -> bool:
    return bar is not None and bool(getattr(bar, "closed", False) or getattr(bar, "disable", False))


def say(line: str) -> None:
    """Write a progress line: through `logging` (the command line's handler puts a time in front); straight to
    stderr where nothing is set up, so a script run under nohup still shows its progress."""
    if _logging_set_up():
        logger.info(line)
    else:
        print(line, file=sys.stderr, flush=True)
        if _beat is not None:
            _beat.written(line)


def _logging_set_up() -> bool:
    """`logger.hasHandlers()`, not counting the heartbeat's own witness."""
    if not logger.hasHandlers():
        return False
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(handler, _Witness) for handler in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class _Witness(logging.Handler):
    """On the root logger while a heartbeat runs: every record its handlers get counts as a line written."""

    def __init__(self, beat: "Heartbeat") -> None:
        super().__init__(logging.NOTSET)
        self.beat = beat

    def emit(self, record: logging.LogRecord) -> None:
        self.beat.written(record.getMessage())


class Heartbeat:
    """Writes `line()` whenever `interval` seconds passed without a line (see the module's doc)."""

    def __init__(self, what: str, *, interval: float, emit: Callable[[str], None] = say) -> None:
        self.what, self.interval, self.emit = what, interval, emit
        self.started = self.last_line = self.last_other = clock()
        self.last_message, self.own_line = "", None

    def written(self, message: str) -> None:
        """A line was written (`message`: what it said)."""
        self.last_line = clock()
        if message != self.own_line:
            self.last_other, self.last_message = self.last_line, message

    def due(self) -> float:
        """Seconds until a line is due (0 or less: now)."""
        return self.last_line + self.interval - clock()

    def beat(self) -> None:
        """Write what is known now, if a line is due."""
        if self.due() > 0:
            return
        now = clock()
        self.own_line = line = self.line(now)
        self.last_line = now
        if line is not None:
            self.emit(line)

    def line(self, now: float) -> str | None:
        """The newest open phase (before the open bar's line, unless it has run under a second), the open bar's
        line, or the last line said; None after redrawing a tqdm bar."""
        with _lock:
            entries = [entry for entry in _open if not _closed(entry.bar)]
        bars = [entry.bar for entry in entries if entry.bar is not None]
        if bars and not hasattr(bars[-1], "beat"):  # tqdm on a terminal: redrawn (its elapsed time moves)
            bars[-1].refresh()
            return None
        bar_line = bars[-1].beat(now) if bars else None  # a LogProgress's own line, as of now
        entry = entries[-1] if entries else None
        if entry is not None and entry.bar is None and (not bar_line or now - entry.started >= 1):
            phase = f"still {entry.what}: {_duration(now - entry.started)}"
            return f"{phase}; {bar_line}" if bar_line else phase
        if bar_line:
            return bar_line
        said = f"; the last line, {_duration(now - self.last_other)} ago: {self.last_message[:120]}" \
            if self.last_message else ""
        return f"still {self.what}: {_duration(now - self.started)}{said}"


@contextlib.contextmanager
def beating(what: str, *, show: bool = True, interval: float | None = None) -> Iterator[Heartbeat | None]:
    """Within the block, a line at least every `interval` seconds (default: `MIRRORBERT_PROGRESS_INTERVAL`,
    else 30) from a daemon thread; nothing when `show` is false (`--no-progress`) or one already runs."""
    global _beat
    if not show or _beat is not None:
        yield None
        return
    beat, stop = Heartbeat(what, interval=interval or progress_interval()), threading.Event()
    witness, root = _Witness(beat), logging.getLogger()
    root.addHandler(witness)
    _beat = beat

    def run() -> None:
        while not stop.wait(max(beat.due(), 0.01)):
            try:
                beat.beat()
            except Exception as exc:  # a bar closed under it, a stream gone: the command goes on
                logger.debug("heartbeat: %s", exc)

    thread = threading.Thread(target=run, name="mirrorbert-heartbeat", daemon=True)
    thread.start()
    try:
        yield beat
    finally:
        stop.set()
        thread.join(timeout=5)
        _beat = None
        root.removeHandler(witness)
        with _lock:  # bars are tracked while a heartbeat runs
            _open[:] = [entry for entry in _open if entry.bar is None]


__all__ = ["DEFAULT_INTERVAL_S", "DOING", "Heartbeat", "INTERVAL_ENV", "activity", "beating", "progress_interval", "say",
           "track"]
