"""Progress bars that do not flood logs: tqdm as usual on a terminal, one refresh a minute elsewhere.

Why: a redirected stderr (nohup, job schedulers, CI) records every refresh as a new line, so a bar that
updates ten times a second turns into megabytes of log.
"""

from __future__ import annotations

import sys

# Seconds between refreshes when stderr is not a terminal.
NON_TTY_MININTERVAL = 60.0


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def progress_bar(iterable=None, *, show: bool = True, **kwargs):
    """`tqdm(iterable, **kwargs)`, hidden unless `show`, slowed down where stderr is not a TTY."""
    from tqdm.auto import tqdm

    if show and not _stderr_is_tty():
        kwargs.setdefault("mininterval", NON_TTY_MININTERVAL)
        kwargs.setdefault("maxinterval", NON_TTY_MININTERVAL * 10)
    return tqdm(iterable, disable=not show, **kwargs)
