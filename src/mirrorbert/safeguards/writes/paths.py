"""Where an output is, what is there, and which paths it may never be: the path rules of the write policy.

An output may not be, contain or lie inside an input, nor be or contain the current or the home directory;
two outputs may not overlap; a link at an output's own name is never followed (`locate`), links above it are.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator, Mapping

from mirrorbert.errors import UserError

# Names of mirrorbert's own locks and temporaries (an interrupted write may leave them behind).
OWN_TEMPORARY = re.compile(r"^\.(.+\.(lock|tmp(-.*)?|tmp\.npy|old-[0-9a-f.]+)|mirrorbert-write-test-.*)$")
# The longest file name (bytes) when the filesystem cannot say (Linux, macOS: 255).
NAME_MAX = 255

PathLike = str | os.PathLike
# option name -> one path, several paths (e.g. --corpus A B), or None
Inputs = Mapping[str, "PathLike | list[PathLike] | tuple[PathLike, ...] | None"]


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


def mode_words(mode: int) -> str:
    """What a file mode is, in words ("a FIFO (named pipe)", "a character device", ...)."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def kind_of(path: PathLike, follow: bool = True) -> str | None:
    """What is at `path` in words ("a FIFO (named pipe)", "a character device", ...); None when nothing is."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:  # FileNotFoundError included
        return None
    return mode_words(st.st_mode)


def check_not_special(path: PathLike, option: str, shown: Any = None) -> None:
    """Refuse a path holding (or linking to) a device, FIFO or socket: mirrorbert replaces only files and folders."""
    kind = kind_of(path)
    if kind not in (None, "a file", "a folder"):
        raise UserError(f"{option} {shown if shown is not None else path}: is {kind}; mirrorbert only writes "
                        f"regular files and folders, and never replaces anything else")


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


def link_words(path: Path) -> str:
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


def check_no_dangling_link(path: PathLike, option: str) -> None:
    """Refuse a path with a link to nothing among its folders: creating the folders would create the link's
    target, somewhere the path does not say (a link at the output's own name is `check_replaceable`'s)."""
    lexical = Path(os.path.abspath(os.path.expanduser(str(path))))
    for folder in lexical.parents:
        if os.path.islink(folder) and not os.path.exists(folder):
            raise UserError(f"{option} {path}: {folder} is {link_words(folder)}; mirrorbert never creates a "
                            f"link's target: create it or remove the link")


def check_append_folder(path: PathLike, option: str) -> None:
    """A folder files are added to (a log or cache folder): a folder, a link to one (a cache moved to another
    disk), or nothing yet; a link to nothing, or anything but a folder, is refused."""
    check_no_dangling_link(path, option)
    where = locate(path)
    if os.path.islink(where) and not os.path.exists(where):
        raise UserError(f"{option} {path} is {link_words(where)}; mirrorbert never writes through a link: "
                        f"create the folder it names or remove the link")
    if os.path.exists(where) and not os.path.isdir(where):
        raise UserError(f"{option} {path} exists and is not a folder")


def existing_ancestor(path: Path, option: str) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise UserError(f"{option} {path}: {candidate} is a file, not a folder")
            return candidate
    return Path("/")  # pragma: no cover - the root always exists
