"""Where an output is, what is there, and which paths it may never be: the path rules of the write policy.

An output may not be, contain or lie inside an input, nor be or contain the current or the home directory;
two outputs may not overlap; a link at an output's own name is never followed (`locate`), links above it are.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Mapping

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import describe_kind

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


def own_name(path: PathLike, tag: str, room: int = 0) -> str:
    """The name of one of mirrorbert's own files beside `path`: `.{name}.{tag}` (a lock, a temporary, a folder
    set aside), cut and given a hash of the whole name where it would pass the filesystem's limit (`room`:
    bytes a caller still appends) or is not valid UTF-8 (only its UTF-8 part is kept then)."""
    path = Path(path)
    name, tail = path.name, f".{tag}"
    limit = name_max(path.parent) - room
    full = f".{name}{tail}"
    plain = os.fsencode(name).decode("utf-8", "ignore")
    if len(os.fsencode(full)) <= limit and plain == name:
        return full
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    keep = max(1, limit - len(os.fsencode(tail)) - len(digest) - 2)
    cut = plain.encode("utf-8")[:keep].decode("utf-8", "ignore")
    return f".{cut}~{digest}{tail}"


def kind_of(path: PathLike, follow: bool = True) -> str | None:
    """What is at `path` in words ("a FIFO", "a character device", ...); None when nothing is."""
    try:
        return describe_kind((os.stat(path) if follow else os.lstat(path)).st_mode)
    except OSError:  # FileNotFoundError included
        return None


def check_place(path: PathLike, option: str) -> Path:
    """The rules of every output's path, returning where it is written (`locate`): each name within the
    filesystem's limit, no link to nothing among its folders, nothing but a file or a folder (or a link to one)
    at it: mirrorbert never replaces a device, FIFO or socket."""
    lexical = Path(os.path.abspath(os.path.expanduser(str(path))))
    limit = min(NAME_MAX, name_max(lexical.parent))
    for part in lexical.parts[1:]:
        size = len(os.fsencode(part))
        if size > limit:
            raise UserError(f"{option} {lexical}: a name of {size} bytes in it is longer than the filesystem allows "
                            f"({limit}); choose a shorter name")
    for folder in lexical.parents:  # creating the folders would create a dangling link's target
        if os.path.islink(folder) and not os.path.exists(folder):
            raise UserError(f"{option} {path}: {folder} is {link_words(folder)}; mirrorbert never creates a "
                            f"link's target: create it or remove the link")
    where = locate(path)
    kind = kind_of(where)
    if kind not in (None, "a file", "a folder"):
        raise UserError(f"{option} {path}: is {kind}; mirrorbert only writes regular files and folders, and never "
                        f"replaces anything else")
    return where


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


def _relation(path: Path, other: Path) -> str | None:
    """How `path` stands to `other` (both resolved): "is", "contains", "lies inside", or None."""
    if path == other:
        return "is"
    if path in other.parents:
        return "contains"
    return "lies inside" if other in path.parents else None


def check_not_overlapping(path: PathLike, option: str, inputs: Inputs) -> Path:
    """Refuse an output that is, contains or lies inside an input, or is/contains the cwd or home."""
    target = resolve(path)
    protected = [("the current directory", Path.cwd().resolve())]
    if os.environ.get("HOME"):
        protected.append(("the home directory", resolve(os.environ["HOME"])))
    for where, folder in protected:
        relation = _relation(target, folder)
        if relation in ("is", "contains"):
            raise UserError(f"{option} {path}: refusing to write there, it {relation} {where} ({folder})")
    for name, given in inputs.items():
        if name == "--data-dir" and not given:  # every command's --data-dir defaults to $MIRRORBERT_DATA
            given = os.environ.get("MIRRORBERT_DATA")
        for value in (given if isinstance(given, (list, tuple)) else [given]):
            if not value or not Path(os.path.expanduser(str(value))).exists():
                continue  # a hub id or a missing file is not a folder we could damage
            relation = _relation(target, resolve(value))
            if relation is not None:
                raise UserError(f"{option} {path}: refusing to write there, it {relation} the input {name} {value}")
    return target


def check_not_nested(a: PathLike, a_option: str, b: PathLike, b_option: str) -> None:
    """Two output locations that overlap would overwrite each other (e.g. --output X --report X)."""
    relation = _relation(resolve(a), resolve(b))
    if relation == "is":
        raise UserError(f"{a_option} {a} and {b_option} {b} are the same path (outputs may not overlap); "
                        f"give each its own")
    if relation is not None:
        raise UserError(f"{a_option} {a} and {b_option} {b} overlap; give them separate locations")


def check_append_folder(path: PathLike, option: str) -> None:
    """A folder files are added to (a log or cache folder): a folder, a link to one (a cache moved to another
    disk), or nothing yet; a link to nothing, or anything but a folder, is refused."""
    where = check_place(path, option)
    if os.path.islink(where) and not os.path.exists(where):
        raise UserError(f"{option} {path} is {link_words(where)}; mirrorbert never writes through a link: "
                        f"create the folder it names or remove the link")
    if os.path.exists(where) and not os.path.isdir(where):
        raise UserError(f"{option} {path} exists and is not a folder")


def existing_ancestor(path: Path, option: str) -> Path:
    """The nearest existing folder at or above `path`; a file there is refused."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise UserError(f"{option} {path}: {candidate} is a file, not a folder")
            return candidate
    return Path("/")  # pragma: no cover - the root always exists
