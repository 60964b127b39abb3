"""The one token cache: text tokenised once into flat arrays on disk, keyed by what it was made from (`cache_key`).
A layout (`data.token_store`, `data.token_stream`) names its files, its key and one pass appending its arrays to an
`ArrayWriter`: `write` over the data, `replay` over a cached entry. An entry is built in a temporary folder renamed
into place after `manifest.json`; before use it is opened through `ConfinedFolder` and replayed (every row up to
`FULL_CHECK`, else a fresh `SAMPLE`): a damaged entry is set aside with one warning and rebuilt, one that cannot be
opened is one error and left as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import PositionedReader, describe_kind, parse_json, set_aside
from mirrorbert.safeguards.writes import (WRITE_ERRNOS, make_temporary, open_temporary, remove_tree, write_error,
                                          write_errors)

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
FULL_CHECK = 50_000  # an entry of at most this many rows is tokenised again whole before it is used
SAMPLE = 4096  # rows of a bigger entry tokenised again, drawn afresh each run
CHECKED = 32  # strings of each chunk also tokenised through the tokenizer's own call, as a check


class CacheDamaged(Exception):
    """Why a cached entry cannot be used (its message is the reason the warning names)."""


class WriteFailed(Exception):
    """An OSError of writing the cache's own files (its cause), which the build turns into one line."""


def cache_root() -> Path:
    """The cache of every command: $MIRRORBERT_CACHE, else $XDG_CACHE_HOME/mirrorbert, else ~/.cache/mirrorbert."""
    base = os.environ.get("MIRRORBERT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mirrorbert")
    return Path(base)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash that changes whenever the tokenisation could change (vocab, normaliser, class)."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(_without_call_settings(backend).encode("utf-8"))
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode("utf-8"))  # key, not output
    h.update(json.dumps([str(t) for t in tokenizer.all_special_tokens]).encode("utf-8"))  # key, not output
    h.update(str(getattr(tokenizer, "do_lower_case", "")).encode())
    return h.hexdigest()


def _without_call_settings(backend) -> str:
    """The backend's JSON without truncation and padding: a call with `truncation=True, max_length=L` leaves
    them set on the shared backend, which would change the fingerprint of the same tokenizer after its first use."""
    text = backend.to_str()
    if '"truncation":null' in text.replace(" ", "") and '"padding":null' in text.replace(" ", ""):
        return text
    from tokenizers import Tokenizer

    clean = Tokenizer.from_str(text)
    clean.no_truncation()
    clean.no_padding()
    return clean.to_str()


def cache_key(fmt: str, data: str, tokenizer, **settings: Any) -> str:
    """An entry's key: the same format, data, tokenizer and settings give the same ids, so the same entry."""
    key = {"format": fmt, "data": data, "tokenizer": tokenizer_fingerprint(tokenizer), **settings}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]  # key, not output


@contextlib.contextmanager
def tokenizer_threads() -> Iterator[None]:
    """The fast tokenizer on every core for a pass (`TOKENIZERS_PARALLELISM`, which the command line sets to
    false, is read at each call), the setting put back after; nothing forks during the pass."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def encode_chunk(tokenizer, chunk: list[str], max_length: int | None, special: bool = True) -> list[list[int]]:
    """`tokenizer(chunk, add_special_tokens=special, truncation=True, max_length=L)["input_ids"]` (no truncation
    without `max_length`), through the fast backend's `encode_batch_fast` where there is one (called as
    transformers calls it, its settings put back); the first `CHECKED` strings of each chunk are compared with
    the tokenizer's own call, and any difference sends the chunk that way."""
    if not chunk:
        return []
    limit = {"truncation": True, "max_length": max_length} if max_length else {}
    reference = lambda texts: tokenizer(texts, add_special_tokens=special, return_attention_mask=False,  # noqa: E731
                                        return_token_type_ids=False, verbose=False, **limit)["input_ids"]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    encode = getattr(backend, "encode_batch_fast", None) if getattr(tokenizer, "is_fast", False) else None
    if encode is None:
        return reference(chunk)
    checked = reference(chunk[:CHECKED])
    truncation, padding = backend.truncation, backend.padding
    try:
        if max_length:
            backend.enable_truncation(max_length, strategy="longest_first",
                                      direction=getattr(tokenizer, "truncation_side", "right"))
        else:
            backend.no_truncation()
        backend.no_padding()
        ids = [e.ids for e in encode(chunk, add_special_tokens=special)]
    finally:
        _restore(backend, truncation, padding)
    return ids if ids[:CHECKED] == checked else reference(chunk)


def _restore(backend, truncation, padding) -> None:
    if truncation is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(**truncation)
    if padding is None:
        backend.no_padding()
    else:
        padding = dict(padding)
        padding["length"] = padding.pop("length", None)
        backend.enable_padding(**padding)


def rows_to_check(n: int) -> np.ndarray | None:
    """The rows a check tokenises again: None (every row) up to FULL_CHECK rows, else SAMPLE rows drawn afresh
    from the system's randomness, so a forger cannot know which."""
    if n <= FULL_CHECK:
        return None
    return np.sort(np.random.default_rng(secrets.randbits(128)).choice(n, size=SAMPLE, replace=False))


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise WriteFailed(exc) from exc


class ArrayWriter:
    """Appends flat arrays to an entry's files, counting and hashing them as they are written; without a folder
    it only counts and hashes (a check rebuilding the files to compare them with the manifest's)."""

    def __init__(self, folder: Path | None, dtypes: dict[str, np.dtype]):
        self.dtypes, self.counts = dtypes, dict.fromkeys(dtypes, 0)
        self._hashes = {name: hashlib.sha256() for name in dtypes}
        self._files: dict[str, Any] = {}
        if folder is not None:
            with _writing():
                for name in dtypes:
                    self._files[name] = open_temporary(folder / name)  # in a fresh temporary, never through a link

    def append(self, name: str, values) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtypes[name])
        if self._files:
            with _writing():  # an OSError here (full disk, a short write) ends the build in one line
                self.write(self._files[name], data)
        self._hashes[name].update(data)
        self.counts[name] += data.size

    def write(self, fh, data: np.ndarray) -> None:
        """The one place the cache's bytes go to disk."""
        fh.write(data)

    def close(self) -> None:
        files, self._files = list(self._files.values()), {}
        with _writing(), contextlib.ExitStack() as stack:
            for fh in files:
                stack.callback(fh.close)

    def manifest(self, layout, meta: dict[str, Any]) -> dict[str, Any]:
        """What the manifest records: the layout's format and key, every file's SHA-256 and count, its counts."""
        return {"format": layout.fmt, "key": layout.key, **meta,
                "files": {name: h.hexdigest() for name, h in self._hashes.items()}, "counts": dict(self.counts)}


class CacheEntry:
    """A checked entry's files, kept open: what the run reads is what was checked."""

    def __init__(self, root: Path, manifest: dict[str, Any], handles: dict[str, Any], dtypes: dict[str, np.dtype]):
        self.root, self.manifest, self.dtypes, self.counts = root, manifest, dtypes, manifest["counts"]
        self._handles = handles
        self.readers = {name: PositionedReader(fh) for name, fh in handles.items()}

    def read(self, name: str, start: int = 0, count: int | None = None) -> np.ndarray:
        """`count` values (all from `start` when None) of a file, by one positioned read (nothing mapped)."""
        dtype = self.dtypes[name]
        count = self.counts[name] - start if count is None else count
        return np.frombuffer(self.readers[name].read(start * dtype.itemsize, count * dtype.itemsize), dtype=dtype)

    def array(self, name: str) -> np.ndarray:
        """The whole file, memory-mapped read-only (an empty array for an empty file)."""
        if self.counts[name] == 0:
            return np.zeros(0, dtype=self.dtypes[name])
        return np.memmap(self._handles[name], dtype=self.dtypes[name], mode="r", shape=(self.counts[name],))

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


def open_cache(layout, folder: Path, *, own: bool) -> CacheEntry:
    """The entry of `layout` in `folder`: the cached one once checked, else built (module docstring). `own`:
    mirrorbert named `folder` below the cache root, so it is made here and may not be a link."""
    root = folder / layout.name
    entry = _cached(layout, root)
    return entry if entry is not None else _build(layout, root, own)


def _cached(layout, root: Path, quiet: bool = False) -> CacheEntry | None:
    """The entry at `root` once checked, or None (nothing there, or a damaged one, set aside with one warning)."""
    if not os.path.lexists(root):
        return None
    try:
        entry = check_entry(layout, root)
    except CacheDamaged as exc:
        with write_errors(root.parent, layout.option):
            aside = set_aside(root, layout.option)
        logger.warning("%s %s is damaged (%s): set aside as %s; %s again", layout.kind, root, exc, aside.name,
                       layout.redo)
        return None
    if not quiet:
        logger.info("using the %s %s", layout.kind, root)
    return entry


def check_entry(layout, root: Path) -> CacheEntry:
    """The entry at `root`, opened and checked against the data (module docstring); `CacheDamaged` naming the
    file and the reason when a check fails."""
    entry = _open_entry(layout, root)
    try:
        writer = ArrayWriter(None, layout.files)
        rebuilt = json.loads(jsonio.dumps(writer.manifest(layout, layout.replay(entry, writer))))
        for name, digest in rebuilt["files"].items():
            if entry.manifest["files"][name] != digest or entry.counts[name] != rebuilt["counts"][name]:
                raise CacheDamaged(f"{name} is not what the data and the tokenizer give (rebuilt, it differs)")
        wrong = sorted(k for k in set(rebuilt) | set(entry.manifest) if rebuilt.get(k) != entry.manifest.get(k))
        if wrong:
            raise CacheDamaged(f"{MANIFEST}: {', '.join(wrong)} not the data's")
    except BaseException:
        entry.close()
        raise
    return entry


def _build(layout, root: Path, own: bool) -> CacheEntry:
    """Write the entry into a temporary folder beside `root` that takes its name in one rename."""
    folder = root.parent
    with write_errors(folder, layout.option):  # a full disk: one line naming the cache, nothing left there
        made = _make_folder(folder, own, layout.option)
        tmp = make_temporary(root, folder=True)  # a killed build's leftovers for this key are removed first
    try:
        writer = ArrayWriter(tmp, layout.files)
        try:
            meta = layout.write(writer)
        finally:
            writer.close()
        with _writing(), open_temporary(tmp / MANIFEST) as fh:
            fh.write((jsonio.dumps(writer.manifest(layout, meta), indent=2) + "\n").encode("utf-8"))
        entry = _cached(layout, root, quiet=True)  # built by another run meanwhile: that one, once checked
        if entry is not None:
            remove_tree(tmp)
            return entry
        now = os.lstat(folder)
        if (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino):
            raise UserError(f"{layout.option} {folder}: replaced while the cache was written (by a link?); nothing "
                            "was written there")
        with write_errors(folder, layout.option):
            os.replace(tmp, root)
    except BaseException as exc:
        remove_tree(tmp)
        if isinstance(exc, WriteFailed):
            raise _write_failed(folder, layout.option, exc.__cause__) from None
        raise
    logger.info("%s written to %s", layout.kind, root)
    return _open_entry(layout, root)


def _make_folder(folder: Path, own: bool, option: str) -> os.stat_result:
    """The folder the entries go in, made when missing; with `own`, a link there is refused, never written through."""
    if not own:
        folder.mkdir(parents=True, exist_ok=True)
        return os.lstat(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{option} {folder}: is {describe_kind(st.st_mode)}, not a folder mirrorbert made (the cache "
                        f"is never written through a link); remove it, or set {option} to the folder the cache should "
                        "go in")
    return st


def _write_failed(folder: Path, option: str, exc: OSError) -> UserError:
    """A write of the cache that failed, as one line (numpy and others raise a short write without an errno)."""
    if exc.errno in WRITE_ERRNOS:
        return write_error(folder, option, exc.errno)
    reason = exc.strerror or f"{exc or type(exc).__name__} (a short write: is the disk full?)"
    return UserError(f"{option} {folder}: cannot write the cache: {reason}; nothing was kept there")


def _open_entry(layout, root: Path) -> CacheEntry:
    """The entry's manifest and files, each checked in place (`_expect`), then opened through `ConfinedFolder`."""
    _expect(root, folder=True)
    folder = ConfinedFolder(root, layout.option, layout.kind)
    _expect(root / MANIFEST, limit=MAX_MANIFEST_BYTES)
    raw = _opened(folder.read_bytes, MANIFEST, MAX_MANIFEST_BYTES)
    try:
        manifest = parse_json(raw, "", Path(MANIFEST))
    except UserError as exc:  # the refusal names the file and the reason
        raise CacheDamaged(str(exc).strip()) from None
    _check_manifest(layout, manifest)
    handles: dict[str, Any] = {}
    try:
        for name, dtype in layout.files.items():
            size = manifest["counts"][name] * dtype.itemsize
            _expect(root / name, size=size)
            handles[name] = os.fdopen(_opened(folder.open, name, size), "rb")
    except BaseException:
        for fh in handles.values():
            fh.close()
        raise
    return CacheEntry(root, manifest, handles, layout.files)


def _expect(path: Path, folder: bool = False, size: int | None = None, limit: int | None = None) -> None:
    """What lies at `path` (`lstat`: no descriptor needed, so running out of them is never taken for damage) must
    be a real folder, or a regular file of `size` bytes (at most `limit`); `CacheDamaged` naming it otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CacheDamaged(f"{path.name} is missing") from None
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        kind = "folder" if folder else "regular file"
        raise CacheDamaged(f"{path.name} is {describe_kind(st.st_mode)}, not a {kind}")
    if (size is not None and st.st_size != size) or (limit is not None and st.st_size > limit):
        raise CacheDamaged(f"{path.name} has {st.st_size} bytes, the manifest needs {size or f'at most {limit}'}")


def _opened(how, name: str, limit: int):
    """A file `_expect` found right, opened: a refusal now is the system's (too many open files, no permission)."""
    try:
        return how(name, limit)
    except UserError as exc:
        raise UserError(f"{exc}; the cache was left as it is") from None


def _check_manifest(layout, manifest: Any) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != layout.fmt or manifest.get("key") != layout.key:
        raise CacheDamaged(f"{MANIFEST} is of another format or key")
    files, counts = manifest.get("files"), manifest.get("counts")
    if not (isinstance(files, dict) and isinstance(counts, dict) and set(files) == set(counts) == set(layout.files)
            and all(isinstance(v, str) for v in files.values())
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values())):
        raise CacheDamaged(f"{MANIFEST} names other files than a {layout.kind}'s, or no counts and checksums")


__all__ = ["ArrayWriter", "CacheDamaged", "CacheEntry", "cache_key", "cache_root", "check_entry", "encode_chunk",
           "open_cache", "rows_to_check", "tokenizer_fingerprint", "tokenizer_threads"]
