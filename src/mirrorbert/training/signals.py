"""Interrupts and preemption: Ctrl-C and SIGTERM become a flag the training loop checks between steps.

Two scopes, nested:

- `stop_on_signal()` covers a whole training command (the CLI enters it): a SIGTERM that arrives before
  the first step (model loading, data preparation: nothing to checkpoint yet) ends the command at once
  with `SignalStop` (one line, exit status 130, no traceback) instead of Python's silent death, so
  `finally` blocks still remove temporaries. Ctrl-C there is Python's KeyboardInterrupt, as before.
- `InterruptFlag` covers the training loop and its checkpoint writes (the engine enters it): the first
  signal only sets a flag; every process of a torchrun job agrees on it at the next step boundary
  (`DistContext.agree`), rank 0 writes a checkpoint, every process stops. After the last step the
  engine and the trainers enter it again around the final checkpoint and save, so a SIGTERM there waits
  for the output instead of losing the trained steps.

Inside the loop a repeated SIGTERM changes nothing: schedulers and launchers often deliver it twice at
once (Slurm signals every process of the step at its time limit and torchrun forwards its own copy), and
aborting on the second copy lost the checkpoint being written. A second Ctrl-C (SIGINT) still aborts at
once, as a person pressing it twice means.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any, Iterator

logger = logging.getLogger(__name__)

# Agreement codes (DistContext.agree takes their maximum over the processes): a SIGTERM seen by any
# process makes the whole job's stop a preemption.
NO_SIGNAL, SIGINT_SEEN, SIGTERM_SEEN = 0, 1, 2
_CODES = {signal.SIGINT: SIGINT_SEEN, signal.SIGTERM: SIGTERM_SEEN}


def signal_name(code: int) -> str | None:
    """The signal an agreement code stands for ("SIGTERM", "SIGINT"), None for no signal."""
    return {SIGINT_SEEN: "SIGINT", SIGTERM_SEEN: "SIGTERM"}.get(code)


class SignalStop(BaseException):
    """A SIGTERM outside the training loop: the command ends at once (nothing in progress can be saved).

    A BaseException like KeyboardInterrupt, so that `except Exception` clean-ups do not swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signal() -> Iterator[None]:
    """While inside, SIGTERM raises `SignalStop` (in the main thread; elsewhere nothing changes)."""

    def handler(signum, frame):
        raise SignalStop(signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class InterruptFlag:
    """Turns Ctrl-C and SIGTERM (how job schedulers preempt) into a flag the training loop checks
    between steps, so it can checkpoint and exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, doing: str = "finishing this step, writing a checkpoint, then stopping"):
        self.doing = doing  # what the warning on the first signal says happens next
        self.raised = False
        self.signal: int | None = None
        self.repeats = 0
        self._previous: dict[int, Any] = {}

    @property
    def code(self) -> int:
        """This process's agreement code: NO_SIGNAL, SIGINT_SEEN or SIGTERM_SEEN (the strongest seen)."""
        return _CODES.get(self.signal, SIGINT_SEEN) if self.raised else NO_SIGNAL

    def handle(self, signum: int) -> None:
        """What the signal handler does (callable directly in tests)."""
        if self.raised:
            if signum == signal.SIGINT:  # Ctrl-C twice: the person wants out now
                raise KeyboardInterrupt
            self.repeats += 1
            if self.repeats == 1:
                logger.warning("%s received again: ignored (%s)", signal.Signals(signum).name, self.doing)
            if signum == signal.SIGTERM:  # a SIGTERM after a Ctrl-C still makes it a preemption
                self.signal = signum
            return
        self.raised, self.signal = True, signum
        logger.warning("%s received: %s", signal.Signals(signum).name, self.doing)

    def __enter__(self):
        def handler(signum, frame):
            self.handle(signum)

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
