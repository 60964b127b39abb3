"""Progress that is never silent: tqdm on a terminal; elsewhere one plain line through `logging` per interval.

Why: a redirected stderr (nohup, `tail -f` of a log, job schedulers, CI) records every tqdm refresh as a new
line, so a bar either floods the log or, slowed down, leaves minutes without a word. Off a terminal each loop
therefore logs `desc: step/total unit (pct), rate, ETA, elapsed` every `MIRRORBERT_PROGRESS_INTERVAL`
seconds (default 30), and a last line when a loop that logged finishes. Every long loop of the package calls
`progress_bar`, so this one module decides how progress looks everywhere.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator

from mirrorbert.errors import UserError

logger = logging.getLogger("mirrorbert.progress")

INTERVAL_ENV = "MIRRORBERT_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 30.0


def progress_interval() -> float:
    """Seconds between progress lines off a terminal: `MIRRORBERT_PROGRESS_INTERVAL`, else 30."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UserError(f"{INTERVAL_ENV}={raw!r}: expected a number of seconds > 0, e.g. 30")
    return value


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def _in_notebook() -> bool:
    """A Jupyter kernel: stderr is no terminal there, but tqdm.auto draws a widget."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:  # an IPython too old or half-imported: not a notebook we can draw in
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def progress_bar(iterable: Iterable | None = None, *, show: bool = True, **kwargs: Any):
    """A tqdm-like bar: tqdm on a terminal or in a notebook, `LogProgress` elsewhere, nothing unless `show`.

    Takes tqdm's `total`, `initial`, `desc`, `unit`, `unit_scale`; gives `update`, `set_postfix`, `close`,
    iteration and `with`.
    """
    if show and not _stderr_is_tty() and not _in_notebook():
        return LogProgress(iterable, interval=progress_interval(), **kwargs)
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not show, **kwargs)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _amount(value: float, scale: bool) -> str:
    if not scale:
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"
    for prefix in ("", "k", "M", "G", "T"):
        if abs(value) < 1000:
            return f"{value:.3g}{prefix}"
        value /= 1000
    return f"{value:.3g}P"


def _plural(unit: str) -> str:
    """`step` -> `steps`, `batch` -> `batches`; symbols (`B`, `it`) as they are."""
    if len(unit) < 3 or not unit.isalpha():
        return unit
    return unit + ("es" if unit.endswith(("ch", "sh", "s", "x")) else "s")


class LogProgress:
    """Counts like tqdm and logs one line per `interval` seconds of `clock` (checked at each update).

    The rate is the average since the bar was made (steps before `initial`, e.g. those of a resumed run,
    are not counted in it), so a line reads the same whatever the interval.
    """

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None, initial: float = 0,
                 desc: str | None = None, unit: str = "it", unit_scale: bool = False, interval: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, emit: Callable[[str], None] | None = None,
                 **_tqdm_only: Any) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.n, self.initial = iterable, total, initial, initial
        self.desc, self.unit, self.unit_scale = desc or "progress", unit, unit_scale
        self.interval, self.clock, self.emit = interval, clock, emit or _log_line
        self.start = self.last_line = clock()
        self.lines, self.postfix, self.closed = 0, "", False

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("LogProgress without an iterable is updated, not iterated")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> "LogProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last_line >= self.interval:
            self.last_line = now
            self.lines += 1
            self.emit(self.line(now))

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or self.desc

    def close(self) -> None:
        """A last line, only for a loop that logged before: a short loop stays silent."""
        if self.closed:
            return
        self.closed = True
        if self.lines:
            self.emit(self.line(self.clock(), done=True))

    def line(self, now: float, done: bool = False) -> str:
        elapsed = max(now - self.start, 0.0)
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        unit, scale = self.unit, self.unit_scale
        count = _amount(self.n, scale) + (f"/{_amount(self.total, scale)}" if self.total else "")
        parts = [f"{self.desc}: {count} {_plural(unit)}" + (f" ({100 * self.n / self.total:.0f}%)" if self.total else "")]
        parts.append(f"{_amount(rate, True) if scale else f'{rate:.3g}'} {unit}/s")
        if done:
            parts.append(f"done in {_duration(elapsed)}")
        else:
            if self.total and rate > 0:
                parts.append(f"ETA {_duration(max(self.total - self.n, 0) / rate)}")
            parts.append(f"elapsed {_duration(elapsed)}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)


def _log_line(line: str) -> None:
    """Through `logging` (the CLI's handler puts a time in front); straight to stderr where nothing is set up,
    so a script run under nohup still shows its progress."""
    if logger.hasHandlers():
        logger.info(line)
    else:
        print(line, file=sys.stderr, flush=True)
