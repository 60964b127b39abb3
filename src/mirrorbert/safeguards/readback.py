"""Reading back a file mirrorbert did not just write (`open_checked`): a regular file of bounded size, checked on
the descriptor opened non-blocking; JSON is UTF-8 and nested at most `MAX_JSON_DEPTH` levels.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError, first_line

MAX_JSON_DEPTH = 64  # JSON nested deeper than this is refused before the parser recurses
_mark = threading.local()
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symlink", stat.S_IFREG: "a file"}


@contextlib.contextmanager
def opening():
    """Marks this thread as inside the reader's own open, for the run-time audit of opens."""
    depth = getattr(_mark, "depth", 0)
    _mark.depth = depth + 1
    try:
        yield
    finally:
        _mark.depth = depth


def reader_active() -> bool:
    """Whether this thread is inside the reader's own open (`opening`)."""
    return getattr(_mark, "depth", 0) > 0


def describe_kind(mode: int) -> str:
    """What a file mode is, in words, for a refusal ("a folder", "a FIFO", "a character device", ...)."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


class NotRegularFile(Exception):
    """Why a path did not open as a regular file, in words a refusal completes with the file's name."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@contextlib.contextmanager
def open_errors():
    """An open by the reader (marked `opening`); its OSError becomes `NotRegularFile` saying why."""
    try:
        with opening():
            yield
    except FileNotFoundError:
        raise NotRegularFile("no such file") from None
    except IsADirectoryError:
        raise NotRegularFile("is a folder, expected a file") from None
    except NotADirectoryError:
        raise NotRegularFile("a file where a folder is expected") from None
    except PermissionError:
        raise NotRegularFile("permission denied (the file is not readable)") from None
    except OSError as exc:  # ELOOP: a link where none may be
        raise NotRegularFile(f"cannot open it ({exc.strerror or type(exc).__name__})") from None


def checked_descriptor(fd: int, limit: int | None) -> int:
    """`fd`, opened non-blocking, when it is a regular file (not /proc or /sys) of at most `limit` bytes (None:
    any size), back in blocking mode; closed and refused (`NotRegularFile`) otherwise."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"is {describe_kind(st.st_mode)}, expected a regular file")
        if limit is not None and st.st_size > limit:
            raise NotRegularFile(f"{st.st_size} bytes, more than the {limit} such a file may hold")
        if st.st_size == 0:
            try:
                first = os.read(fd, 1)
            except OSError as exc:
                raise NotRegularFile(f"cannot be read ({exc.strerror or type(exc).__name__}): not a file of "
                                     f"data") from None
            if first:
                raise NotRegularFile("reports a size of 0 but has content (a /proc or /sys file?), expected a "
                                     "regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_checked(path: str | os.PathLike, follow: bool = True, limit: int | None = None) -> int:
    """A read-only descriptor of the regular file `path`, of at most `limit` bytes, or `NotRegularFile` saying
    why not (`checked_descriptor`); `follow=False`: a link at `path` is refused, not followed."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    with open_errors():
        fd = os.open(path, flags)
    return checked_descriptor(fd, limit)


def open_regular(path: Path, what: str, limit: int | None = None) -> int:
    """`open_checked` of a path the user named (`what`: its option); a refusal is one `UserError` line."""
    try:
        return open_checked(path, limit=limit)
    except NotRegularFile as exc:
        raise UserError(f"{what} {path}: {exc.reason}") from None


def open_text(path: Path, what: str, errors: str = "strict", newline: str | None = None):
    """A UTF-8 text file object over `open_regular`'s descriptor (a data file read line by line)."""
    return open(open_regular(Path(path), what), encoding="utf-8", errors=errors, newline=newline)


@contextlib.contextmanager
def read_errors(path: Path, what: str):
    """A file that fails while it is read (permission, an I/O error) is one line naming it and `what`."""
    try:
        yield
    except PermissionError:
        raise UserError(f"{what} {path}: permission denied (the file is not readable)") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot read the file ({exc.strerror or type(exc).__name__})") from None


def read_regular_bytes(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (a bigger one is refused before reading it)."""
    with os.fdopen(open_regular(path, what, limit), "rb") as fh:
        return fh.read(limit + 1)


def json_depth_ok(raw: bytes) -> bool:
    """False when brackets (inside strings too) nest deeper than MAX_JSON_DEPTH, counted before `json` recurses."""
    depth = 0
    for byte in raw:
        if byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def loads_untrusted(raw: bytes) -> Any:
    """JSON of an untrusted file; a ValueError saying how it is damaged (too deep, not UTF-8, not JSON)."""
    if not json_depth_ok(raw):
        raise ValueError(f"damaged (JSON nested deeper than {MAX_JSON_DEPTH} levels)")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"damaged (not UTF-8 text: byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"damaged (not valid JSON: {first_line(exc)[:120]})") from None


def parse_json(raw: bytes, what: str, path: Path) -> Any:
    """`loads_untrusted`, its refusal one `UserError` naming `what` and the file."""
    try:
        return loads_untrusted(raw)
    except ValueError as exc:
        raise UserError(f"{what} {path}: {exc}") from None


def set_aside(path: Path, option: str) -> Path:
    """Rename a damaged cache or checkpoint (or whatever sits at its name) to `<name>.damaged-<time>` and return
    the new path: it is never used again, nor deleted. An OSError of the rename is the caller's."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = path.with_name(f"{path.name}.damaged-{stamp}" + (f"-{n}" if n else ""))
        if not os.path.lexists(aside):
            os.rename(path, aside)
            return aside
    raise UserError(f"{option} {path.parent}: too many damaged copies set aside for {path.name}; remove them")


def file_sha256(path: Path, what: str = "--corpus") -> str:
    """SHA-256 of a regular file's bytes (a device or FIFO is refused, never read without end); of a folder
    (a saved dataset), over its regular files' names and checksums."""
    path = Path(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for member in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(member.relative_to(path).as_posix().encode("utf-8") + b"\0"
                          + file_sha256(member, what).encode("ascii") + b"\n")
        return digest.hexdigest()
    with os.fdopen(open_regular(path, what), "rb") as fh, read_errors(path, what):
        return stream_sha256(fh)


def stream_sha256(fh, chunk: int = 1 << 22) -> str:
    """SHA-256 of what is left to read of an open file: what is hashed can then be parsed from the same one."""
    digest = hashlib.sha256()
    for block in iter(lambda: fh.read(chunk), b""):
        digest.update(block)
    return digest.hexdigest()


class PositionedReader:
    """Reads at an offset of an open, checked file with `os.pread` (no shared position: threads may share it)."""

    def __init__(self, fh):
        self._fh = fh

    def read(self, offset: int, size: int) -> bytes:
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
