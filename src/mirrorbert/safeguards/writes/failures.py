"""What went wrong when a write or a resource failed, decided by what happened, never by a library's wording
alone: a failed write is one `UserError` line naming the output and what was missing; other errors pass."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.held import held_signals
from mirrorbert.safeguards.writes.paths import OWN_TEMPORARY, PathLike, kind_of, link_words, locate, name_max, resolve

# Errors of a write that the user fixes by freeing space or choosing another place: one line, no traceback.
WRITE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only filesystem", errno.ENAMETOOLONG: "file name too long",
                errno.EFBIG: "file too large", errno.EIO: "input/output error (the disk or its connection failed)"}
# The errno a Rust library (safetensors, tokenizers) puts in its message: "(os error 28)", "Os { code: 28, ...".
_RUST_ERRNO = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+),")
PROBE_BYTES = 64 << 10  # written to ask the filesystem whether there is room (removed at once)
_SIZE_SCAN = 10_000  # files looked at, at most, for one that stopped at the file-size limit
_PATH_ERRNOS = {errno.ENOTDIR, errno.EEXIST, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ELOOP, errno.EBUSY}


class WriteFailed(UserError):
    """A failed write as one line; `why` says what was missing (for a caller that words its own line)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def failure_errno(exc: BaseException) -> int | None:
    """The errno behind `exc`: an OSError's own or one in its cause/context chain, or the code a Rust library
    put in its message; None when no OS error is behind it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
            return exc.errno
        found = _RUST_ERRNO.search(str(exc)) if not isinstance(exc, UserError) else None
        if found:
            return int(found.group(1) or found.group(2))
        exc = exc.__cause__ or exc.__context__
    return None


def file_size_limit() -> int | None:
    """This process's largest writable file (RLIMIT_FSIZE, `ulimit -f`) in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def write_failure(exc: BaseException, target: PathLike | None = None) -> int | None:
    """The errno (`WRITE_ERRNOS`) of a write that failed for want of room or a writable place; None for any other
    error. A library error without an errno is decided by what the filesystem at `target` says now."""
    code = failure_errno(exc)
    if code is not None:
        return code if code in WRITE_ERRNOS else None
    if target is None or isinstance(exc, UserError) or type(exc).__module__.startswith("mirrorbert."):
        return None  # mirrorbert's own errors say what they are
    return probe_write(target)


def probe_write(target: PathLike) -> int | None:
    """The errno writing at `target` gets now: EFBIG when a file of it stopped at the file-size limit, else that
    of a probe write of PROBE_BYTES (ENOSPC below that much free); None when writing works."""
    target = locate(target)
    limit = file_size_limit()
    if limit is not None and _stopped_at(target, limit):
        return errno.EFBIG
    folder = next((p for p in (target if target.is_dir() else target.parent, *target.parents) if p.is_dir()), None)
    if folder is None:
        return None
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free < PROBE_BYTES or (st.f_files and not st.f_favail):
        return errno.ENOSPC
    try:
        write_probe(folder, PROBE_BYTES)
    except OSError as exc:
        return exc.errno if exc.errno in WRITE_ERRNOS else None
    return None


def write_probe(folder: PathLike, size: int = 0) -> None:
    """Create a file in `folder` (signals held), write `size` bytes to disk, and remove it; raises its OSError."""
    with held_signals():
        fd, name = tempfile.mkstemp(prefix=".mirrorbert-write-test-", dir=folder)
        try:
            if size:
                os.write(fd, bytes(size))
                os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)


def _stopped_at(target: Path, limit: int) -> bool:
    """Some file of `target` (itself, inside it, or in one of its temporaries beside it) reached `limit` bytes."""
    try:
        starts = [name for name in os.listdir(target.parent) if name == target.name or OWN_TEMPORARY.match(name)]
    except OSError:
        return False
    seen = 0
    for start in starts:
        path = target.parent / start
        walk = os.walk(path) if path.is_dir() and not path.is_symlink() else [(str(target.parent), [], [start])]
        for root, _, names in walk:
            for name in names:
                seen += 1
                if seen > _SIZE_SCAN:
                    return False
                with contextlib.suppress(OSError):
                    if os.lstat(os.path.join(root, name)).st_size >= limit:
                        return True
    return False


def _free(folder: Path) -> int | None:
    for candidate in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(candidate).free
    return None  # pragma: no cover


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def _why(code: int) -> str:
    """What a write's errno means, with the file-size limit where that is what was passed."""
    limit = file_size_limit()
    if code == errno.EFBIG and limit is not None:
        return f"{WRITE_ERRNOS[code]}: the file-size limit (ulimit -f) is {human_size(limit)}"
    return WRITE_ERRNOS.get(code, os.strerror(code))


@contextlib.contextmanager
def write_errors(target: PathLike, option: str = "--output") -> Iterator[None]:
    """A failed write (`write_failure`, or a path that cannot hold a folder or that the library cannot encode),
    whatever the library raised, becomes one UserError line naming `target`; any other error passes through."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  libraries raise any type; only write failures are translated
        code = write_failure(exc, target)
        if code is not None:
            raise write_error(target, option, code) from None
        problem = _path_problem(exc, target)
        if problem is None:
            raise
        raise WriteFailed(f"{option} {target}: cannot write it: {problem}; nothing was changed there, choose "
                          f"another location", problem) from None


def _related(filename: str, target: PathLike) -> bool:
    """`filename` (of a failed call) is `target`, a folder above it, something inside it, or inside one of its
    temporaries beside it."""
    name = os.path.abspath(os.fsdecode(filename))
    for where in {os.path.abspath(os.path.expanduser(str(target))), str(locate(target)), str(resolve(target))}:
        if name == where or where.startswith(name.rstrip("/") + "/") or name.startswith(where + "/"):
            return True
        for part in (Path(name), *Path(name).parents):
            if str(part.parent) == os.path.dirname(where) and OWN_TEMPORARY.match(part.name):
                return True
    return False


def _path_problem(exc: BaseException, target: PathLike) -> str | None:
    """What in the path to `target` made a write fail (a file where a folder must go, no permission, a mount
    point, a name a library cannot encode), in words; None for an error that is not about that path."""
    odd = [part for part in locate(target).parts if not utf8_path(part)]
    if odd and (isinstance(exc, TypeError) or isinstance(exc, UnicodeEncodeError) and isinstance(exc.object, str)
                and any(part in exc.object for part in odd)):  # the path handed over, not a text written
        return (f"its path is not valid UTF-8 ({os.fsencode(str(locate(target)))!r}), and the library writing it "
                f"takes UTF-8 names only")
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


def utf8_path(path: PathLike) -> bool:
    """Whether `path` is valid UTF-8 (a name the OS gave as bytes that are not is held with surrogates)."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def write_error(target: PathLike, option: str, code: int, needed_bytes: int = 0) -> WriteFailed:
    """The one line of a failed write: `option target: cannot write it: why (free space); advice`."""
    shown = f"{option} {target}".strip()
    target = Path(target)
    why = _why(code)
    if code == errno.EFBIG and file_size_limit() is not None:
        advice = "raise the limit (ulimit -f unlimited) and run again"
    elif code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        free = _free(target.parent)
        need = f", about {human_size(needed_bytes)} needed" if needed_bytes else ""
        why += f" ({human_size(free)} free in {target.parent}{need})" if free is not None else ""
        advice = "free some space or choose another location"
    elif code == errno.ENAMETOOLONG:
        advice = f"choose a shorter name (at most {name_max(target.parent)} bytes a part)"
    else:
        advice = "choose another location"
    return WriteFailed(f"{shown}: cannot write it: {why}; nothing was changed there, {advice}", why)


def resource_failure(exc: BaseException) -> str | None:
    """One line for an error that is a limit of this process or system, not a mistake in the command: too many
    open files, memory, file size, space, permission; None for anything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limit = "" if soft == resource.RLIM_INFINITY else f" (the address-space limit, ulimit -v, is {human_size(soft)})"
    text = str(exc)
    if isinstance(exc, MemoryError) or isinstance(exc, RuntimeError) and ("bad_alloc" in text
                                                                          or "can't allocate memory" in text):
        return f"out of memory{limit}: free memory, raise the limit or use a smaller --batch-size"
    if isinstance(exc, ImportError) and limit:  # a shared library that could not be mapped under the limit
        return f"a library could not be loaded ({text[:160]}){limit}: raise the limit and run again"
    code = failure_errno(exc)
    where = getattr(exc, "filename", None)
    where = f"{os.fsdecode(where)}: " if isinstance(where, (str, bytes)) else ""
    if code in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        many = "too many open files" + (" in the system" if code == errno.ENFILE else "")
        return (f"{where}{many} (this process may hold {soft}, ulimit -n): raise the limit (ulimit -n 4096) and "
                f"run again")
    if code == errno.ENOMEM:
        return f"{where}not enough memory: free memory or use a smaller --batch-size"
    if code in (errno.EACCES, errno.EPERM):
        return f"{where or 'a file: '}permission denied"
    if code in WRITE_ERRNOS:  # where no writer named its output
        return (f"{where or 'a file being written: '}{_why(code)}; free some space, raise the limit or choose another "
                f"location")
    return None


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
