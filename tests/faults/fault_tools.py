"""What the fault-injection tests share: commands run in a subprocess under limits, and what a run may leave.

Every test here builds its fault by construction (an rlimit, a monkeypatched writer raising what a library
raises, a signal sent at a chosen instant, a name made of bytes), so each one fails when the behaviour it
checks is gone.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

# Names of what a write leaves while it is under way: locks, temporaries, set-aside copies, probes.
LEFTOVER = re.compile(r"^\.(.+\.(lock|tmp(-.*)?|tmp\.npy|old-[0-9a-f.]+)|mirrorbert-write-test-.*)$")
TRACEBACK = "Traceback (most recent call last)"


def leftovers(*folders: Path) -> list[str]:
    """Every lock, temporary or set-aside copy below `folders` (walked without following links)."""
    found = []
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            found += [os.path.join(root, n) for n in dirs + files if LEFTOVER.match(os.fsdecode(n))]
    return sorted(found)


def command_env(**extra: str) -> dict[str, str]:
    """The environment of a command under test: offline, one thread, the test session's cache."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


def run_mirrorbert(argv: list, *, cwd: Path | bytes | str | None = None, limits: dict[int, int] | None = None,
                   env: dict[str, str] | None = None, before=None, timeout: float = 600,
                   stdin=None) -> subprocess.CompletedProcess:
    """`python -m mirrorbert ARGV` in a subprocess, with `limits` ({resource.RLIMIT_*: soft and hard}) and
    `before()` applied in the child just before it starts (a chdir into a folder deleted since, ...)."""
    def prepare():
        for kind, value in (limits or {}).items():
            resource.setrlimit(kind, (value, value))
        if before is not None:
            before()

    args = [sys.executable, "-m", "mirrorbert", *[os.fsencode(a) if isinstance(a, (str, Path)) else a
                                                  for a in argv]]
    return subprocess.run(args, cwd=cwd, env=env or command_env(), preexec_fn=prepare, capture_output=True,
                          timeout=timeout, stdin=stdin)


def text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def assert_one_line(result: subprocess.CompletedProcess, *words: str, status: int = 2) -> str:
    """The command ended with `status` and one `mirrorbert: error:` line holding `words`, no traceback."""
    err = text(result.stderr)
    assert TRACEBACK not in err, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("mirrorbert: error:")]
    assert result.returncode == status and lines, (result.returncode, err[-3000:])
    for word in words:
        assert word in lines[-1], (word, lines[-1])
    return lines[-1]


def send_self(sig: int) -> None:
    """Deliver `sig` to this process now (its handler runs at the next bytecode boundary)."""
    os.kill(os.getpid(), sig)


SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}
