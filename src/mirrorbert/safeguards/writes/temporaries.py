"""Temporaries beside a target, named with their writer's owner record, and the one atomic replace of a file.

A temporary is created exclusively without following links (`mkstemp`/`mkdtemp`) and renamed into place; a
name that would pass the filesystem's limit is shortened (a hash of the name). The name carries its writer's
owner record (pid, boot and start time), so the next writer of the same target removes what a killed run left
there (`kill -9` runs no cleanup), and only that: this user's files and folders of that exact pattern whose
writer is gone, never a link.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
from pathlib import Path

from mirrorbert.safeguards.writes.failures import write_errors
from mirrorbert.safeguards.writes.paths import PathLike, own_name
from mirrorbert.safeguards.writes.removal import remove_tree

logger = logging.getLogger(__name__)

# A temporary's owner record in its name, `{pid}.{boot}.{start}`: the writer's process id, the first hex
# digits of the kernel's boot id and the process's start time (clock ticks since boot). A pid alone is
# reused; with its start time and the boot it names one process, so a killed writer is told apart from a
# live one. OWNER_ROOM: the bytes it may take in a name.
OWNER_ROOM = 40
_OWNER = r"(\d+)\.([0-9a-f]{8})\.(\d+)"
# Created folders get these permissions minus the umask (tempfile.mkdtemp makes 0700 folders).
FOLDER_MODE = 0o777
FILE_MODE = 0o666


def boot_id() -> str:
    """The first 8 hex digits of this boot's id ("00000000" where the kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            text = fh.read().strip().replace("-", "").lower()
    except OSError:
        return "0" * 8
    return text[:8] if re.fullmatch(r"[0-9a-f]{8,}", text) else "0" * 8


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None when there is no
    such process or no /proc to ask."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
        return int(text[text.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


_OWNER_RECORDS: dict[int, str] = {}


def owner_record() -> str:
    """This process's owner record, `{pid}.{boot}.{start}` (see OWNER_ROOM)."""
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


def _leftover_pattern(target: Path, suffix: str) -> re.Pattern:
    tmp, old = _temporary_prefix(target, "tmp", suffix), _temporary_prefix(target, "old")
    return re.compile(rf"^(?:{re.escape(tmp)}{_OWNER}-[A-Za-z0-9_]+{re.escape(suffix)}"
                      rf"|{re.escape(old)}{_OWNER})$")


def remove_stale_temporaries(target: PathLike, suffix: str = "") -> list[Path]:
    """Remove what a killed writer of `target` left beside it: its temporaries and set-aside copies whose
    owner record names a process that is gone. Only this user's regular files and folders whose names
    match that pattern exactly; a link, anything of another user's or of a live process stays."""
    target = Path(target)
    pattern = _leftover_pattern(target, suffix)
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except OSError:
        return []
    removed = []
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        groups = [g for g in match.groups() if g is not None]
        if not owner_gone(int(groups[0]), groups[1], int(groups[2])):
            continue
        path = target.parent / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            continue
        remove_tree(path)
        logger.info("removed %s, left behind by a mirrorbert run that was killed", path)
        removed.append(path)
    return removed


def make_temporary(target: PathLike, folder: bool = False, suffix: str = "") -> Path:
    """A new temporary file (or `folder`) beside `target`, created exclusively and never through a link,
    whose name carries this process's owner record; a killed writer's leftovers there are removed first
    (`remove_stale_temporaries`). `suffix` ends the file's name (`.npy`: numpy keeps a name it ends)."""
    target = Path(target)
    remove_stale_temporaries(target, suffix)
    prefix = f"{_temporary_prefix(target, 'tmp', suffix)}{owner_record()}-"
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=target.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
    os.close(fd)
    return Path(name)


def open_temporary(path: PathLike, mode: str = "wb"):
    """A temporary (one `make_temporary` made, or a new file inside a temporary folder), opened for writing
    without following a link at its name (it is emptied, except with mode "r+b"): what a writer hands a
    library instead of the path, which the library would open following links."""
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
    """tempfile.mkdtemp makes 0700 folders (and some writers 0600 files); a finished output gets the usual
    umask-based modes, like any folder the user would have made."""
    umask = current_umask()
    folder = Path(folder)
    below = [Path(root) / name for root, dirs, files in os.walk(folder) for name in dirs + files]  # links not followed
    for path in (folder, *below):
        with contextlib.suppress(OSError):
            st = os.lstat(path)  # a link is never followed (chmod would change its target)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(path, FOLDER_MODE & ~umask)
            elif stat.S_ISREG(st.st_mode):
                os.chmod(path, FILE_MODE & ~umask)


def replace_file(path: PathLike, data: str | bytes, option: str = "") -> Path:
    """Write `data` into `path` under an exclusive temporary name beside it (created with O_EXCL, never
    through a link) and rename it into place; inside a folder this run owns (no policy checks). A full disk
    is one UserError naming `path` (and `option`), the temporary removed."""
    path = Path(path)
    with write_errors(path, option):
        return _replace_file(path, data)


def _replace_file(path: Path, data: str | bytes) -> Path:
    name = make_temporary(path)
    try:
        with open_temporary(name) as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(name, FILE_MODE & ~current_umask())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise
    return path
