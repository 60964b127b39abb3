"""One run at a time per output: an `fcntl.flock` on a lock file beside it, never through a link; an existing
file there is locked read-only, and removed only when it is a lock record of this user's mirrorbert."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import describe_kind, opening
from mirrorbert.safeguards.writes.failures import WRITE_ERRNOS, write_error, write_errors
from mirrorbert.safeguards.writes.held import held_signals
from mirrorbert.safeguards.writes.paths import PathLike, locate, own_name

LOCK_RECORD = "mirrorbert lock, pid "
_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def lock_path(folder: PathLike) -> Path:
    folder = locate(folder)
    return folder.with_name(own_name(folder, "lock"))


def _open_existing(path: Path, option: str, shown: Any) -> int | None:
    """The regular file already at the lock path, opened read-only (flock needs no write access); a refusal
    naming anything else there; None when it went away or changed meanwhile."""
    def refuse(kind: str) -> UserError:
        return UserError(f"{option} {shown}: its lock path {path} is {kind}, not a lock file of mirrorbert's; "
                         f"remove it (mirrorbert never writes through it)")

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(describe_kind(st.st_mode))
        with opening():  # a lock's descriptor: its content is never read
            fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link between the two calls
            raise refuse("a symlink") from None
        raise UserError(f"{option} {shown}: cannot open its lock file {path} ({os.strerror(exc.errno or 0)}); "
                        f"it belongs to someone else: remove it or choose another location") from None
    if not os.path.samestat(os.fstat(fd), st):
        os.close(fd)
        return None
    return fd


def _acquire(path: Path, option: str, shown: Any) -> tuple[int, bool]:
    """(fd, created): the lock file at `path`, flocked; a second run is refused at once. A file unlinked or
    replaced by the run that held it is tried again."""
    while True:
        try:
            fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FLAGS, 0o644), True
        except FileExistsError:
            fd, created = _open_existing(path, option, shown), False
            if fd is None:
                continue
        except OSError as exc:
            if exc.errno in WRITE_ERRNOS:
                raise write_error(path, option, exc.errno) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{option} {shown}: another mirrorbert run is using it (lock {path}); "
                                f"wait for it to finish or choose another folder") from None
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                return fd, created
        os.close(fd)


def _is_own_lock_record(fd: int) -> bool:
    """An existing lock file written by a mirrorbert run of this user (killed before it could remove it)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or st.st_size > 200:
        return False
    return os.pread(fd, 200, 0).decode("utf-8", "replace").startswith(LOCK_RECORD)


@contextlib.contextmanager
def folder_lock(folder: PathLike, option: str) -> Iterator[Path]:
    """Exclusive lock for one output (folder or file); a second run on it is refused at once. The lock file is
    removed on release when this run created it or it is a lock record of mirrorbert's own."""
    path = lock_path(folder)
    with write_errors(path, option):
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, removable = None, False
    try:
        with held_signals():  # from the lock file's creation until its removal is certain: a signal waits
            fd, created = _acquire(path, option, folder)
            with contextlib.suppress(OSError):
                removable = created or _is_own_lock_record(fd)
            if created:
                with contextlib.suppress(OSError):  # a full disk leaves the lock empty: it still locks
                    os.write(fd, f"{LOCK_RECORD}{os.getpid()}\n".encode())
        yield path
    finally:
        if fd is not None:
            if removable:
                with contextlib.suppress(OSError):
                    if os.path.samestat(os.fstat(fd), os.lstat(path)):
                        os.unlink(path)
            os.close(fd)  # closing releases the flock
