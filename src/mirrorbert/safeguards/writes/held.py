"""Signals held while a write is between two states (a temporary not yet known to its clean-up, a folder set
aside before its replacement is in place)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block ends, then go to the handlers they would have gone to;
    off the main thread, where no handler runs, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
                for sig in STOP_SIGNALS if signal.getsignal(sig) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(pending):
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            else:  # the default action: what the signal would have done, now
                os.kill(os.getpid(), signum)
