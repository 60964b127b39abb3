"""A write that fails for want of space, quota, a writable filesystem or a name the filesystem accepts, or
because the path to it cannot hold a folder, ends in one `UserError` line naming the output and what was
missing; any other error passes through unchanged."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.paths import OWN_TEMPORARY, PathLike, kind_of, link_words, locate, name_max, resolve

# Errors of a write that the user fixes by freeing space or choosing another place: one line, no traceback.
WRITE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only filesystem", errno.ENAMETOOLONG: "file name too long",
                errno.EFBIG: "file too large for the filesystem", errno.EIO: "input/output error"}
# The same errors as libraries that do not raise OSError spell them (safetensors, torch's zip writer).
_WRITE_TEXTS = (("No space left on device", errno.ENOSPC), ("StorageFull", errno.ENOSPC),
                ("Disk quota exceeded", errno.EDQUOT), ("Read-only file system", errno.EROFS),
                ("File name too long", errno.ENAMETOOLONG), ("file write failed", errno.ENOSPC))


def write_failure(exc: BaseException) -> int | None:
    """The errno of a write that failed for want of space, quota, a writable filesystem or a shorter name
    (also as libraries without OSError spell it); None for any other error."""
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return exc.errno
    if isinstance(exc, (OSError, RuntimeError)) or type(exc).__name__.endswith("Error"):
        text = str(exc)
        for words, code in _WRITE_TEXTS:
            if words in text:
                return code
    return None


def _free(folder: Path) -> int | None:
    for candidate in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(candidate).free
    return None  # pragma: no cover


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


@contextlib.contextmanager
def write_errors(target: PathLike, option: str = "--output", needed_bytes: int = 0) -> Iterator[None]:
    """Turn a failed write (full disk, quota, read-only filesystem, name too long) into one UserError line
    naming `target` and what was missing; any other error passes through."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  only write failures are translated, the rest re-raised
        code = write_failure(exc)
        if code is not None:
            raise write_error(target, option, code, needed_bytes) from None
        problem = _path_problem(exc, target)
        if problem is None:
            raise
        raise UserError(f"{option} {target}: cannot write it: {problem}; nothing was changed there, choose "
                        f"another location") from None


_PATH_ERRNOS = {errno.ENOTDIR, errno.EEXIST, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ELOOP, errno.EBUSY}


def _related(filename: str, target: PathLike) -> bool:
    """`filename` (of a failed call) is `target`, a folder above it, something inside it, or one of its
    temporaries beside it."""
    name = os.path.abspath(os.fsdecode(filename))
    for where in {os.path.abspath(os.path.expanduser(str(target))), str(locate(target)), str(resolve(target))}:
        if name == where or where.startswith(name.rstrip("/") + "/") or name.startswith(where + "/"):
            return True
        for part in (Path(name), *Path(name).parents):  # in one of its temporaries
            if str(part.parent) == os.path.dirname(where) and OWN_TEMPORARY.match(part.name):
                return True
    return False


def _path_problem(exc: BaseException, target: PathLike) -> str | None:
    """What in the path to `target` made a write fail (a file or a missing link target where a folder must
    go, a filesystem that holds no new folders such as /proc, no permission, a mount point), in words;
    None for an error that is not about that path."""
    if not isinstance(exc, OSError) or exc.errno not in _PATH_ERRNOS or not exc.filename \
            or not _related(exc.filename, target):
        return None
    where = os.fsdecode(exc.filename)
    if exc.errno == errno.EEXIST and os.path.islink(where):
        return f"{where} is {link_words(Path(where))} (mirrorbert never writes through a link)"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        blocking = next((p for p in (Path(where), *Path(where).parents) if os.path.lexists(p) and not p.is_dir()),
                        Path(where))
        return f"{blocking} is {kind_of(blocking, follow=False) or 'not a folder'}, where a folder must go"
    if exc.errno == errno.EBUSY:
        return f"{where} is busy (a mount point cannot be replaced)"
    if exc.errno == errno.ENOENT:
        return f"{where} cannot be created ({os.strerror(exc.errno).lower()})"
    return f"{where}: {os.strerror(exc.errno).lower()}"


def write_error(target: PathLike, option: str, code: int, needed_bytes: int = 0) -> UserError:
    """The one line of a failed write: `option target: cannot write it: why (free space); advice`."""
    shown = f"{option} {target}".strip()
    target = Path(target)
    why = WRITE_ERRNOS.get(code, os.strerror(code))
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        free = _free(target.parent)
        need = f", about {human_size(needed_bytes)} needed" if needed_bytes else ""
        have = f" ({human_size(free)} free in {target.parent}{need})" if free is not None else ""
        advice = "free some space or choose another location"
    elif code == errno.ENAMETOOLONG:
        have, advice = "", f"choose a shorter name (at most {name_max(target.parent)} bytes a part)"
    else:
        have, advice = "", "choose another location"
    return UserError(f"{shown}: cannot write it: {why}{have}; nothing was changed there, {advice}")


def preallocate(fd: int, size: int, target: PathLike, option: str = "--output") -> None:
    """Reserve `size` bytes for a file about to be written through a memory map, so that a full disk is a
    UserError now rather than a SIGBUS halfway (filesystems without fallocate are left to the write)."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", -1)):
            return
        if exc.errno in WRITE_ERRNOS:
            raise write_error(target, option, exc.errno, size) from None
        raise
