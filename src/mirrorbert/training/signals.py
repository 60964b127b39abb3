"""Interrupts and preemption: Ctrl-C, SIGTERM and SIGHUP (as SIGTERM, unless ignored as under nohup).
`stop_on_signal()` covers a training command: a SIGTERM before the first step ends it at once (`SignalStop`: one
line, exit 130). `InterruptFlag` covers the loop, its checkpoints and the final save: the first signal sets a flag
every process agrees on at the next step boundary; a repeated SIGTERM, and once a stop has started any SIGTERM or
SIGHUP, changes nothing; a second Ctrl-C aborts (why: docs/design.md, "Signals and preemption").
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any, Callable, Iterable, Iterator

logger = logging.getLogger(__name__)

# Agreement codes (DistContext.agree takes their maximum over the processes): a SIGTERM seen by any
# process makes the whole job's stop a preemption.
NO_SIGNAL, SIGINT_SEEN, SIGTERM_SEEN, SIGHUP_SEEN = 0, 1, 2, 3
_CODES = {signal.SIGINT: SIGINT_SEEN, signal.SIGTERM: SIGTERM_SEEN, signal.SIGHUP: SIGHUP_SEEN}
# The signals that end a process from outside (a scheduler, a launcher, a closed terminal), as SIGTERM does.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)
# A stop was accepted in this command (`InterruptFlag`): later SIGTERMs and SIGHUPs change nothing.
_stopping = False


def signal_name(code: int) -> str | None:
    """The signal an agreement code stands for ("SIGTERM", "SIGINT", "SIGHUP"), None for no signal."""
    return {SIGINT_SEEN: "SIGINT", SIGTERM_SEEN: "SIGTERM", SIGHUP_SEEN: "SIGHUP"}.get(code)


def install(signals: Iterable[int], handler: Callable[[int, Any], Any]) -> dict[int, Any]:
    """`handler` for each of `signals` that this process does not ignore (nohup's SIGHUP stays ignored); returns
    the handlers it replaced for `restore`, none off the main thread (an embedding application's are left)."""
    previous = {}
    with contextlib.suppress(ValueError):  # not the main thread
        for sig in signals:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
    return previous


def restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class SignalStop(BaseException):
    """A SIGTERM (or SIGHUP) outside the training loop: the command ends at once. A BaseException like
    KeyboardInterrupt, so that `except Exception` clean-ups do not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signal() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise `SignalStop` (in the main thread; elsewhere nothing changes),
    unless a stop is already under way (the training loop accepted a signal): then they are ignored."""
    global _stopping

    def handler(signum, frame):
        if _stopping:
            logger.warning("%s received: ignored, the run is already stopping", signal.Signals(signum).name)
            return
        raise SignalStop(signum)

    _stopping = False
    previous = install(TERMINATING, handler)
    try:
        yield
    finally:
        restore(previous)


class InterruptFlag:
    """Turns Ctrl-C, SIGTERM (how job schedulers preempt) and SIGHUP (a closed terminal) into a flag the
    training loop checks between steps, so it can checkpoint and exit."""

    SIGNALS = (signal.SIGINT, *TERMINATING)

    def __init__(self, doing: str = "finishing this step, writing a checkpoint, then stopping"):
        self.doing = doing  # what the warning on the first signal says happens next
        self.raised = False
        self.signal: int | None = None
        self.repeats = 0
        self._previous: dict[int, Any] = {}

    @property
    def code(self) -> int:
        """This process's agreement code: NO_SIGNAL, SIGINT_SEEN, SIGTERM_SEEN or SIGHUP_SEEN (the strongest
        seen)."""
        return _CODES.get(self.signal, SIGINT_SEEN) if self.raised else NO_SIGNAL

    def handle(self, signum: int) -> None:
        """What the signal handler does (callable directly in tests)."""
        global _stopping
        _stopping = True
        if self.raised:
            if signum == signal.SIGINT:  # Ctrl-C twice: the person wants out now
                raise KeyboardInterrupt
            self.repeats += 1
            if self.repeats == 1:
                logger.warning("%s received again: ignored (%s)", signal.Signals(signum).name, self.doing)
            if _CODES.get(signum, 0) > _CODES.get(self.signal, 0):  # a SIGTERM after a Ctrl-C: still a preemption
                self.signal = signum
            return
        self.raised, self.signal = True, signum
        logger.warning("%s received: %s", signal.Signals(signum).name, self.doing)

    def __enter__(self):
        self._previous = install(self.SIGNALS, lambda signum, frame: self.handle(signum))
        return self

    def __exit__(self, *exc):
        restore(self._previous)
        self._previous = {}
        return False
