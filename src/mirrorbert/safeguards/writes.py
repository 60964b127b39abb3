"""The write policy: every path any mirrorbert command writes goes through this module.

Everything is checked before a model or any data is loaded, so that a mistake costs a second, not a
finished run. The rules (also in docs/guide/training.md, "What mirrorbert will and will not write"):

* An output (model folder, checkpoint folder, .npy/JSON/Markdown file, report, plot folder, log
  folder, cache) may not be, contain or lie inside any input (`--model`, `--data`, `--data-dir`,
  `--corpus`, `--config`, `--resume`, ...), and may not be or contain the current or the home
  directory (a fresh subfolder of either, such as `./out`, is fine).
* Two outputs of one command are never the same path, nor one inside the other.
* An existing file or folder is replaced only with `--overwrite`; a folder only when mirrorbert can prove
  it wrote everything in it: its marker (`MARKER`, JSON) lists the files mirrorbert wrote with their size
  and SHA-256, and a folder holding any other file, a listed file whose content no longer matches, or one
  listed without a digest, is refused, naming the first one. A `step-N` checkpoint (or `best-model`)
  proves its files the same way through its manifest. A folder without a marker is never replaced: what
  a file says about itself is not proof.
* A link at an output's own name is never followed: without `--overwrite` it is refused like any
  existing file, with it the link itself is replaced (its target, even a missing one, is never written).
  Links among the folders above an output are resolved as usual. The folder an output is written in is
  opened at the start and must still be that folder at the final rename (a folder swapped for a link
  meanwhile is refused). A mount point is never replaced: a rename cannot replace it.
* Only a regular file or a folder is ever replaced: a device, FIFO or socket (or a link to one) is
  refused, with or without `--overwrite`; a folder is removed with `remove_tree`, which unlinks a
  symlink instead of following it (a symlinked `step-N` loses the link, never the target's files).
* One run at a time per output: an `fcntl.flock` on a lock file beside it, released by the kernel
  when the process ends (so a killed run never leaves a stale lock). The lock file is created with
  `O_CREAT|O_EXCL|O_NOFOLLOW`; a symlink or anything but a regular file at its path is refused, and an
  existing regular file there is locked read-only and never written, truncated or removed unless it
  is a lock record of mirrorbert's own (a run killed before it could remove it).
* Files and folders are written under a temporary name beside the target, created exclusively without
  following links (`mkstemp`/`mkdtemp`), and renamed into place; a temporary name that would pass the
  filesystem's name limit is shortened (a hash of the name), so any name the filesystem accepts works.
  The name carries its writer's owner record (pid, boot and start time: `make_temporary`), so the next
  writer of the same target removes what a killed run left there (`kill -9` runs no cleanup), and only
  that: this user's files and folders of that exact pattern whose writer is gone, never a link.
* A write that fails for want of space, quota, a writable filesystem or a name the filesystem accepts
  (`ENOSPC`, `EDQUOT`, `EROFS`, `ENAMETOOLONG`, ...), or because the path to it cannot hold a folder (a
  file or a missing link target in it, `/proc`), ends in one `UserError` line naming the output and
  what was missing; its temporaries are removed and what was there before is left as it was. A file
  written through a memory map is preallocated (`posix_fallocate`) first, so a full disk is that error,
  not a SIGBUS.
* What goes out of a model folder (push, its dry run) is regular files inside it only: a symlink,
  device, FIFO or socket there is refused, naming it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

# Written into every folder this tool creates (trained models, MLM/GR outputs, plot folders, reproduce outputs).
MARKER = ".mirrorbert-output"
MARKER_FORMAT = 1
# The marker's kind of a `reproduce` output: such a folder is continued (it is a cache) without --overwrite.
REPRODUCE_KIND = "reproduce"
# Where a resumable kind of output keeps its cache (see `foreign_file`).
RESUMABLE_CACHE: dict[str, str] = {REPRODUCE_KIND: "cells/"}
# Names of mirrorbert's own locks and temporaries (an interrupted write may leave them behind).
OWN_TEMPORARY = re.compile(r"^\.(.+\.(lock|tmp(-.*)?|tmp\.npy|old-[0-9a-f.]+)|mirrorbert-write-test-.*)$")
STEP_DIR = re.compile(r"^step-\d+$")
# A marker or checkpoint manifest larger than this is not one of ours (it is read whole to check it).
RECORD_LIMIT = 64 << 20
# A temporary's owner record in its name, `{pid}.{boot}.{start}`: the writer's process id, the first hex
# digits of the kernel's boot id and the process's start time (clock ticks since boot). A pid alone is
# reused; with its start time and the boot it names one process, so a killed writer is told apart from a
# live one. OWNER_ROOM: the bytes it may take in a name.
OWNER_ROOM = 40
_OWNER = r"(\d+)\.([0-9a-f]{8})\.(\d+)"
BEST_MODEL = "best-model"
# Created folders get these permissions minus the umask (tempfile.mkdtemp makes 0700 folders).
FOLDER_MODE = 0o777
FILE_MODE = 0o666
# The longest file name (bytes) when the filesystem cannot say (Linux, macOS: 255).
NAME_MAX = 255
# Errors of a write that the user fixes by freeing space or choosing another place: one line, no traceback.
WRITE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only filesystem", errno.ENAMETOOLONG: "file name too long",
                errno.EFBIG: "file too large for the filesystem", errno.EIO: "input/output error"}
# The same errors as libraries that do not raise OSError spell them (safetensors, torch's zip writer).
_WRITE_TEXTS = (("No space left on device", errno.ENOSPC), ("StorageFull", errno.ENOSPC),
                ("Disk quota exceeded", errno.EDQUOT), ("Read-only file system", errno.EROFS),
                ("File name too long", errno.ENAMETOOLONG), ("file write failed", errno.ENOSPC))
LOCK_RECORD = "mirrorbert lock, pid "

PathLike = str | os.PathLike
# option name -> one path, several paths (e.g. --corpus A B), or None
Inputs = Mapping[str, "PathLike | list[PathLike] | tuple[PathLike, ...] | None"]


# --------------------------------------------------------------------------- names, kinds, removal
def name_max(folder: PathLike) -> int:
    """The longest file name (bytes) the filesystem of `folder` (or its nearest existing ancestor) accepts."""
    for candidate in (Path(folder), *Path(folder).parents):
        try:
            return int(os.pathconf(candidate, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return NAME_MAX  # pragma: no cover


def _bytes(name: str) -> bytes:
    return os.fsencode(name)


def own_name(path: PathLike, tag: str, room: int = 0) -> str:
    """The name of one of mirrorbert's own files beside `path`: `.{name}.{tag}` (a lock, a temporary, a folder
    set aside), cut and given a hash of the whole name where it would pass the filesystem's limit (`room`:
    bytes a caller still appends, such as mkstemp's random part)."""
    path = Path(path)
    name, tail = path.name, f".{tag}"
    limit = name_max(path.parent) - room
    full = f".{name}{tail}"
    if len(_bytes(full)) <= limit:
        return full
    digest = hashlib.sha256(_bytes(name)).hexdigest()[:12]
    keep = max(1, limit - len(_bytes(tail)) - len(digest) - 2)
    cut = os.fsdecode(_bytes(name)[:keep])
    return f".{cut}~{digest}{tail}"


def check_name_length(path: PathLike, option: str) -> None:
    """Refuse, in one line naming the option, a path with a part longer than its filesystem accepts."""
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    for part in path.parts[1:]:
        size = len(_bytes(part))
        if size > NAME_MAX or size > name_max(path.parent):
            limit = min(NAME_MAX, name_max(path.parent))
            raise UserError(f"{option} {path}: a name of {size} bytes in it is longer than the filesystem allows "
                            f"({limit}); choose a shorter name")


_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symlink", stat.S_IFDIR: "a folder", stat.S_IFREG: "a file"}


def kind_of(path: PathLike, follow: bool = True) -> str | None:
    """What is at `path` in words ("a FIFO (named pipe)", "a character device", ...); None when nothing is."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    return _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")


def check_not_special(path: PathLike, option: str, shown: Any = None) -> None:
    """Refuse a path holding (or linking to) a device, FIFO or socket: mirrorbert replaces only files and folders."""
    kind = kind_of(path)
    if kind not in (None, "a file", "a folder"):
        raise UserError(f"{option} {shown if shown is not None else path}: is {kind}; mirrorbert only writes "
                        f"regular files and folders, and never replaces anything else")


def remove_tree(path: PathLike) -> None:
    """Remove a folder mirrorbert wrote; a symlink (to a folder or anything else) is unlinked, never followed.

    `shutil.rmtree` itself never follows links below the top (it works on file descriptors); this adds the
    top: rmtree refuses a symlink, which used to leave such a link in place or end in a traceback.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- temporaries and their owners
def _boot_id() -> str:
    """The first 8 hex digits of this boot's id ("00000000" where the kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            text = fh.read().strip().replace("-", "").lower()
    except OSError:
        return "0" * 8
    return text[:8] if re.fullmatch(r"[0-9a-f]{8,}", text) else "0" * 8


def _start_ticks(pid: int) -> int | None:
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
        _OWNER_RECORDS[pid] = f"{pid}.{_boot_id()}.{_start_ticks(pid) or 0}"
    return _OWNER_RECORDS[pid]


def owner_gone(pid: int, boot: str, start: int) -> bool:
    """True only when the process an owner record names cannot be running: it was of another boot, no
    process has its id, or the one that has it started at another time (the id was reused)."""
    here = _boot_id()
    if boot != here and here != "0" * 8:
        return True
    ticks = _start_ticks(pid)
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
    room = OWNER_ROOM + (8 + len(_bytes(suffix)) if kind == "tmp" else 0)
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
        return f"{where} is {_link_words(Path(where))} (mirrorbert never writes through a link)"
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
        need = f", about {_human(needed_bytes)} needed" if needed_bytes else ""
        have = f" ({_human(free)} free in {target.parent}{need})" if free is not None else ""
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
        os.chmod(name, FILE_MODE & ~_umask())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise
    return path


def copy_regular_file(source: PathLike, target: PathLike, option: str, shown: Any, link: bool = False) -> None:
    """Copy (or hard-link, where `link` and the filesystem allow) the regular file `source` to a new `target`.

    The source is opened without following a link and checked to be a regular file on the open descriptor
    (what goes out, such as a push, holds only regular files: a link to a token elsewhere is refused, naming
    it); the target is created exclusively, never through a link.
    """
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        kind = kind_of(source, follow=False) or "missing"
        why = kind if exc.errno in (errno.ELOOP, errno.ENXIO) else os.strerror(exc.errno or 0)
        raise UserError(f"{option} {shown}: {source} is {why}; only regular files inside the folder are "
                        f"published") from None
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{option} {shown}: {source} is {_KINDS.get(stat.S_IFMT(st.st_mode), 'a special file')}; "
                            f"only regular files inside the folder are published")
        if link:
            try:
                os.link(source, target, follow_symlinks=False)
                if os.path.samestat(os.lstat(target), st):
                    return
                os.unlink(target)  # replaced between the check and the link: copy from the checked descriptor
            except OSError:
                pass
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# --------------------------------------------------------------------------- path rules
def resolve(path: PathLike) -> Path:
    """Absolute, `~` expanded, every symlink resolved (where a path leads: for the overlap rules)."""
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def locate(path: PathLike) -> Path:
    """Where an output is written: absolute, `~` expanded, the links among its folders resolved, but not a
    link at its own name, which is never followed (a write replaces such a link, never its target)."""
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    if path.name in ("", ".", ".."):
        return resolve(path)
    return Path(os.path.realpath(path.parent)) / path.name


def _link_words(path: Path) -> str:
    """`a symlink to X` (`, which does not exist` when dangling), for a refusal naming a link at an output."""
    try:
        target = os.readlink(path)
    except OSError:
        return "a symlink"
    missing = "" if os.path.exists(path) else ", which does not exist"
    return f"a symlink to {target}{missing}"


def _inside(child: Path, parent: Path) -> bool:
    """`child` equals `parent` or lies somewhere below it (both already resolved)."""
    return child == parent or parent in child.parents


def _each_input(inputs: Inputs) -> Iterator[tuple[str, PathLike]]:
    for name, value in inputs.items():
        if name == "--data-dir" and not value:  # every command's --data-dir defaults to $MIRRORBERT_DATA
            value = os.environ.get("MIRRORBERT_DATA")
        for item in (value if isinstance(value, (list, tuple)) else [value]):
            if item:
                yield name, item


def check_not_overlapping(path: PathLike, option: str, inputs: Inputs, protect_cwd: bool = True) -> Path:
    """Refuse an output that is, contains or lies inside an input, or is/contains the cwd or home."""
    target = resolve(path)
    protected: list[tuple[str, Path]] = []
    if protect_cwd:
        protected.append(("the current directory", Path.cwd().resolve()))
        home = os.environ.get("HOME")
        if home:
            protected.append(("the home directory", resolve(home)))
    for where, folder in protected:
        if _inside(folder, target):
            relation = "is" if folder == target else "contains"
            raise UserError(f"{option} {path}: refusing to write there, it {relation} {where} ({folder})")
    for name, value in _each_input(inputs):
        if not Path(os.path.expanduser(str(value))).exists():
            continue  # a hub id or a missing file is not a folder we could damage
        source = resolve(value)
        if _inside(source, target) or _inside(target, source):
            if source == target:
                relation = "is"
            elif _inside(source, target):
                relation = "contains"
            else:
                relation = "lies inside"
            raise UserError(f"{option} {path}: refusing to write there, it {relation} the input {name} {value}")
    return target


def check_not_nested(a: PathLike, a_option: str, b: PathLike, b_option: str) -> None:
    """Two output locations that overlap would overwrite each other (e.g. --output X --report X)."""
    ra, rb = resolve(a), resolve(b)
    if ra == rb:
        raise UserError(f"{a_option} {a} and {b_option} {b} are the same path (outputs may not overlap); "
                        f"give each its own")
    if _inside(ra, rb) or _inside(rb, ra):
        raise UserError(f"{a_option} {a} and {b_option} {b} overlap; give them separate locations")


# --------------------------------------------------------------------------- markers
def _read_record(path: Path) -> Any:
    """The JSON of a marker or manifest at `path`: a regular file (not a link, FIFO or device, checked on
    the open descriptor) of at most RECORD_LIMIT bytes; None when there is none or it is anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_LIMIT:
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(RECORD_LIMIT + 1)
    from mirrorbert.safeguards.readback import json_depth_ok

    if not json_depth_ok(raw):
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def read_marker(folder: PathLike) -> dict[str, Any] | None:
    """The folder's marker as a dict; None without one (a link or special file there is none). An older
    plain-text marker, or one that cannot be read, lists no files."""
    path = Path(folder) / MARKER
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    data = _read_record(path)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list) \
            or not all(isinstance(name, str) for name in data["files"]):
        return {"kind": "output", "files": None}
    return data


def _files_below(folder: Path) -> list[str]:
    """Relative paths of every non-folder entry below `folder` (links are not followed), sorted."""
    found = []
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        for name in files + [d for d in dirs if (base / d).is_symlink()]:
            rel = (base / name).relative_to(folder).as_posix()
            if rel != MARKER:
                found.append(rel)
    return sorted(found)


def _digest(path: Path) -> list | None:
    """[size, sha256] of a regular file, ["symlink", target] of a link (never followed), None if absent or
    anything else (a FIFO planted there is never read: it would wait forever)."""
    try:
        if os.path.islink(path):
            return ["symlink", os.readlink(path)]
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as fh:
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in _DIGESTS:  # a check and the rename after it each ask: large files are read once
            digest = hashlib.sha256()
            try:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    digest.update(block)
            except OSError:
                return None
            _DIGESTS[key] = digest.hexdigest()
    return [st.st_size, _DIGESTS[key]]


# (device, inode, size, mtime, ctime) -> SHA-256 of a file this process read: any change to the file
# changes its ctime, which no caller can set back.
_DIGESTS: dict[tuple, str] = {}


def _is_digest(value: Any) -> bool:
    """A recorded [size, sha256] (or ["symlink", target] of a link mirrorbert made): what proves a listed
    file is the one mirrorbert wrote."""
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not isinstance(value[1], str):
        return False
    if value[0] == "symlink":
        return bool(value[1])
    return (isinstance(value[0], int) and not isinstance(value[0], bool) and value[0] >= 0
            and re.fullmatch(r"[0-9a-f]{64}", value[1]) is not None)


def proven(path: Path, recorded: Any) -> bool:
    """`path` is a regular file whose size and SHA-256 are the `recorded` ones, or a link to the recorded
    target (a real record: a missing, null or malformed one proves nothing)."""
    if not _is_digest(recorded):
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if recorded[0] == "symlink":
        return stat.S_ISLNK(st.st_mode) and _digest(path) == ["symlink", recorded[1]]
    if not stat.S_ISREG(st.st_mode) or st.st_size != recorded[0]:
        return False
    return _digest(path) == [recorded[0], recorded[1]]


def mark_folder(folder: PathLike, kind: str = "output", files: Iterable[str] = (),
                being_written: Iterable[str] = ()) -> None:
    """Claim a folder as ours, listing the files mirrorbert wrote there with their size and SHA-256 (a
    checkpoint root lists none: its `step-N` checkpoints carry manifests). A later `--overwrite` replaces
    the folder only while it holds nothing but these files, unchanged. `being_written`: listed without a
    digest (a run about to write them may be killed halfway); such a file proves nothing until recorded.
    """
    folder = Path(folder)
    pending = set(being_written)
    listed = sorted(set(files) | pending)
    digests = {name: None if name in pending else _digest(folder / name) for name in listed}
    text = jsonio.dumps({"written_by": "mirrorbert", "format": MARKER_FORMAT, "kind": kind, "files": listed,
                       "digests": digests}, indent=1) + "\n"
    replace_file(folder / MARKER, text)


def checkpoint_stray(folder: Path) -> Path | None:
    """The first file below a `step-N` checkpoint (or `best-model`) that its manifest does not prove: not
    listed, or not of the listed size and SHA-256. Without a readable manifest nothing is proven (the
    first file is returned); a checkpoint with its own marker is judged by that marker instead."""
    if os.path.lexists(folder / MARKER):
        return foreign_file(folder)
    manifest = _read_record(folder / "manifest.json")
    files = manifest.get("files") if isinstance(manifest, dict) else None
    below = _files_below(folder)
    for rel in below:
        if rel == "manifest.json" and isinstance(files, dict):
            continue
        record = files.get(rel) if isinstance(files, dict) else None
        expected = [record.get("size"), record.get("sha256")] if isinstance(record, dict) else None
        if not proven(folder / rel, expected):
            return folder / rel
    return None


def foreign_file(folder: PathLike, cache_prefix: str | None = None) -> Path | None:
    """The first file below `folder` that mirrorbert cannot prove it wrote, or None when all are ours.

    Ours: a file the folder's marker lists with the size and SHA-256 it still has; anything in a subfolder
    (at any depth) with its own marker that proves it; in a marked folder, a `step-N` checkpoint or
    gloss-pretrain's `best-model` whose manifest proves its files; mirrorbert's own locks and temporaries.
    A folder without a marker, or whose marker lists nothing (older mirrorbert), holds only foreign files.
    Files under `cache_prefix` count by being listed, not by content: a continued run sets a damaged cache
    file aside itself (renamed, never deleted).
    """
    folder = Path(folder)
    marker = read_marker(folder)
    listed = set(marker["files"]) if marker and marker.get("files") is not None else set()
    digests = marker.get("digests") if marker and isinstance(marker.get("digests"), dict) else {}
    trusted = {rel for rel in listed if cache_prefix and rel.startswith(cache_prefix)}
    return _foreign_below(folder, folder, listed, marker is not None, digests, trusted)


def _foreign_below(root: Path, current: Path, listed: set[str], marked: bool, digests: dict,
                   trusted: set[str]) -> Path | None:
    for entry in sorted(current.iterdir()):
        name = entry.name
        if name == MARKER or OWN_TEMPORARY.match(name):
            continue
        if not entry.is_dir() or entry.is_symlink():
            rel = entry.relative_to(root).as_posix()
            if rel in trusted and not entry.is_symlink():
                continue  # a continued run's cache file: listed is enough (it is set aside, never deleted)
            if rel not in listed or not proven(entry, digests.get(rel)):
                return entry  # not listed, listed without a digest, or changed since: not provably ours
            continue
        if (entry / MARKER).is_file() and not (entry / MARKER).is_symlink():
            stray = foreign_file(entry)
        elif marked and (STEP_DIR.match(name) or name == BEST_MODEL):  # a checkpoint: its manifest proves it
            stray = checkpoint_stray(entry)
        else:
            stray = _foreign_below(root, entry, listed, marked, digests, trusted)
        if stray is not None:
            return stray
    return None


def claim_files(folder: PathLike, rel_paths: Iterable[str], kind: str) -> None:
    """Add files to the folder's marker *before* writing them, so an interrupted run's files stay ours
    (listed without a digest until `record_files` runs)."""
    marker = read_marker(folder) or {}
    old = marker.get("digests") if isinstance(marker.get("digests"), dict) else {}
    pending = {name for name, digest in old.items() if digest is None} | set(rel_paths)
    mark_folder(folder, kind, marker.get("files") or [], being_written=pending)


def record_files(folder: PathLike, kind: str) -> None:
    """List everything below `folder` in its marker (files under a subfolder with its own marker excepted).

    Only for a folder this run holds the lock on and found holding nothing but mirrorbert's files:
    whatever is below it now was written by this run or an earlier one.
    """
    folder = Path(folder)
    marker = read_marker(folder) or {}
    owned = set()
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        dirs[:] = [d for d in dirs if not (base / d / MARKER).is_file() and not OWN_TEMPORARY.match(d)]
        owned.update((base / f).relative_to(folder).as_posix() for f in files if not OWN_TEMPORARY.match(f))
        owned.update((base / d).relative_to(folder).as_posix() for d in dirs if (base / d).is_symlink())  # links
    owned.discard(MARKER)
    kept = {f for f in marker.get("files") or [] if (folder / f).exists()}
    mark_folder(folder, kind, owned | kept)


def discard_folder(folder: PathLike) -> None:
    """Remove a folder mirrorbert wrote (the caller checked `foreign_file`; a link there loses only the link):
    renamed aside, then deleted."""
    folder = locate(folder)
    remove_stale_temporaries(folder)
    aside = set_aside_name(folder)
    os.replace(folder, aside)
    remove_tree(aside)


# --------------------------------------------------------------------------- existing outputs
def _check_link_or_mount(path: Path, shown: Any, overwrite: bool, option: str, into: bool = False) -> bool:
    """True when `path` is a link (replaced only with --overwrite, and then as a link: never followed);
    a mount point is refused (a rename cannot replace it) unless the output is written `into` it."""
    if path.is_symlink():
        if not overwrite:
            raise UserError(f"{option} {shown} already exists ({_link_words(path)}); pass --overwrite to replace "
                            f"the link (mirrorbert never writes through it)")
        return True
    if not into and path.is_dir() and os.path.ismount(path):
        raise UserError(f"{option} {shown} is a mount point: it cannot be replaced atomically (mirrorbert writes "
                        f"beside an output and renames it into place); name a new folder inside it instead")
    return False


def check_replaceable(path: PathLike, overwrite: bool, option: str = "--output", resume_kind: str | None = None
                      ) -> Path:
    """An existing folder is replaced only with --overwrite, and only when mirrorbert can prove it wrote all
    of it (`foreign_file`); a link at `path` only with --overwrite, and then only the link.

    `resume_kind`: an empty folder, or one whose marker has this kind (and nothing foreign), is continued
    without --overwrite (reproduce's cache).
    """
    check_name_length(path, option)
    shown, path = path, locate(path)
    check_not_special(path, option, shown)
    into = resume_kind is not None and not overwrite  # a continued output is written into, never renamed
    if not os.path.lexists(path) or _check_link_or_mount(path, shown, overwrite, option, into):
        return path
    if not path.is_dir():
        raise UserError(f"{option} {shown} exists and is not a folder")
    empty = all(OWN_TEMPORARY.match(p.name) for p in path.iterdir())  # nothing, or only our leftovers
    marker = read_marker(path)
    resumable = resume_kind is not None and (empty or (marker is not None and marker.get("kind") == resume_kind))
    if not overwrite and not resumable:
        raise UserError(f"{option} {shown} already exists; pass --overwrite to replace it")
    if empty:
        return path  # an empty folder loses nothing
    if marker is None or marker.get("files") is None:
        why = "it has no " + MARKER if marker is None else f"its {MARKER} (older mirrorbert) lists no files"
        raise UserError(f"{option} {shown}: {'--overwrite' if overwrite else 'mirrorbert'} only replaces a folder "
                        f"mirrorbert wrote, listing its files ({why}); move it away or choose another folder")
    continuing = resumable and not overwrite and marker.get("kind") == resume_kind
    stray = foreign_file(path, RESUMABLE_CACHE.get(resume_kind) if continuing else None)
    if stray is not None:
        raise UserError(f"{option} {shown}: holds {stray}, which mirrorbert did not write (or which changed "
                        f"since: its marker must record the size and SHA-256 it has); move it away or choose "
                        f"another folder")
    return path


def check_replaceable_file(path: PathLike, overwrite: bool, option: str = "--output") -> Path:
    """An existing file is replaced only with --overwrite (a link there: the link, never its target); a folder
    is never a file output."""
    check_name_length(path, option)
    shown, path = path, locate(path)
    check_not_special(path, option, shown)
    if not os.path.lexists(path) or _check_link_or_mount(path, shown, overwrite, option):
        return path
    if path.is_dir():
        raise UserError(f"{option} {shown} is a folder; expected a file name")
    if not overwrite:
        raise UserError(f"{option} {shown} already exists; pass --overwrite to replace it")
    return path


def check_output_dir(path: PathLike, overwrite: bool, option: str = "--output") -> Path:
    """Refuse early (before any training) to clobber a user's folder (or, with --overwrite, a foreign one)."""
    return check_replaceable(path, overwrite, option)


def fix_folder_mode(folder: PathLike) -> None:
    """tempfile.mkdtemp makes 0700 folders (and some writers 0600 files); a finished output gets the usual
    umask-based modes, like any folder the user would have made."""
    umask = _umask()
    folder = Path(folder)
    below = [Path(root) / name for root, dirs, files in os.walk(folder) for name in dirs + files]  # links not followed
    for path in (folder, *below):
        with contextlib.suppress(OSError):
            st = os.lstat(path)  # a link is never followed (chmod would change its target)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(path, FOLDER_MODE & ~umask)
            elif stat.S_ISREG(st.st_mode):
                os.chmod(path, FILE_MODE & ~umask)


# --------------------------------------------------------------------------- atomic writers
class _Folder:
    """The folder an output is written in, opened (never through a link) when the write starts: the final
    rename happens in this very folder, and only while its path still leads to it (a folder swapped for a
    link or another folder meanwhile is refused, the temporary removed from the folder it was made in)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def check(self, option: str, shown: Any) -> None:
        try:
            st = os.lstat(self.path)
            now = (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
            what = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
        except OSError:
            now, what = None, "gone"
        if now != self.identity:
            what = "another folder" if now is not None else what
            raise UserError(f"{option} {shown}: its folder {self.path} was replaced while mirrorbert was writing "
                            f"(it is now {what}); nothing was written there")

    def explain(self, exc: BaseException, option: str, shown: Any) -> None:
        """A write that failed because its folder was swapped meanwhile fails as that (not as the error the
        swap caused, such as a temporary no longer found)."""
        if isinstance(exc, Exception):
            self.check(option, shown)  # raises the folder's own error when it was swapped

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove `name` from this folder (a folder with everything in it; a link is unlinked, never followed)."""
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if sys.version_info >= (3, 11):
                shutil.rmtree(name, dir_fd=self.fd, ignore_errors=True)
            else:  # pragma: no cover - Python 3.10: through the descriptor's /proc entry where there is one
                here = Path(f"/proc/self/fd/{self.fd}")
                shutil.rmtree((here if here.is_dir() else self.path) / name, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _open_folder(final: Path, shown: Any, option: str) -> _Folder:
    """Create `final`'s folder where needed and open it (see `_Folder`)."""
    check_no_dangling_link(shown, option)
    _existing_ancestor(final.parent, option)  # a file where a folder should be: one line, not FileExistsError
    with write_errors(shown, option):
        final.parent.mkdir(parents=True, exist_ok=True)
        return _Folder(final.parent)


@contextlib.contextmanager
def atomic_output_dir(final: PathLike, overwrite: bool = False, kind: str = "output",
                      keep_empty: bool = True, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final` in (almost) one rename.

    Nothing the user had is lost: on failure the temporary folder is removed and `final` is untouched;
    an existing `final` (all of it mirrorbert's, checked) is moved aside first and only deleted after
    the new one is in place. A link at `final` is replaced (with `overwrite`), never followed.
    `keep_empty=False`: when nothing was written, nothing is created (an existing `final` stays).
    A full disk (or quota, read-only filesystem, name too long) is one UserError naming `final`.
    """
    shown, final = final, locate(final)
    check_output_dir(final, overwrite, option)
    folder = _open_folder(final, shown, option)
    try:
        with write_errors(shown, option):
            tmp = make_temporary(final, folder=True)
        try:
            with write_errors(shown, option):
                yield tmp
                if not keep_empty and not _files_below(tmp):
                    folder.remove(tmp.name)
                    return
                mark_folder(tmp, kind, _files_below(tmp))
                fix_folder_mode(tmp)
            check_output_dir(final, overwrite, option)  # a folder may have appeared there while we worked
            folder.check(option, shown)
            backup = None
            if os.path.lexists(final):
                backup = set_aside_name(final)
                folder.rename(final.name, backup.name)
            folder.rename(tmp.name, final.name)
        except BaseException as exc:
            folder.remove(tmp.name)
            folder.explain(exc, option, shown)
            raise
        if backup is not None:
            folder.remove(backup.name)
    finally:
        folder.close()


@contextlib.contextmanager
def atomic_output_file(final: PathLike, overwrite: bool = False, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary path beside `final` (same suffix); on success it is renamed onto `final`.

    A link at `final` is replaced (with `overwrite`), never followed. Only a regular file is replaced (a
    device, FIFO or socket, or a link to one, is refused). A full disk (or quota, read-only filesystem, name
    too long) is one UserError naming `final`; the temporary is removed on any failure or interrupt.
    """
    shown, final = final, locate(final)
    check_replaceable_file(final, overwrite, option)
    folder = _open_folder(final, shown, option)
    try:
        with write_errors(shown, option):
            tmp = make_temporary(final, suffix=final.suffix)
        try:
            with write_errors(shown, option):
                yield tmp
            check_replaceable_file(final, overwrite, option)  # a file may have appeared there while we worked
            folder.check(option, shown)
            os.chmod(tmp.name, FILE_MODE & ~_umask(), dir_fd=folder.fd)
            folder.rename(tmp.name, final.name)
        except BaseException as exc:
            folder.explain(exc, option, shown)
            raise
        finally:
            folder.remove(tmp.name)
    finally:
        folder.close()


def write_text_atomic(path: PathLike, text: str, overwrite: bool = False, option: str = "--output") -> Path:
    with atomic_output_file(path, overwrite, option) as tmp, open_temporary(tmp) as fh:
        fh.write(text.encode("utf-8"))
    return locate(path)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Write JSON under a temporary name and rename it (inside a folder this run owns; no policy checks)."""
    replace_file(path, jsonio.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


# --------------------------------------------------------------------------- writability / space
def check_no_dangling_link(path: PathLike, option: str) -> None:
    """Refuse a path with a link to nothing among its folders: creating the folders would create the link's
    target, somewhere the path does not say (a link at the output's own name is `check_replaceable`'s)."""
    lexical = Path(os.path.abspath(os.path.expanduser(str(path))))
    for folder in lexical.parents:
        if os.path.islink(folder) and not os.path.exists(folder):
            raise UserError(f"{option} {path}: {folder} is {_link_words(folder)}; mirrorbert never creates a "
                            f"link's target: create it or remove the link")


def check_append_folder(path: PathLike, option: str) -> None:
    """A folder files are added to (a log or cache folder): a folder, a link to one (a cache moved to another
    disk), or nothing yet; a link to nothing, or anything but a folder, is refused."""
    check_no_dangling_link(path, option)
    where = locate(path)
    if os.path.islink(where) and not os.path.exists(where):
        raise UserError(f"{option} {path} is {_link_words(where)}; mirrorbert never writes through a link: "
                        f"create the folder it names or remove the link")
    if os.path.exists(where) and not os.path.isdir(where):
        raise UserError(f"{option} {path} exists and is not a folder")


def _existing_ancestor(path: Path, option: str) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise UserError(f"{option} {path}: {candidate} is a file, not a folder")
            return candidate
    return Path("/")  # pragma: no cover - the root always exists


def check_writable(path: PathLike, option: str, needed_bytes: int = 0, is_file: bool = False,
                   probe_parent: bool = False) -> None:
    """Prove the location can be written by creating (and removing) a file in the nearest existing folder.

    A probe instead of os.access: it also catches read-only mounts, /proc and full disks, and is right for root.
    """
    check_name_length(path, option)
    check_no_dangling_link(path, option)
    path = locate(path)
    check_not_special(path, option)
    if is_file and path.is_dir() and not path.is_symlink():
        raise UserError(f"{option} {path} is a folder; expected a file name")
    start = path.parent if (is_file or probe_parent) else path  # outputs are built in a sibling temp folder
    folder = _existing_ancestor(start, option)
    try:
        fd, probe = tempfile.mkstemp(prefix=".mirrorbert-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise UserError(f"{option} {path}: cannot write in {folder} ({reason})") from None
    if needed_bytes > 0:
        free = shutil.disk_usage(folder).free
        if free < needed_bytes:
            raise UserError(f"{option} {path}: only {_human(free)} free in {folder}, about {_human(needed_bytes)} "
                            f"needed")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def weights_size(model: PathLike | None) -> int:
    """Bytes of weight files in a local model folder (0 for a hub id: the estimate is then skipped)."""
    if not model:
        return 0
    folder = Path(os.path.expanduser(str(model)))
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.iterdir()
               if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".pth"))


# --------------------------------------------------------------------------- locks
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
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
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


# --------------------------------------------------------------------------- one plan per command
@dataclass
class _Output:
    option: str
    path: PathLike
    what: str  # "file" | "folder" | "append" (a log or cache folder: files are added, nothing is replaced)
    resume_kind: str | None = None
    needed_bytes: int = 0
    lock: bool = True


@dataclass
class WritePlan:
    """Everything one command will write, checked in one call before any work.

    >>> plan = WritePlan({"--model": model, "--data-dir": data_dir}, overwrite=args.overwrite)
    >>> plan.file("--output", args.output).file("--report", args.report).folder("--plot-dir", plot_dir)
    >>> with plan.locked(): ...   # checks every rule, then holds one lock per output
    """

    inputs: Inputs
    overwrite: bool = False
    outputs: list[_Output] = field(default_factory=list)

    def file(self, option: str, path: PathLike | None) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "file"))
        return self

    def folder(self, option: str, path: PathLike | None, resume_kind: str | None = None, needed_bytes: int = 0,
               lock: bool = True) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "folder", resume_kind, needed_bytes, lock))
        return self

    def append_folder(self, option: str, path: PathLike | None) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "append", lock=False))
        return self

    def check(self) -> dict[str, Path]:
        """Every rule for every output; returns option -> resolved path. Raises UserError on the first breach."""
        for out in self.outputs:
            check_not_overlapping(out.path, out.option, self.inputs)
        for i, a in enumerate(self.outputs):
            for b in self.outputs[i + 1:]:
                check_not_nested(a.path, a.option, b.path, b.option)
        for out in self.outputs:
            if out.what == "file":
                check_replaceable_file(out.path, self.overwrite, out.option)
                check_writable(out.path, out.option, is_file=True)
            elif out.what == "folder":
                check_replaceable(out.path, self.overwrite, out.option, resume_kind=out.resume_kind)
                check_writable(out.path, out.option, needed_bytes=out.needed_bytes, probe_parent=True)
            else:
                check_append_folder(out.path, out.option)
                check_writable(out.path, out.option)
        return {out.option: locate(out.path) for out in self.outputs}

    def lock(self, stack: contextlib.ExitStack) -> None:
        """One lock per output, held on `stack` (only rank 0 of a torchrun/accelerate job locks)."""
        if int(os.environ.get("RANK", "0") or 0) != 0:
            return
        for out in self.outputs:
            if out.lock and out.what != "append":
                stack.enter_context(folder_lock(out.path, out.option))

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Path]]:
        paths = self.check()
        with contextlib.ExitStack() as stack:
            self.lock(stack)
            yield paths


def check_outputs_avoid(inputs: Inputs, *outputs: tuple[str, PathLike | None]) -> None:
    """The path rules for inputs only the CLI knows about (e.g. --config)."""
    for option, location in outputs:
        if location:
            check_not_overlapping(location, option, inputs)


# --------------------------------------------------------------------------- one call per trainer
def default_checkpoint_dir(output: PathLike, checkpoint_dir: PathLike | None = None) -> Path:
    """Checkpoints live beside the output (`<output>.checkpoints`) so the final folder can be written atomically."""
    if checkpoint_dir:
        return Path(checkpoint_dir)
    return Path(f"{Path(output).as_posix().rstrip('/')}.checkpoints")


def check_checkpoints_proven(root: PathLike, option: str = "--checkpoint-dir") -> None:
    """Before `--overwrite` discards the `step-N` checkpoints and `best-model` of a checkpoint folder, each
    must prove every file in it (`checkpoint_stray`: its manifest's sizes and SHA-256); a link there loses
    only the link, and nothing else in the folder is touched."""
    root = locate(root)
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if not (STEP_DIR.match(entry.name) or entry.name == BEST_MODEL) or entry.is_symlink() or not entry.is_dir():
            continue
        stray = checkpoint_stray(entry)
        if stray is not None:
            raise UserError(f"{option} {root}: --overwrite would discard {entry.name}, which holds {stray}, a file "
                            f"mirrorbert cannot prove it wrote (its manifest must record the size and SHA-256 it "
                            f"has); move it away or choose another folder")


def guard_run(stack: contextlib.ExitStack, *, output: PathLike, overwrite: bool,
              inputs: Inputs, checkpoint_dir: PathLike | None = None,
              checkpoint_option: str = "--checkpoint-dir", resuming: bool = False,
              extra_outputs: Iterable[tuple[str, PathLike | None]] = (),
              extra_files: Iterable[tuple[str, PathLike | None]] = (), model_bytes: int = 0) -> None:
    """All output checks of a training command, before anything is loaded; locks live on `stack`.

    `model_bytes` (size of the starting weights) gives the rough free-space estimate: the output needs
    about one copy, each checkpoint about three (weights plus AdamW's two moments). `extra_outputs`
    are log and cache folders (files are added there, nothing is replaced); `extra_files` single files.
    """
    plan = WritePlan(inputs, overwrite=overwrite).folder("--output", output, needed_bytes=model_bytes)
    for option, location in extra_outputs:
        plan.append_folder(option, location)
    for option, location in extra_files:
        plan.file(option, location)
    plan.check()
    if checkpoint_dir is not None and overwrite and not resuming:
        check_checkpoints_proven(checkpoint_dir, checkpoint_option)
    if checkpoint_dir is not None:  # may be the --resume root: its own rules are check_checkpoint_root's
        check_not_nested(checkpoint_dir, checkpoint_option, output, "--output")
        for option, location in [*extra_outputs, *extra_files]:
            if location:
                check_not_nested(checkpoint_dir, checkpoint_option, location, option)
        check_not_overlapping(checkpoint_dir, checkpoint_option,
                              {k: v for k, v in inputs.items() if k != "--resume"})
        check_writable(checkpoint_dir, checkpoint_option, needed_bytes=3 * model_bytes)
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return  # under torchrun/accelerate the job's rank 0 holds the locks and owns the checkpoint folder
    plan.lock(stack)
    if checkpoint_dir is not None:
        stack.enter_context(folder_lock(checkpoint_dir, checkpoint_option))


__all__ = [
    "default_checkpoint_dir",
    "MARKER", "REPRODUCE_KIND", "WritePlan", "atomic_output_dir", "atomic_output_file", "check_not_nested",
    "check_not_overlapping", "check_output_dir", "check_outputs_avoid", "check_replaceable", "check_replaceable_file",
    "check_name_length", "check_not_special", "check_writable", "claim_files", "kind_of", "own_name", "preallocate",
    "check_append_folder", "check_checkpoints_proven", "check_no_dangling_link", "checkpoint_stray", "locate",
    "make_temporary", "open_temporary", "owner_record", "proven", "remove_stale_temporaries", "set_aside_name",
    "remove_tree", "replace_file", "write_error", "write_errors", "discard_folder", "fix_folder_mode", "folder_lock",
    "foreign_file", "guard_run",
    "mark_folder", "read_marker", "record_files", "resolve", "weights_size", "write_json_atomic", "write_text_atomic",
]
