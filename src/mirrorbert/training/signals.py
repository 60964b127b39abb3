"""Interrupts and preemption: Ctrl-C and SIGTERM become a flag the training loop checks between steps."""

from __future__ import annotations

import logging
import signal
from typing import Any

logger = logging.getLogger(__name__)


class InterruptFlag:
    """Turns Ctrl-C and SIGTERM (how job schedulers preempt) into a flag the training loop checks
    between steps, so it can checkpoint and exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.raised = False
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        def handler(signum, frame):
            if self.raised:  # a second signal aborts at once
                raise KeyboardInterrupt
            self.raised, self.signal = True, signum
            logger.warning("%s received: finishing this step, writing a checkpoint, then stopping",
                           signal.Signals(signum).name)

        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not in the main thread: leave default behaviour
                pass
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
        return False
