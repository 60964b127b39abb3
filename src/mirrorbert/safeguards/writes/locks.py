"""One run at a time per output: an `fcntl.flock` on a lock file beside it, released by the kernel when the
process ends (a killed run never leaves a stale lock)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.failures import WRITE_ERRNOS, write_error, write_errors
from mirrorbert.safeguards.writes.paths import PathLike, locate, mode_words, own_name

LOCK_RECORD = "mirrorbert lock, pid "


def lock_path(folder: PathLike) -> Path:
    folder = locate(folder)
    return folder.with_name(own_name(folder, "lock"))


def _open_lock(path: Path, option: str, shown: Any) -> tuple[int, bool]:
    """(fd, created): the lock file at `path`, created exclusively (never through a link), or an existing
    regular file there opened read-only (flock needs no write access; what it holds is never touched)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o644), True
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno in WRITE_ERRNOS:
                raise write_error(path, option, exc.errno) from None
            raise
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # removed by the run that held it: create it again
        if not stat.S_ISREG(st.st_mode):
            kind = mode_words(st.st_mode)
            raise UserError(f"{option} {shown}: its lock path {path} is {kind}, not a lock file of mirrorbert's; "
                            f"remove it (mirrorbert never writes through it)")
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a link between the two calls
                raise UserError(f"{option} {shown}: its lock path {path} is a symlink, not a lock file of "
                                f"mirrorbert's; remove it (mirrorbert never writes through it)") from None
            raise UserError(f"{option} {shown}: cannot open its lock file {path} ({os.strerror(exc.errno or 0)}); "
                            f"it belongs to someone else: remove it or choose another location") from None
        if not os.path.samestat(os.fstat(fd), st):
            os.close(fd)
            continue
        return fd, False


def _is_own_lock_record(fd: int) -> bool:
    """An existing lock file written by a mirrorbert run of this user (killed before it could remove it)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or st.st_size > 200:
        return False
    text = os.pread(fd, 200, 0).decode("utf-8", "replace")
    return text.startswith(LOCK_RECORD)


@contextlib.contextmanager
def folder_lock(folder: PathLike, option: str) -> Iterator[Path]:
    """Exclusive lock for one output (folder or file); a second run on it is refused at once.

    The kernel drops an flock when the process exits, however it exits, so a killed run never leaves a
    stale lock. The lock file is created with O_EXCL|O_NOFOLLOW and removed on release; a symlink or a
    special file at its path is refused; an existing regular file there (a killed run's, or one planted
    in a shared folder) is locked read-only, never written, and removed only when it is a lock record of
    mirrorbert's own. A run that locked a file just unlinked by another notices and tries again.
    """
    path = lock_path(folder)
    with write_errors(path, option):
        path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd, created = _open_lock(path, option, folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{option} {folder}: another mirrorbert run is using it (lock {path}); "
                                f"wait for it to finish or choose another folder") from None
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        removable = created or _is_own_lock_record(fd)
    except OSError:
        removable = False
    try:
        if created:
            with contextlib.suppress(OSError):  # a full disk leaves the lock empty: it still locks
                os.write(fd, f"{LOCK_RECORD}{os.getpid()}\n".encode())
        yield path
    finally:
        if removable:
            with contextlib.suppress(OSError):
                if os.path.samestat(os.fstat(fd), os.lstat(path)):
                    os.unlink(path)
        os.close(fd)  # closing releases the flock
