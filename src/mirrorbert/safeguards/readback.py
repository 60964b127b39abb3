"""Reading back files mirrorbert did not just write (index folders, caches, manifests): one place for the
low-level rules every reader of such a file follows.

* `open_checked`: a path must be a regular file, checked on the opened descriptor (opened non-blocking, so a
  FIFO cannot stall the open; no race between a check and the open), of bounded size where asked; the one
  open of such a file (`open_regular` words its refusal for a path the user named, `ConfinedFolder.open` for
  a file of a folder, the write policy reads its markers through it): a device such as /dev/zero, a FIFO or
  a folder is one `UserError` naming it, never an endless read.
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


def describe_kind(mode: int) -> str:
    """What a file mode is, in words, for a refusal ("a folder", "a FIFO", ...)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a regular file"


class NotRegularFile(Exception):
    """Why a path did not open as a regular file, in words a refusal completes with the file's name."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def open_checked(path: str | os.PathLike, follow: bool = True, limit: int | None = None) -> int:
    """A read-only descriptor of the regular file `path`, of at most `limit` bytes (None: any size), or
    `NotRegularFile` saying why not. Opened non-blocking (a FIFO cannot stall the open) and checked with fstat
    on the descriptor itself (no race between a check and the open); `follow=False`: a link at `path` is
    refused, not followed. Every reader of a file mirrorbert did not just write opens it here."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise NotRegularFile("no such file") from None
    except IsADirectoryError:
        raise NotRegularFile("is a folder, expected a file") from None
    except PermissionError:
        raise NotRegularFile("permission denied (the file is not readable)") from None
    except OSError as exc:  # ELOOP: a link where none may be
        raise NotRegularFile(f"cannot open it ({exc.strerror or type(exc).__name__})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"is {describe_kind(st.st_mode)}, expected a regular file")
        if limit is not None and st.st_size > limit:
            raise NotRegularFile(f"{st.st_size} bytes, more than the {limit} such a file may hold")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path, what: str) -> int:
    """`open_checked` of a path the user named (`what`: its option), a refusal as one `UserError` line:
    a device (/dev/zero), a FIFO or a folder is one error naming it, never an endless read."""
    try:
        return open_checked(path)
    except NotRegularFile as exc:
        raise UserError(f"{what} {path}: {exc.reason}") from None


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


def set_aside(path: Path, option: str) -> Path:
    """Rename a damaged cache or checkpoint (or whatever sits at its name) out of the way, to
    `<name>.damaged-<time>`, and return the new path: what is read back and fails a check is never used again,
    and never deleted either (it may be evidence). An OSError of the rename (another process set it aside
    first) is the caller's."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = path.with_name(f"{path.name}.damaged-{stamp}" + (f"-{n}" if n else ""))
        if not os.path.lexists(aside):
            os.rename(path, aside)
            return aside
    raise UserError(f"{option} {path.parent}: too many damaged copies set aside for {path.name}; remove them")


__all__ = ["MAX_JSON_DEPTH", "NotRegularFile", "describe_kind", "json_depth_ok", "open_checked", "open_regular", "open_text",
           "parse_json", "read_regular_bytes", "set_aside"]


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
