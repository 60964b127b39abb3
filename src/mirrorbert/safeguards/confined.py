"""The one reader of a folder from a stranger (model, checkpoint, index and dataset folders, caches): each file is
opened relative to the folder's descriptor, a component at a time, never through a link; a link of the folder is
followed only to a target inside it (or the Hugging Face cache's blob store). Only a regular file of bounded size
is opened; a refusal is one `UserError` naming the option, the file and the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import (NotRegularFile, checked_descriptor, describe_kind, loads_untrusted,
                                            open_errors, opening)

# Bounds no real file of its kind comes near; a bigger one is refused before it is read.
JSON_LIMIT = 256 << 20  # tokenizer.json of a 250k-token vocabulary is about 20 MB
TEXT_LIMIT = 256 << 20  # vocab.txt, merges.txt, sentencepiece models
MAX_ENTRIES = 100_000  # entries of one folder looked at
MAX_LINKS = 40  # links followed for one name, as the kernel's own limit

# Intermediate folders: O_PATH where the platform has it (no read permission needed to pass through).
_WALK = (getattr(os, "O_PATH", 0) or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
PROC_FD = Path("/proc/self/fd")


def shown(path: Any) -> str:
    """A stranger's path or name as it may be printed: control characters and undecodable bytes escaped."""
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _inside(path: str, area: str) -> bool:
    return path == area or path.startswith(area.rstrip(os.sep) + os.sep)


def hf_blob_store(root: Path) -> Path | None:
    """The blob store (`models--X/blobs`) of a Hugging Face cache snapshot `models--X/snapshots/REV`, or None."""
    parent = root.parent
    if parent.name == "snapshots" and parent.parent.name.split("--")[0] in ("models", "datasets"):
        return parent.parent / "blobs"
    return None


class ConfinedFolder:
    """Reads the files of one untrusted folder, never outside it, never a FIFO or device, never unbounded."""

    def __init__(self, root: str | os.PathLike, option: str, kind: str = "folder"):
        self.option, self.kind, self.given = option, kind, Path(root)
        try:
            st = os.stat(self.given)
        except FileNotFoundError:
            raise UserError(f"{option} {shown(self.given)}: no such folder") from None
        except OSError as exc:
            raise UserError(f"{option} {shown(self.given)}: cannot open it "
                            f"({exc.strerror or type(exc).__name__})") from None
        if not stat.S_ISDIR(st.st_mode):
            article = "an" if kind[:1] in "aeiou" else "a"
            raise UserError(f"{option} {shown(self.given)}: is {describe_kind(st.st_mode)}, expected {article} {kind}")
        self.root = Path(os.path.realpath(self.given))
        blobs = hf_blob_store(self.root)
        self.areas = [str(self.root)] + ([os.path.realpath(blobs)] if blobs is not None else [])

    def refuse(self, name: str, reason: str, named_in: str | None = None) -> UserError:
        where = f"{shown(self.given / named_in)} names {shown(name)!r}" if named_in else shown(self.given / name)
        return UserError(f"{self.option} {where}: {reason}")

    def _parts(self, name: str | os.PathLike, named_in: str | None) -> list[str]:
        """`name` as components under the folder; a name that is absolute, climbs out or is not one is refused."""
        text = os.fspath(name)
        if not isinstance(text, str) or not text or "\0" in text:
            raise self.refuse(str(text)[:80], "not a file name", named_in)
        pure = PurePosixPath(text.replace("\\", "/"))
        if pure.is_absolute() or ".." in pure.parts or (len(text) > 1 and text[1] == ":"):
            raise self.refuse(text[:200], f"leads out of the {self.kind}", named_in)
        return [part for part in pure.parts if part not in ("", ".")]

    def _walk(self, name: str | os.PathLike, named_in: str | None, last_flags: int | None):
        """(descriptor of the folder holding `name`'s last component, that component, its real path), walking
        from the root a component at a time, a link resolved here staying in the areas; with `last_flags` the
        last component's own descriptor. A missing component raises FileNotFoundError."""
        text = os.fspath(name)
        parts = self._parts(name, named_in)
        real, links = str(self.root), 0
        fd = os.open(self.root, _WALK & ~os.O_NOFOLLOW)
        try:
            while parts:
                part = parts.pop(0)
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAX_LINKS:
                        raise self.refuse(text[:200], "too many links", named_in)
                    try:
                        link = os.readlink(part, dir_fd=fd)
                    except OSError as exc:
                        if exc.errno == errno.EINVAL:  # no longer a link: swapped since the stat above
                            raise self.refuse(text[:200], "changed while it was read", named_in) from None
                        raise
                    target = os.path.normpath(os.path.join(real, link))
                    area = next((a for a in self.areas if _inside(target, a)), None)
                    if area is None:
                        raise self.refuse(text[:200], f"leads out of the {self.kind} (a link to "
                                                      f"{shown(target[:200])})", named_in)
                    parts = [p for p in PurePosixPath(os.path.relpath(target, area)).parts if p != "."] + parts
                    os.close(fd)
                    fd, real = -1, area
                    fd = os.open(area, _WALK & ~os.O_NOFOLLOW)
                    continue
                if not parts and last_flags is None:
                    return fd, part, os.path.join(real, part)
                try:
                    child = os.open(part, last_flags if not parts else _WALK, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # swapped for a link since the stat above
                        raise self.refuse(text[:200], "changed into a link while it was read", named_in) from None
                    raise
                os.close(fd)
                fd, real = child, os.path.join(real, part)
            return fd, ".", real
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    def resolve(self, name: str | os.PathLike, named_in: str | None = None) -> Path:
        """The real path of `name`, which must lie inside the folder (or the cache's blob store); `named_in` is
        the file that named it. For messages and relative names only: a file is read through `open`."""
        try:
            with opening():
                fd, _, real = self._walk(name, named_in, None)
            os.close(fd)
            return Path(real)
        except FileNotFoundError:
            return self.root / PurePosixPath(os.fspath(name).replace("\\", "/"))
        except NotADirectoryError:
            raise self.refuse(os.fspath(name)[:200], "a file where a folder is expected", named_in) from None
        except PermissionError:
            raise self.refuse(os.fspath(name)[:200], "permission denied", named_in) from None

    def exists(self, name: str) -> bool:
        try:
            self._parts(name, None)
        except UserError:
            return False
        return os.path.lexists(self.root / name)

    def is_dir(self, name: str, named_in: str | None = None) -> bool:
        try:
            return stat.S_ISDIR(os.stat(self.resolve(name, named_in)).st_mode)
        except FileNotFoundError:
            return False

    def subfolder(self, name: str, named_in: str | None = None) -> "ConfinedFolder":
        """A folder named inside a file (a module or shard folder): inside this one, read by the same rules."""
        real = self.resolve(name, named_in)
        try:
            st = os.stat(real)
        except FileNotFoundError:
            raise self.refuse(name, "no such folder", named_in) from None
        if not stat.S_ISDIR(st.st_mode):
            raise self.refuse(name, f"is {describe_kind(st.st_mode)}, expected a folder", named_in)
        child = ConfinedFolder.__new__(ConfinedFolder)
        child.option, child.kind, child.given, child.root = self.option, self.kind, self.given / name, real
        child.areas = self.areas  # a subfolder may not lead anywhere its parent may not
        return child

    def entries(self, name: str = ".") -> Iterator[tuple[str, os.stat_result]]:
        """(name, lstat) of each entry of a folder inside this one, at most MAX_ENTRIES."""
        try:
            with opening():
                fd = os.open(self.root, _LIST & ~os.O_NOFOLLOW) if name == "." else self._walk(name, None, _LIST)[0]
            try:
                with os.scandir(fd) as it:
                    for count, entry in enumerate(it):
                        if count >= MAX_ENTRIES:
                            raise self.refuse(name, f"holds more than {MAX_ENTRIES} entries")
                        yield entry.name, entry.stat(follow_symlinks=False)
            finally:
                os.close(fd)
        except PermissionError:
            raise self.refuse(name, "permission denied (the folder is not readable)") from None
        except FileNotFoundError:
            raise self.refuse(name, "no such folder") from None

    def open(self, name: str, limit: int | None = None, named_in: str | None = None) -> int:
        """A read-only descriptor of the regular file `name`, at most `limit` bytes (None: any size)."""
        try:
            with open_errors():
                fd, _, _ = self._walk(name, named_in, _FILE)
            return checked_descriptor(fd, limit)
        except NotRegularFile as exc:
            raise self.refuse(name, exc.reason, named_in) from None

    @contextlib.contextmanager
    def library_path(self, name: str, limit: int | None = None, named_in: str | None = None) -> Iterator[Path]:
        """A path a library may open, inside the block, for the checked file `name`: the descriptor this reader
        opened (`/proc/self/fd/N`), or where the platform has no such names a private copy written from it."""
        fd = self.open(name, limit, named_in)
        try:
            if PROC_FD.is_dir():
                yield PROC_FD / str(fd)
                return
            from mirrorbert.safeguards.snapshot import private_copy

            with private_copy(fd, Path(name).name) as copy:
                yield copy
        finally:
            os.close(fd)

    def read_bytes(self, name: str, limit: int = JSON_LIMIT, named_in: str | None = None) -> bytes:
        with os.fdopen(self.open(name, limit, named_in), "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:  # grew while read
            raise self.refuse(name, f"more than the {limit} bytes such a file may hold", named_in)
        return data

    def read_text(self, name: str, limit: int = TEXT_LIMIT, named_in: str | None = None) -> str:
        raw = self.read_bytes(name, limit, named_in)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.refuse(name, f"damaged (not UTF-8 text: byte {exc.start})", named_in) from None

    def read_json(self, name: str, expect: type | tuple[type, ...] | None = dict, limit: int = JSON_LIMIT,
                  named_in: str | None = None) -> Any:
        """JSON of a file of the folder: UTF-8, nesting bounded, of the expected type."""
        return self.parse_json(name, self.read_bytes(name, limit, named_in), expect, named_in)

    def parse_json(self, name: str, raw: bytes, expect: type | tuple[type, ...] | None = dict,
                   named_in: str | None = None) -> Any:
        """`raw`, the bytes of the folder's file `name`, as JSON (the rules of `read_json`)."""
        try:
            value = loads_untrusted(raw)
        except ValueError as exc:
            raise self.refuse(name, str(exc), named_in) from None
        if expect is not None and not isinstance(value, expect):
            wanted = "an object" if expect is dict else "a list" if expect is list else "another type"
            raise self.refuse(name, f"damaged (expected {wanted} in this JSON file)", named_in)
        return value
