"""The run-time guard of the trust boundary: an audit hook (`sys.addaudithook`) on every `open` of the process.

While a test runs, each read-only open of a path inside an untrusted area (every folder the tests make:
pytest's temporary root; the shared data directory) that happens on mirrorbert's behalf (a frame of
`src/mirrorbert` on the stack, whichever library does the opening) and not inside the reader
(`safeguards.readback.opening`, which marks the thread while the confined reader or `open_checked` opens a file)
is recorded; the test then fails naming the path and the mirrorbert frame that asked for it. No module is
allowed by name: a read of a stranger's file goes through the reader, or it is a failure. What this process
just wrote is no stranger's: a path inside a temporary named with this process's owner record
(`safeguards.writes.temporaries.make_temporary`, e.g. an export's graph read back to convert it) is not watched.

Libraries that open files from native code (tokenizers, safetensors, faiss, onnxruntime) raise no audit event:
for those the boundary is that they are handed only mirrorbert's private snapshot or a checked descriptor
(tests/safeguards/test_model_race.py checks what they read).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src" / "mirrorbert") + os.sep
TESTS = str(Path(__file__).resolve().parent) + os.sep
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_state = threading.local()


class Audit:
    """The areas watched and what was seen; `active` switches the hook on for one test."""

    roots: list[str] = []
    active = False
    seen: list[str] = []


_NOT_A_READ = _WRITE_FLAGS | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)


def _writing(mode, flags) -> bool:
    """A write, or the open of a folder (a descriptor to write or list in, no file's content)."""
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _NOT_A_READ)


def _mirrorbert_frame() -> str | None:
    """The innermost frame of mirrorbert's that asked for the open (through any library), or None when a test's
    own code is nearer (a test's callback run from inside mirrorbert reads for the test)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(SRC):
            return f"{name[len(SRC):]}:{frame.f_lineno} {frame.f_code.co_name}"
        if name.startswith(TESTS) and not name.endswith("audit_opens.py"):
            return None
        frame = frame.f_back
    return None


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not Audit.active or getattr(_state, "busy", False):
        return
    path = args[0] if args else None
    if path is None or isinstance(path, int) or _writing(args[1] if len(args) > 1 else None,
                                                         args[2] if len(args) > 2 else None):
        return
    _state.busy = True
    try:
        from mirrorbert.safeguards.readback import reader_active
        from mirrorbert.safeguards.writes.temporaries import owner_record

        if reader_active():
            return
        text = os.path.abspath(os.fsdecode(path))
        if f".tmp-{owner_record()}-" in text:
            return  # inside a temporary this process made (named with its owner record): what it just wrote
        if not any(text == root or text.startswith(root + os.sep) for root in Audit.roots) or os.path.isdir(text):
            return  # outside the watched areas, or a folder (listed or removed, no file's content read)
        where = _mirrorbert_frame()
        if where is not None:
            Audit.seen.append(f"{text} opened around the reader by {where}")
    finally:
        _state.busy = False


def install(roots: list[Path]) -> None:
    Audit.roots = [os.path.realpath(r) for r in roots] + [os.path.abspath(r) for r in roots]
    sys.addaudithook(_hook)
