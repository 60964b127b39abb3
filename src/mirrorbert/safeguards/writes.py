"""The write policy: every path any mirrorbert command writes goes through this module.

Everything is checked before a model or any data is loaded, so that a mistake costs a second, not a
finished run. The rules (also in docs/guide/training.md, "What mirrorbert will and will not write"):

* An output (model folder, checkpoint folder, .npy/JSON/Markdown file, report, plot folder, log
  folder, cache) may not be, contain or lie inside any input (`--model`, `--data`, `--data-dir`,
  `--corpus`, `--config`, `--resume`, ...), and may not be or contain the current or the home
  directory (a fresh subfolder of either, such as `./out`, is fine).
* Two outputs of one command are never the same path, nor one inside the other.
* An existing file or folder is replaced only with `--overwrite`; a folder only when mirrorbert
  wrote everything in it: its marker (`MARKER`, JSON) lists the files mirrorbert wrote, and a folder
  holding any other file is refused, naming the first one. A folder without a marker (or with the
  marker of an older mirrorbert, which listed nothing) is never replaced.
* A symlinked output is resolved: the target is written, the link survives.
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
* A write that fails for want of space, quota, a writable filesystem or a name the filesystem accepts
  (`ENOSPC`, `EDQUOT`, `EROFS`, `ENAMETOOLONG`, ...) ends in one `UserError` line naming the output and
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
OWN_TEMPORARY = re.compile(r"^\.(.+\.(lock|tmp(-.*)?|tmp\.npy|old-\d+)|mirrorbert-write-test-.*)$")
STEP_DIR = re.compile(r"^step-\d+$")
# Listed files up to this size are recorded with their SHA-256 (a changed file is no longer ours), larger
# ones (weights) with their size.
DIGEST_LIMIT = 1 << 20
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
        if code is None:
            raise
        raise write_error(target, option, code, needed_bytes) from None


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
    fd, name = tempfile.mkstemp(prefix=own_name(path, "tmp-", room=8), dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
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
    """Absolute, `~` expanded, every symlink resolved (a link's target is what gets written)."""
    return Path(os.path.realpath(os.path.expanduser(str(path))))


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
def read_marker(folder: PathLike) -> dict[str, Any] | None:
    """The folder's marker as a dict; None without one. An older plain-text marker lists no files."""
    path = Path(folder) / MARKER
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"kind": "output", "files": None}
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
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
    """[size, sha256] of a small file, [size, None] of a large one (weights: size only), None if absent or not
    a regular file (a FIFO planted there is never opened: reading it would wait forever)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size > DIGEST_LIMIT:
        return [st.st_size, None]
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            return [st.st_size, hashlib.sha256(fh.read()).hexdigest()]
    return None


def mark_folder(folder: PathLike, kind: str = "output", files: Iterable[str] = (),
                being_written: Iterable[str] = ()) -> None:
    """Claim a folder as ours, listing the files mirrorbert wrote there with their size and SHA-256 (a
    checkpoint root lists none: its `step-N` checkpoints carry manifests). A later `--overwrite` replaces
    the folder only while it holds nothing but these files, unchanged. `being_written`: listed without a
    digest, as any content (a run about to write them may be killed halfway).
    """
    folder = Path(folder)
    pending = set(being_written)
    listed = sorted(set(files) | pending)
    digests = {name: None if name in pending else _digest(folder / name) for name in listed}
    text = jsonio.dumps({"written_by": "mirrorbert", "format": MARKER_FORMAT, "kind": kind, "files": listed,
                       "digests": digests}, indent=1) + "\n"
    replace_file(folder / MARKER, text)


def _checkpoint_files(folder: Path) -> set[str] | None:
    """Files a mirrorbert checkpoint lists in its manifest (it is written last), or None."""
    try:
        files = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return set(files) | {"manifest.json"} if isinstance(files, dict) else None


def foreign_file(folder: PathLike, cache_prefix: str | None = None) -> Path | None:
    """The first file below `folder` that mirrorbert did not write, or None when all are ours.

    Ours: a file the folder's marker lists; anything in a subfolder (at any depth) with its own marker
    that vouches for it; in a marked folder, a `step-N` checkpoint whose manifest lists its files and
    gloss-pretrain's `best-model`; mirrorbert's own locks and temporaries. A folder without a marker,
    or whose marker lists nothing (older mirrorbert), holds only foreign files. Files under
    `cache_prefix` count by being listed, not by content: a continued run sets a damaged cache file
    aside itself (renamed, never deleted).
    """
    folder = Path(folder)
    marker = read_marker(folder)
    listed = set(marker["files"]) if marker and marker.get("files") is not None else set()
    digests = marker.get("digests") if marker and isinstance(marker.get("digests"), dict) else {}
    if cache_prefix:
        digests = {rel: d for rel, d in digests.items() if not rel.startswith(cache_prefix)}
    return _foreign_below(folder, folder, listed, marker is not None, digests)


def _foreign_below(root: Path, current: Path, listed: set[str], marked: bool, digests: dict) -> Path | None:
    for entry in sorted(current.iterdir()):
        name = entry.name
        if name == MARKER or OWN_TEMPORARY.match(name):
            continue
        if not entry.is_dir() or entry.is_symlink():
            rel = entry.relative_to(root).as_posix()
            if rel not in listed:
                return entry
            expected = digests.get(rel)
            if expected is not None and not entry.is_symlink() and _digest(entry) != expected:
                return entry  # changed since mirrorbert wrote it: the user's now
            continue
        if (entry / MARKER).is_file():
            stray = foreign_file(entry)
        elif marked and STEP_DIR.match(name):  # a checkpoint: its manifest lists its files
            inner = _checkpoint_files(entry)
            stray = next((entry / f for f in _files_below(entry) if inner is None or f not in inner), None)
        elif marked and name == BEST_MODEL:  # gloss-pretrain's best epoch in its checkpoint folder
            stray = None
        else:
            stray = _foreign_below(root, entry, listed, marked, digests)
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
    """Remove a folder mirrorbert wrote (the caller checked `foreign_file`): renamed aside, then deleted."""
    folder = resolve(folder)
    aside = folder.with_name(own_name(folder, f"old-{os.getpid()}"))
    os.replace(folder, aside)
    remove_tree(aside)


# --------------------------------------------------------------------------- existing outputs
def check_replaceable(path: PathLike, overwrite: bool, option: str = "--output", resume_kind: str | None = None
                      ) -> Path:
    """An existing folder is replaced only with --overwrite, and only when mirrorbert wrote all of it.

    `resume_kind`: an empty folder, or one whose marker has this kind (and nothing foreign), is continued
    without --overwrite (reproduce's cache).
    """
    check_name_length(path, option)
    shown, path = path, resolve(path)
    check_not_special(path, option, shown)
    if not path.exists():
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
                        f"since); move it away or choose another folder")
    return path


def check_replaceable_file(path: PathLike, overwrite: bool, option: str = "--output") -> Path:
    """An existing file is replaced only with --overwrite; a folder is never a file output."""
    check_name_length(path, option)
    shown, path = path, resolve(path)
    check_not_special(path, option, shown)
    if path.is_dir():
        raise UserError(f"{option} {shown} is a folder; expected a file name")
    if path.exists() and not overwrite:
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
@contextlib.contextmanager
def atomic_output_dir(final: PathLike, overwrite: bool = False, kind: str = "output",
                      keep_empty: bool = True, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final` in (almost) one rename.

    Nothing the user had is lost: on failure the temporary folder is removed and `final` is untouched;
    an existing `final` (all of it mirrorbert's, checked) is moved aside first and only deleted after
    the new one is in place. A symlinked `final` is resolved: the target is replaced, the link kept.
    `keep_empty=False`: when nothing was written, nothing is created (an existing `final` stays).
    A full disk (or quota, read-only filesystem, name too long) is one UserError naming `final`.
    """
    shown, final = final, resolve(final)
    check_output_dir(final, overwrite, option)
    _existing_ancestor(final.parent, option)  # a file where a folder should be: one line, not FileExistsError
    with write_errors(shown, option):
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=own_name(final, "tmp-", room=8), dir=final.parent))
    try:
        with write_errors(shown, option):
            yield tmp
            if not keep_empty and not _files_below(tmp):
                remove_tree(tmp)
                return
            mark_folder(tmp, kind, _files_below(tmp))
            fix_folder_mode(tmp)
        check_output_dir(final, overwrite, option)  # a folder may have appeared there while we worked
    except BaseException:
        remove_tree(tmp)
        raise
    backup = None
    if os.path.lexists(final):
        backup = final.with_name(own_name(final, f"old-{os.getpid()}"))
        os.replace(final, backup)
    os.replace(tmp, final)
    if backup is not None:
        remove_tree(backup)


@contextlib.contextmanager
def atomic_output_file(final: PathLike, overwrite: bool = False, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary path beside `final` (same suffix); on success it is renamed onto `final`.

    A symlinked `final` is resolved: the target is replaced, the link kept. Only a regular file is replaced
    (a device, FIFO or socket is refused). A full disk (or quota, read-only filesystem, name too long) is one
    UserError naming `final`; the temporary is removed on any failure or interrupt.
    """
    shown, final = final, resolve(final)
    check_replaceable_file(final, overwrite, option)
    _existing_ancestor(final.parent, option)
    with write_errors(shown, option):
        final.parent.mkdir(parents=True, exist_ok=True)
        stem = own_name(final.with_name(final.stem), "tmp-", room=8 + len(_bytes(final.suffix)))
        fd, name = tempfile.mkstemp(prefix=stem, suffix=final.suffix, dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        with write_errors(shown, option):
            yield tmp
        check_replaceable_file(final, overwrite, option)  # a file may have appeared there while we worked
        os.chmod(tmp, FILE_MODE & ~_umask())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text_atomic(path: PathLike, text: str, overwrite: bool = False, option: str = "--output") -> Path:
    with atomic_output_file(path, overwrite, option) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return resolve(path)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Write JSON under a temporary name and rename it (inside a folder this run owns; no policy checks)."""
    replace_file(path, jsonio.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


# --------------------------------------------------------------------------- writability / space
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
    path = resolve(path)
    check_not_special(path, option)
    if is_file and path.is_dir():
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
    folder = resolve(folder)
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
                if resolve(out.path).exists() and not resolve(out.path).is_dir():
                    raise UserError(f"{out.option} {out.path} exists and is not a folder")
                check_writable(out.path, out.option)
        return {out.option: resolve(out.path) for out in self.outputs}

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
    "remove_tree", "replace_file", "write_error", "write_errors", "discard_folder", "fix_folder_mode", "folder_lock",
    "foreign_file", "guard_run",
    "mark_folder", "read_marker", "record_files", "resolve", "weights_size", "write_json_atomic", "write_text_atomic",
]
