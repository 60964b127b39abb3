"""The one reader of a folder from a stranger: model folders, checkpoints, index folders, dataset folders, caches.

Every file of such a folder that mirrorbert reads, or hands to a library that reads it (transformers,
tokenizers, sentence-transformers, pyarrow), passes `ConfinedFolder` first:

* the name is relative, and resolves inside the folder (a symlink is followed only when its target is inside
  the folder too, or inside the Hugging Face cache's blob store for a cache snapshot);
* what it names is a regular file, checked on the opened descriptor (opened non-blocking: a FIFO cannot stall
  the open), of bounded size;
* text is UTF-8, JSON is nested no deeper than `MAX_JSON_DEPTH` before `json` recurses into it;
* a path *named inside* a file (a module folder in modules.json, a shard in a dataset's state.json, a file of
  an index manifest) is resolved by the same rule, and the refusal names the file that named it.

A refusal is one `UserError` line naming the option, the file and the reason. `tests/safeguards/
test_confined_reads.py` fails when a module reads such a file any other way.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import MAX_JSON_DEPTH, NotRegularFile, describe_kind, json_depth_ok, open_checked

# Bounds no real file of its kind comes near; a bigger one is refused before it is read.
JSON_LIMIT = 256 << 20  # tokenizer.json of a 250k-token vocabulary is about 20 MB
TEXT_LIMIT = 256 << 20  # vocab.txt, merges.txt, sentencepiece models
MAX_ENTRIES = 100_000  # entries of one folder looked at


def shown(path: Any) -> str:
    """A path or name from a stranger's folder as it may be printed: control characters escaped, so a
    crafted file name cannot move the cursor or recolour the terminal."""
    text = str(path)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _inside(path: str, area: str) -> bool:
    return path == area or path.startswith(area.rstrip(os.sep) + os.sep)


def hf_blob_store(root: Path) -> Path | None:
    """The blob store a Hugging Face cache snapshot's links point into (`models--X/blobs` for
    `models--X/snapshots/REV`), or None when `root` is not such a snapshot."""
    parent = root.parent
    if parent.name == "snapshots" and parent.parent.name.split("--")[0] in ("models", "datasets"):
        return parent.parent / "blobs"
    return None


class ConfinedFolder:
    """Reads the files of one untrusted folder, never outside it, never a FIFO or device, never unbounded."""

    def __init__(self, root: str | os.PathLike, option: str, kind: str = "folder"):
        self.option = option
        self.kind = kind
        self.given = Path(root)
        try:
            st = os.stat(self.given)
        except FileNotFoundError:
            raise UserError(f"{option} {shown(self.given)}: no such folder") from None
        except OSError as exc:
            raise UserError(f"{option} {shown(self.given)}: cannot open it ({exc.strerror or type(exc).__name__})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"{option} {shown(self.given)}: is {describe_kind(st.st_mode)}, expected {_a(kind)}")
        self.root = Path(os.path.realpath(self.given))
        blobs = hf_blob_store(self.root)
        self.areas = [str(self.root)] + ([os.path.realpath(blobs)] if blobs is not None else [])

    # ------------------------------------------------------------------ names
    def _where(self, name: str, named_in: str | None) -> str:
        if named_in:
            return f"{shown(self.given / named_in)} names {name!r}"
        return shown(self.given / name)

    def refuse(self, name: str, reason: str, named_in: str | None = None) -> UserError:
        return UserError(f"{self.option} {self._where(name, named_in)}: {reason}")

    def resolve(self, name: str | os.PathLike, named_in: str | None = None) -> Path:
        """The real path of `name` (relative to the folder), which must lie inside the folder (or the cache's
        blob store); `named_in` is the file that named it, for the refusal."""
        text = os.fspath(name)
        if not isinstance(text, str) or not text or "\0" in text:
            raise self.refuse(str(text)[:80], "not a file name", named_in)
        pure = PurePosixPath(text.replace("\\", "/"))
        if pure.is_absolute() or ".." in pure.parts or (len(text) > 1 and text[1] == ":"):
            raise self.refuse(text[:200], f"leads out of the {self.kind}", named_in)
        real = os.path.realpath(self.root / pure)
        if not any(_inside(real, area) for area in self.areas):
            raise self.refuse(text[:200], f"leads out of the {self.kind} (a link to {shown(real[:200])})", named_in)
        return Path(real)

    def exists(self, name: str) -> bool:
        return os.path.lexists(self.root / name)

    def is_dir(self, name: str, named_in: str | None = None) -> bool:
        try:
            return stat.S_ISDIR(os.stat(self.resolve(name, named_in)).st_mode)
        except FileNotFoundError:
            return False

    def subfolder(self, name: str, named_in: str | None = None) -> "ConfinedFolder":
        """A folder named inside a file (a module folder, a shard folder): inside this one, and read by the
        same rules, its names checked against this folder's bounds."""
        real = self.resolve(name, named_in)
        try:
            st = os.stat(real)
        except FileNotFoundError:
            raise self.refuse(name, "no such folder", named_in) from None
        if not stat.S_ISDIR(st.st_mode):
            raise self.refuse(name, f"is {describe_kind(st.st_mode)}, expected a folder", named_in)
        child = ConfinedFolder.__new__(ConfinedFolder)
        child.option, child.kind = self.option, self.kind
        child.given = self.given / name
        child.root = real
        child.areas = self.areas  # a subfolder may not lead anywhere its parent may not
        return child

    def entries(self, name: str = ".") -> Iterator[tuple[str, os.stat_result]]:
        """(name, lstat) of each entry of a folder inside this one, at most MAX_ENTRIES."""
        base = self.resolve(name) if name != "." else self.root
        try:
            with os.scandir(base) as it:
                for count, entry in enumerate(it):
                    if count >= MAX_ENTRIES:
                        raise self.refuse(name, f"holds more than {MAX_ENTRIES} entries")
                    yield entry.name, entry.stat(follow_symlinks=False)
        except PermissionError:
            raise self.refuse(name, "permission denied (the folder is not readable)") from None

    # ------------------------------------------------------------------ files
    def open(self, name: str, limit: int | None = None, named_in: str | None = None) -> int:
        """A read-only descriptor of the regular file `name`, at most `limit` bytes (None: any size)."""
        real = self.resolve(name, named_in)
        try:
            return open_checked(real, follow=False, limit=limit)  # a link swapped in since resolve: refused
        except NotRegularFile as exc:
            raise self.refuse(name, exc.reason, named_in) from None

    def check_file(self, name: str, limit: int | None = None, named_in: str | None = None) -> Path:
        """Check `name` as `open` does without reading it; its real path, for a library to open."""
        os.close(self.open(name, limit, named_in))
        return self.resolve(name, named_in)

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
        import json

        raw = self.read_bytes(name, limit, named_in)
        if not json_depth_ok(raw):
            raise self.refuse(name, f"damaged (JSON nested deeper than {MAX_JSON_DEPTH} levels)", named_in)
        try:
            value = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise self.refuse(name, f"damaged (not UTF-8 text: byte {exc.start})", named_in) from None
        except (ValueError, RecursionError) as exc:
            reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise self.refuse(name, f"damaged (not valid JSON: {reason})", named_in) from None
        if expect is not None and not isinstance(value, expect):
            wanted = "an object" if expect is dict else "a list" if expect is list else "another type"
            raise self.refuse(name, f"damaged (expected {wanted} in this JSON file)", named_in)
        return value


__all__ = ["ConfinedFolder", "JSON_LIMIT", "MAX_ENTRIES", "TEXT_LIMIT", "describe_kind", "hf_blob_store", "shown"]
