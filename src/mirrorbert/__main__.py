"""`python -m mirrorbert ...` is the `mirrorbert` command (what `torchrun ... -m mirrorbert train` runs); `console`
is also the console script's entry point.

Signals are handled from the first line on: Ctrl-C, SIGTERM or SIGHUP while the command is still importing is a
quiet exit 130, and once the command has returned its status, no late signal (a launcher's repeated SIGTERM) can
turn it into a death by that signal.
"""

import signal
import sys

EXIT_INTERRUPTED = 130
_finished = False  # the command has its exit status: signals from now on change nothing


def _interrupt(signum, frame):
    if not _finished:
        raise KeyboardInterrupt


def console() -> int:
    """Run the `mirrorbert` command line (`sys.argv`) and return its exit status."""
    global _finished
    _finished = False
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(sig, _interrupt)
    try:
        from mirrorbert.cli.app import main

        status = main()
        _finished = True
    except KeyboardInterrupt:
        _finished = True
        status = EXIT_INTERRUPTED
        try:
            print("mirrorbert: interrupted", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP)
            pass
    return status


if __name__ == "__main__":
    sys.exit(console())
