"""Temporaries beside a target, created exclusively and named with their writer's owner record (pid, boot id,
start time: the next writer removes a killed run's leftovers, and only those); the one atomic replace of a file;
removing what mirrorbert wrote without following a link.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from mirrorbert.safeguards.readback import opening
from mirrorbert.safeguards.writes.failures import write_errors
from mirrorbert.safeguards.writes.held import held_signals
from mirrorbert.safeguards.writes.paths import PathLike, own_name

logger = logging.getLogger(__name__)

# An owner record `{pid}.{boot}.{start}` (`owner_record`); OWNER_ROOM: the bytes it may take in a name.
OWNER_ROOM = 40
_OWNER = r"(\d+)\.([0-9a-f]{8})\.(\d+)"
# Created folders and files get these permissions minus the umask (tempfile makes 0700 folders, 0600 files).
FOLDER_MODE = 0o777
FILE_MODE = 0o666
_OWNER_RECORDS: dict[int, str] = {}


def remove_tree(path: PathLike, dir_fd: int | None = None) -> None:
    """Remove a folder mirrorbert wrote (or a file), relative to the folder `dir_fd` when given; a symlink is
    unlinked, never followed (`shutil.rmtree` follows none below the top)."""
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path, dir_fd=dir_fd)
        return
    with opening():  # rmtree opens each folder it empties: the boundary's own opens, no file read
        shutil.rmtree(path, ignore_errors=True, **({} if dir_fd is None else {"dir_fd": dir_fd}))


def boot_id() -> str:
    """The first 8 hex digits of this boot's id ("00000000" where the kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            text = fh.read().strip().replace("-", "").lower()
    except OSError:
        return "0" * 8
    return text[:8] if re.fullmatch(r"[0-9a-f]{8,}", text) else "0" * 8


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
        return int(text[text.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_record() -> str:
    """This process's owner record `{pid}.{boot}.{start}`: its id, the boot id (`boot_id`), its `start_ticks`."""
    pid = os.getpid()
    if pid not in _OWNER_RECORDS:  # keyed by pid: a forked child is another owner
        _OWNER_RECORDS[pid] = f"{pid}.{boot_id()}.{start_ticks(pid) or 0}"
    return _OWNER_RECORDS[pid]


def owner_gone(pid: int, boot: str, start: int) -> bool:
    """True only when the process an owner record names cannot be running: it was of another boot, no
    process has its id, or the one that has it started at another time (the id was reused)."""
    here = boot_id()
    if boot != here and here != "0" * 8:
        return True
    ticks = start_ticks(pid)
    if ticks is not None:
        return ticks != start
    if os.path.isdir(f"/proc/{os.getpid()}"):
        return True  # /proc answers for this process but knows no process `pid`
    try:  # no /proc (macOS): a pid that answers is taken to be the owner
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _temporary_prefix(target: Path, kind: str, suffix: str = "") -> str:
    """The fixed start of the names of `target`'s temporaries (`kind` "tmp", then owner, random part and
    `suffix`) or set-aside copies ("old", then owner): `.{name}.{kind}-`, shortened as `own_name` does."""
    name = target.name
    if suffix and name.endswith(suffix) and len(name) > len(suffix):
        target = target.with_name(name[: -len(suffix)])
    room = OWNER_ROOM + (8 + len(os.fsencode(suffix)) if kind == "tmp" else 0)
    return own_name(target, f"{kind}-", room=room)


def remove_stale_temporaries(target: PathLike, suffix: str = "") -> list[Path]:
    """Remove what a killed writer of `target` left beside it: this user's regular files and folders named exactly
    as its temporaries and set-aside copies, whose owner is gone; a link or anything else stays."""
    target = Path(target)
    tmp, old = _temporary_prefix(target, "tmp", suffix), _temporary_prefix(target, "old")
    pattern = re.compile(rf"^(?:{re.escape(tmp)}{_OWNER}-[A-Za-z0-9_]+{re.escape(suffix)}|{re.escape(old)}{_OWNER})$")
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except OSError:
        return []
    removed = []
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        pid, boot, start = [g for g in match.groups() if g is not None]
        path = target.parent / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not owner_gone(int(pid), boot, int(start)) or st.st_uid != os.geteuid() \
                or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            continue
        remove_tree(path)
        logger.info("removed %s, left behind by a mirrorbert run that was killed", path)
        removed.append(path)
    return removed


def make_temporary(target: PathLike, folder: bool = False, suffix: str = "") -> Path:
    """A new temporary file (or `folder`) beside `target`, created exclusively with signals held, never through a
    link, named with this process's owner record and ending in `suffix`; a killed writer's leftovers go first."""
    target = Path(target)
    remove_stale_temporaries(target, suffix)
    prefix = f"{_temporary_prefix(target, 'tmp', suffix)}{owner_record()}-"
    made = None
    try:
        with held_signals():
            if folder:
                made = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=target.parent))
            else:
                fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
                made = Path(name)
                os.close(fd)
        return made
    except BaseException:
        if made is not None:
            remove_tree(made)
        raise


def open_temporary(path: PathLike, mode: str = "wb"):
    """A temporary (or a file in one) opened for writing, never through a link (emptied, except with "r+b")."""
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_RDWR if "+" in mode else os.O_WRONLY | os.O_TRUNC)
    return os.fdopen(os.open(path, flags, FILE_MODE), mode)


def set_aside_name(target: PathLike) -> Path:
    """Where `target` is moved while its replacement is renamed into place (removed right after)."""
    target = Path(target)
    return target.with_name(f"{_temporary_prefix(target, 'old')}{owner_record()}")


def current_umask() -> int:
    """This process's umask (read by setting it and setting it back: no call reads it alone)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def fix_folder_mode(folder: PathLike) -> None:
    """Give a finished output the usual umask-based modes (not the temporaries' 0700/0600), links untouched."""
    umask = current_umask()
    folder = Path(folder)
    below = [Path(root) / name for root, dirs, files in os.walk(folder) for name in dirs + files]
    for path in (folder, *below):
        with contextlib.suppress(OSError):
            st = os.lstat(path)  # chmod would change a link's target
            if stat.S_ISDIR(st.st_mode):
                os.chmod(path, FOLDER_MODE & ~umask)
            elif stat.S_ISREG(st.st_mode):
                os.chmod(path, FILE_MODE & ~umask)


def replace_file(path: PathLike, data: str | bytes, option: str = "") -> Path:
    """Write `data` into `path` under an exclusive temporary name beside it and rename it into place; inside a
    folder this run owns (no policy checks). A full disk is one UserError naming `path` (and `option`)."""
    path, name = Path(path), None
    with write_errors(path, option):
        try:
            name = make_temporary(path)
            with open_temporary(name) as fh:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            os.chmod(name, FILE_MODE & ~current_umask())
            os.replace(name, path)
        except BaseException:
            if name is not None:
                remove_tree(name)
            raise
    return path
