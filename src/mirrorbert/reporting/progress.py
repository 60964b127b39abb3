"""Progress that is never silent: tqdm on a terminal; elsewhere one plain line through `logging` per interval
(`MIRRORBERT_PROGRESS_INTERVAL`, default 30 s) and a last line when a loop that logged finishes. Every long loop
of the package calls `progress_bar`.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator

from mirrorbert.reporting import heartbeat
from mirrorbert.reporting.heartbeat import DEFAULT_INTERVAL_S, _duration, progress_interval, say, track


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
    """A tqdm-like bar (tqdm's `total`, `initial`, `desc`, `unit`, `unit_scale`; `update`, `set_postfix`, `close`,
    iteration, `with`): tqdm on a terminal or in a notebook, `LogProgress` elsewhere, nothing unless `show`."""
    if show and not _stderr_is_tty() and not _in_notebook():
        bar = LogProgress(iterable, interval=progress_interval(), **kwargs)
    else:
        from tqdm.auto import tqdm

        bar = tqdm(iterable, disable=not show, **kwargs)
    if show:
        track(bar)  # the heartbeat speaks for it inside a long step
    return bar


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
    """Counts like tqdm and `say`s one line per `interval` seconds of the heartbeat's `clock` (checked at each
    update). The rate is the average since the bar was made (steps before `initial`, e.g. those of a resumed
    run, are not counted in it)."""

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None, initial: float = 0,
                 desc: str | None = None, unit: str = "it", unit_scale: bool = False, interval: float = DEFAULT_INTERVAL_S,
                 **_tqdm_only: Any) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.n, self.initial = iterable, total, initial, initial
        self.desc, self.unit, self.unit_scale, self.interval = desc or "progress", unit, unit_scale, interval
        self.start = self.last_line = heartbeat.clock()
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
        now = heartbeat.clock()
        if self.total and self.n >= self.total:  # the last update: `close` writes the one line of the end
            return
        if now - self.last_line >= self.interval:
            self.last_line = now
            self.lines += 1
            say(self.line(now))

    def beat(self, now: float) -> str:
        """The line for the heartbeat, inside a long step (counted as this bar's line)."""
        self.last_line = now
        self.lines += 1
        return self.line(now)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        """A last line, for a loop that logged before or ran past an interval since: a short loop stays silent."""
        if self.closed:
            return
        self.closed = True
        now = heartbeat.clock()
        if self.lines or now - self.last_line >= self.interval:
            say(self.line(now, done=True))

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


__all__ = ["LogProgress", "progress_bar"]
