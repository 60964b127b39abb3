"""Reading back files mirrorbert did not just write (index folders, caches, manifests): one place for the
low-level rules every reader of such a file follows.

* `open_regular`: a path must be a regular file, checked on the opened descriptor (opened non-blocking, so a
  FIFO cannot stall the open; no race between a check and the open): a device such as /dev/zero, a FIFO or a
  folder is one `UserError` naming it, never an endless read.
* `read_regular_bytes`: the bytes of such a file, its size bounded before anything is read.
* `parse_json`: JSON of an untrusted file, its nesting bounded before `json` recurses into it (a file of
  100,000 opening brackets would otherwise end in a RecursionError traceback).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError

MAX_JSON_DEPTH = 64  # JSON nested deeper than this is refused before the parser recurses


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of `path`, which must be a regular file: opened non-blocking (a FIFO cannot
    stall the open) and checked with fstat on the descriptor itself (no race between a check and the open),
    so a device (/dev/zero), a FIFO or a folder is one error naming it, never an endless read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path}: is a folder, expected a file") from None
    except PermissionError:
        raise UserError(f"{what} {path}: permission denied (the file is not readable)") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot open it ({exc.strerror or type(exc).__name__})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
        raise UserError(f"{what} {path}: is {kind}, expected a regular file")
    os.set_blocking(fd, True)
    return fd


def open_text(path: Path, what: str, errors: str = "strict", newline: str | None = None):
    """A text file object over `open_regular`'s descriptor: a data file read line by line (an evaluation set,
    a WordNet database, a triplet file) is a regular file, never a FIFO or device that blocks or never ends."""
    return open(open_regular(Path(path), what), encoding="utf-8", errors=errors, newline=newline)


def read_regular_bytes(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (a bigger one is refused before reading it)."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise UserError(f"{what} {path}: {size} bytes, more than the {limit} this file can hold; "
                            "damaged or not written by mirrorbert")
        return fh.read(limit + 1)


def json_depth_ok(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """False when brackets nest deeper than `limit` (checked by a count, before `json` recurses into them);
    brackets inside strings count too, which can only make this stricter."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    depth = 0
    for byte in text:
        if byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def parse_json(raw: bytes, what: str, path: Path) -> Any:
    """JSON of an untrusted file: UTF-8, nesting bounded, one error naming the file otherwise."""
    if not json_depth_ok(raw):
        raise UserError(f"{what} {path}: damaged (JSON nested deeper than {MAX_JSON_DEPTH} levels)")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UserError(f"{what} {path}: damaged (not valid JSON: {reason})") from None


def set_aside(root: Path, option: str = "--cache-dir") -> Path:
    """Rename a damaged cache (or whatever sits at its name) out of the way, to `<name>.damaged-<time>`: a cache
    read back as untrusted is never used when it fails a check, and never deleted either (it may be evidence)."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = root.with_name(f"{root.name}.damaged-{stamp}" + (f"-{n}" if n else ""))
        if not os.path.lexists(aside):
            os.rename(root, aside)
            return aside
    raise UserError(f"{option} {root.parent}: too many damaged caches set aside for {root.name}; remove them")


__all__ = ["MAX_JSON_DEPTH", "json_depth_ok", "open_regular", "open_text", "parse_json", "read_regular_bytes", "set_aside"]


def file_sha256(path: Path, chunk: int = 1 << 22, what: str = "--corpus") -> str:
    """SHA-256 of a regular file's bytes (a device or FIFO is refused, never read without end); of a folder
    (a saved dataset), over its regular files' names and checksums."""
    path = Path(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for member in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(member.relative_to(path).as_posix().encode("utf-8") + b"\0"
                          + file_sha256(member, chunk, what).encode("ascii") + b"\n")
        return digest.hexdigest()
    with os.fdopen(open_regular(path, what), "rb") as fh:
        return stream_sha256(fh, chunk)


def stream_sha256(fh, chunk: int = 1 << 22) -> str:
    """SHA-256 of what is left to read of an open file, in blocks: a file can be hashed and then parsed or
    mapped from the same descriptor, so what is checked is what is read."""
    digest = hashlib.sha256()
    for block in iter(lambda: fh.read(chunk), b""):
        digest.update(block)
    return digest.hexdigest()


class PositionedReader:
    """Reads at an offset of an open file (`os.pread` where the platform has it: no shared file position, so
    a prefetch thread may read too), nothing mapped into the process; the file is kept open as long as this
    is, so what is read is the file that was opened (and checked)."""

    def __init__(self, fh):
        self._fh = fh

    def read(self, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        if not hasattr(os, "pread"):
            self._fh.seek(offset)
            raw = self._fh.read(size)
            if len(raw) != size:
                raise UserError(f"{self._fh.name}: shorter than its manifest says (changed while in use?)")
            return raw
        parts = []
        while size > 0:
            part = os.pread(self._fh.fileno(), size, offset)
            if not part:
                raise UserError(f"{self._fh.name}: shorter than its manifest says (changed while in use?)")
            parts.append(part)
            offset, size = offset + len(part), size - len(part)
        return b"".join(parts)

    def close(self) -> None:
        self._fh.close()
