"""Training strings as token ids on disk: flat arrays with offsets, memory-mapped, cached by content.

Why: Python lists of token ids (and every second view of an epoch drawn up front) cost about 10 KB per
training string, so a million strings needed 10 GB before the first step. The store keeps, per training
string i (in the order given, after dropping strings without tokens):

* `ids.bin` (int32) and `ids_offsets.bin` (int64, n + 1): its token ids, special tokens included and truncated at
  `max_length` exactly as `tokenizer(s, add_special_tokens=True, truncation=True, max_length=L)` gives them, are
  `ids[off[i]:off[i + 1]]`;
* `text.bin` (UTF-8) and `text_offsets.bin` (int64, n + 1): the string itself (character masking re-tokenises a
  batch's masked strings; the collapse check encodes a sample);
* `dropped.bin`, `dropped_offsets.bin` and `dropped_at.bin` (int64): the strings without real tokens and their
  positions among the strings read, so that the store's strings can be checked against the data's hash.

A batch reads only its strings (positioned reads: `os.pread`; the files are also open as `numpy.memmap` for bulk
use), so a run's memory does not grow with the number of strings. They are written in one streaming pass over chunks of strings
(`data.readers.chunked`: the fast tokenizer on `CHUNK` strings a call, never a Python list of every string's ids), so a
streaming reader can feed `open_token_store` an iterable of chunks. A string whose ids are all special tokens
(only control or zero-width characters) is dropped, as `mirror.views.drop_tokenless` drops it; the manifest
counts them and keeps the first one's beginning for the warning.

Cache: `<cache>/tokens/<key>/`, where `<cache>` is `$MIRRORBERT_CACHE`, else `$XDG_CACHE_HOME/mirrorbert`, else
`~/.cache/mirrorbert` (`cache_root`; the MLM corpus cache lives there too) and the key is the SHA-256 of the
format, the strings' content (their SHA-256, `TrainingStrings.fingerprint`), the tokenizer (`tokenizer_fingerprint`:
its class, its whole tokenizer.json or vocabulary, its special tokens) and `max_length`. A run on the same
strings with the same tokenizer opens the files written before instead of tokenising again. Written into a
temporary folder beside it that replaces the key's folder in one rename: an interrupted build never leaves a
half store; a full disk is one line naming the cache.

Read back as untrusted (the cache outlives the run that wrote it, and anyone who can write there can edit it
and rehash its manifest): a store is used only once its content is checked against the data it claims to hold.
Every file is read through `safeguards.confined.ConfinedFolder` (inside the store, a regular file, of exactly the
size the counts give, the manifest bounded and nested no deeper than JSON's limit) from the descriptor that the
run then reads; then

* the strings: the SHA-256 of the strings as the data gives them (`data_sha256`, which the caller computed from
  the data, never read from the store) is recomputed from `text.bin` and the dropped strings (`dropped*.bin`,
  with their positions), so the store holds exactly the data's strings, in order; every dropped string is
  tokenised again and must give no real token;
* the ids: offsets from 0, never decreasing, to their file's end; ids inside the vocabulary; every string with a
  real token; the strings tokenised again and compared with the stored ids: all of them when the store holds
  at most `FULL_CHECK` strings (a few seconds of the fast tokenizer), else `SAMPLE` strings drawn afresh each run
  from the operating system's randomness (a fixed sample would tell a forger which strings to leave alone; a
  fresh one finds a forgery of a share f of the strings with probability 1 - (1 - f) ** SAMPLE);
* the manifest's counts (`max_chars`, `max_real_tokens`, the dropped example) are recomputed and must agree;
  the files' SHA-256 in the manifest still catch bit rot in strings a sample skips.

A store that fails any check is set aside (renamed `<key>.damaged-<time>`, never used or deleted) with one warning
line naming the file and the reason, and the strings are tokenised again. While building, the strings streamed
are hashed as they are tokenised: when they are not the strings `data_sha256` was taken from (the data file was
edited during the run), nothing is kept and the run stops with one error line.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import PositionedReader, file_sha256, set_aside, stream_sha256
from mirrorbert.safeguards.writes import make_temporary, remove_tree, write_error, write_errors, write_failure

logger = logging.getLogger(__name__)

FORMAT = "mirrorbert-tokens/2"  # 2: the dropped strings kept, so the strings can be checked against the data
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 16
KIND = "token store"
CHUNK = 8192  # strings per fast-tokenizer call: large enough for its batch speed, small enough to bound memory
OPTION = "MIRRORBERT_CACHE"  # what a cache error names: the variable that moves the cache
# file stem -> dtype; a string's ids and text are slices between consecutive offsets
FILES: dict[str, np.dtype] = {"ids": np.dtype(np.int32), "ids_offsets": np.dtype(np.int64),
                              "text": np.dtype(np.uint8), "text_offsets": np.dtype(np.int64)}
# the strings without real tokens, kept aside with their positions among the strings read
DROPPED: dict[str, np.dtype] = {"dropped": np.dtype(np.uint8), "dropped_offsets": np.dtype(np.int64),
                                "dropped_at": np.dtype(np.int64)}
ALL_FILES = {**FILES, **DROPPED}
EXAMPLE_CHARS = 40
CHECKED = 32  # strings of each chunk also tokenised through the tokenizer's own call, as a check
FULL_CHECK = 50_000  # a store of at most this many strings is tokenised again whole before it is used
SAMPLE = 4096  # strings of a bigger store tokenised again, drawn afresh each run
ROWS = 1 << 16  # strings checked a block at a time
INT64 = np.dtype(np.int64)


class StoreDamaged(Exception):
    """Why a cached store cannot be used (its message is the reason the warning names)."""


# --------------------------------------------------------------------------- where, and under which key
def cache_root() -> Path:
    """The cache of every command: $MIRRORBERT_CACHE, else $XDG_CACHE_HOME/mirrorbert, else ~/.cache/mirrorbert."""
    base = os.environ.get("MIRRORBERT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mirrorbert")
    return Path(base)


def token_cache_dir() -> Path:
    return cache_root() / "tokens"


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


def store_key(data_sha256: str, tokenizer, max_length: int) -> str:
    """The cache key: the same strings, tokenizer and length limit give the same ids, so the same folder."""
    key = {"format": FORMAT, "data": data_sha256, "tokenizer": tokenizer_fingerprint(tokenizer),
           "max_length": int(max_length)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]  # key, not output


def special_ids(tokenizer) -> np.ndarray:
    return np.array(sorted({int(i) for i in tokenizer.all_special_ids}), dtype=np.int64)


def _string_bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")  # as written (a lone surrogate of a Python caller kept)


# --------------------------------------------------------------------------- the stores
class TokenStore:
    """A built store folder, memory-mapped: `token_ids(indices)` and `texts(indices)` read only those strings.

    `files` are the store's files, opened (and checked) by `open_token_store`; without them they are opened
    through the store's `ConfinedFolder`."""

    def __init__(self, root: Path, meta: dict[str, Any], files: dict[str, Any] | None = None):
        self.root, self.meta = Path(root), meta
        self.n = int(meta["strings"])
        counts = _file_counts(meta)
        if files is None:
            files = _open_files(ConfinedFolder(self.root, OPTION, KIND), counts)
        self._handles = files
        self._arrays = {stem: _memmap(files[stem], dtype, counts[stem]) for stem, dtype in FILES.items()}
        self.ids, self.id_offsets = self._arrays["ids"], self._arrays["ids_offsets"]
        self.text, self.text_offsets = self._arrays["text"], self._arrays["text_offsets"]
        # A batch is read with positioned reads, not through the maps: a page fault maps the neighbouring pages
        # too (the kernel's fault-around), so random batches through a map left most of the store resident in
        # the process (10M strings, 100 steps: 2.4 GB of its RSS). The maps stay for bulk use.
        self._files = {stem: PositionedReader(fh) for stem, fh in files.items()}

    def __len__(self) -> int:
        return self.n

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]:
        return [np.frombuffer(raw, dtype=FILES["ids"]).tolist() for raw in self._slices("ids", indices)]

    def text_at(self, i: int) -> str:
        return _decode(self._slices("text", [i])[0])

    def texts(self, indices: Sequence[int]) -> list[str]:
        return [_decode(raw) for raw in self._slices("text", indices)]

    def dropped_texts(self) -> list[str]:
        """The strings without real tokens that the store left out, in their order."""
        count = int(self.meta["dropped"])
        bounds = _array(self._files["dropped_offsets"], INT64, 0, count + 1).tolist()
        raw = self._files["dropped"].read(0, bounds[-1]) if count else b""
        return [_decode(raw[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def _slices(self, stem: str, indices: Sequence[int]) -> list[bytes]:
        """The raw bytes of strings `indices` in `<stem>.bin`: two positioned reads per string, or two in all
        for a run of consecutive strings (walking the strings in order)."""
        offsets, data, size = self._files[f"{stem}_offsets"], self._files[stem], FILES[stem].itemsize
        if isinstance(indices, range) and indices.step == 1 and len(indices) > 1:
            first = range(self.n)[indices.start]
            range(self.n)[indices.stop - 1]  # the whole run inside the store (IndexError otherwise)
            bounds = np.frombuffer(offsets.read(8 * first, 8 * (len(indices) + 1)), dtype=np.int64)
            block = data.read(size * int(bounds[0]), size * int(bounds[-1] - bounds[0]))
            starts = (bounds - bounds[0]) * size
            return [block[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
        out = []
        for i in indices:
            a, b = np.frombuffer(offsets.read(8 * range(self.n)[i], 16), dtype=np.int64).tolist()
            out.append(data.read(size * a, size * (b - a)))
        return out

    def close(self) -> None:
        for reader in self._files.values():
            reader.close()

    @property
    def strings(self) -> "StoreStrings":
        return StoreStrings(self)

    @property
    def max_chars(self) -> int:
        return int(self.meta["max_chars"])

    @property
    def max_real_tokens(self) -> int:
        return int(self.meta["max_real_tokens"])

    @property
    def dropped(self) -> int:
        return int(self.meta["dropped"])


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8", "surrogatepass")  # as written (a lone surrogate of a Python caller kept)
    except UnicodeDecodeError:  # never for a checked store; shown replaced, never a traceback
        return raw.decode("utf-8", "replace")


class StoreStrings(Sequence):
    """The store's strings as a read-only sequence (decoded on access): what `TrainingStrings.strings` becomes
    once the store is built, so the run does not keep a Python list of every string alive."""

    def __init__(self, store: TokenStore):
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.store.texts(range(*i.indices(len(self))))
        if not -len(self) <= i < len(self):
            raise IndexError("string index out of range")
        return self.store.text_at(i % len(self))

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), CHUNK):
            yield from self.store.texts(range(start, min(start + CHUNK, len(self))))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # a sequence compared by content


class ListStore:
    """The same reading interface over lists in memory: small data, tests, and Python callers with their own ids."""

    def __init__(self, strings: Sequence[str], token_ids: Sequence[Sequence[int]], special: Iterable[int] = ()):
        self._strings, self._ids, special = list(strings), [list(ids) for ids in token_ids], set(special)
        self.max_chars = max((len(s) for s in self._strings), default=0)
        self.max_real_tokens = max((sum(t not in special for t in ids) for ids in self._ids), default=0)

    def __len__(self) -> int:
        return len(self._ids)

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]:
        return [list(self._ids[i]) for i in indices]

    def texts(self, indices: Sequence[int]) -> list[str]:
        return [self._strings[i] for i in indices]

    @property
    def strings(self) -> list[str]:
        return self._strings


def _file_counts(meta: dict[str, Any]) -> dict[str, int]:
    n, dropped = int(meta["strings"]), int(meta["dropped"])
    return {"ids": int(meta["tokens"]), "ids_offsets": n + 1, "text": int(meta["text_bytes"]), "text_offsets": n + 1,
            "dropped": int(meta["dropped_bytes"]), "dropped_offsets": dropped + 1, "dropped_at": dropped}


def _open_files(folder: ConfinedFolder, counts: dict[str, int]) -> dict[str, Any]:
    """Each file of the store opened through the folder (inside it, a regular file), of exactly the size the
    counts give; the run reads these descriptors, so what is checked is what is read."""
    files: dict[str, Any] = {}
    try:
        for stem, dtype in ALL_FILES.items():
            size = counts[stem] * dtype.itemsize
            fh = os.fdopen(folder.open(f"{stem}.bin", limit=size), "rb")
            files[stem] = fh
            actual = os.fstat(fh.fileno()).st_size
            if actual != size:
                raise StoreDamaged(f"{stem}.bin has {actual} bytes, the manifest needs {size}")
    except BaseException:
        for fh in files.values():
            fh.close()
        raise
    return files


def _memmap(fh, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(fh, dtype=dtype, mode="r", shape=(count,))


def _array(reader: PositionedReader, dtype: np.dtype, start: int, count: int) -> np.ndarray:
    """`count` values of `dtype` from value `start` of a file, by one positioned read (nothing mapped)."""
    return np.frombuffer(reader.read(start * dtype.itemsize, count * dtype.itemsize), dtype=dtype)


# --------------------------------------------------------------------------- open or build
def open_token_store(chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
                     cache_dir: str | Path | None = None, source: str = "--data") -> TokenStore:
    """The store of these strings under this tokenizer: the cached one once checked against `data_sha256`, else
    built from `chunks` (read only when building). `data_sha256` must be the strings' content hash
    (`data.strings.fingerprint`): it keys the cache and is what a cached store is checked against; `source`
    names the data in the error when the strings streamed are not the ones it was taken from."""
    cache_dir = Path(cache_dir) if cache_dir is not None else token_cache_dir()
    key = store_key(data_sha256, tokenizer, max_length)
    root = cache_dir / key
    store = _cached(root, key, data_sha256, tokenizer, max_length)
    if store is not None:
        return store
    with write_errors(cache_dir, OPTION):  # a full disk: one line naming the cache, nothing left there
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = make_temporary(root, folder=True)  # a killed build's leftovers for this key are removed first
    try:
        meta = _build(tmp, chunks, data_sha256, tokenizer, max_length, source)
        meta.update(key=key)
        (tmp / MANIFEST).write_text(jsonio.dumps(meta, indent=2) + "\n", encoding="utf-8")
        store = _cached(root, key, data_sha256, tokenizer, max_length, quiet=True)  # built by another run meanwhile
        if store is not None:
            remove_tree(tmp)
            return store
        os.replace(tmp, root)
    except BaseException as exc:
        remove_tree(tmp)
        code = write_failure(exc) if isinstance(exc, Exception) and not isinstance(exc, UserError) else None
        if code is not None:
            raise write_error(cache_dir, OPTION, code) from None
        raise
    logger.info("token store: %d strings, %d token ids, in %s", meta["strings"], meta["tokens"], root)
    return TokenStore(root, meta)


def _build(out: Path, chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
           source: str) -> dict[str, Any]:
    """Write the store's files into `out`; its manifest (without the key). The strings streamed must be those
    `data_sha256` was taken from: otherwise the data changed under the run, and nothing is kept."""
    meta, streamed = _write_store(out, chunks, tokenizer, max_length)
    if streamed != data_sha256:
        raise UserError(f"{source}: the strings changed while they were read (their SHA-256 is no longer the one "
                        "taken when the run read them: was the file edited during the run?); nothing was cached, "
                        "run again once the file is complete")
    meta.update(format=FORMAT, data_sha256=data_sha256, max_length=int(max_length), vocab_size=len(tokenizer),
                tokenizer_class=type(tokenizer).__name__, complete=True,
                files={f"{stem}.bin": file_sha256(out / f"{stem}.bin", what=OPTION) for stem in ALL_FILES})
    return meta


def _cached(root: Path, key: str, data_sha256: str, tokenizer, max_length: int,
            quiet: bool = False) -> TokenStore | None:
    """The store at `root` once checked against the data, or None (nothing there, or a damaged or forged one,
    which is set aside with one warning)."""
    if not os.path.lexists(root):
        return None
    try:
        store = check_store(root, key, data_sha256, tokenizer, max_length)
    except StoreDamaged as exc:
        aside = set_aside(root, OPTION)
        logger.warning("token store %s is damaged (%s): set aside as %s; tokenising the strings again", root, exc,
                       aside.name)
        return None
    if not quiet:
        logger.info("using the token store %s (%d strings)", root, store.n)
    return store


# --------------------------------------------------------------------------- the streaming pass
def _write_store(out: Path, chunks: Iterable[Sequence[str]], tokenizer,
                 max_length: int) -> tuple[dict[str, Any], str]:
    """One pass: each chunk tokenised in one call and appended to the files; returns the counts and the SHA-256
    of the strings streamed (as `data.strings.fingerprint` takes it)."""
    special = special_ids(tokenizer)
    digest = hashlib.sha256()
    stack = contextlib.ExitStack()
    meta: dict[str, Any] = {"strings": 0, "tokens": 0, "text_bytes": 0, "read": 0, "dropped": 0, "dropped_bytes": 0,
                            "dropped_example": None, "max_chars": 0, "max_real_tokens": 0}
    handles = {stem: open(out / f"{stem}.bin", "wb") for stem in ALL_FILES}
    try:
        stack.enter_context(_tokenizer_threads())
        for stem in ("ids_offsets", "text_offsets", "dropped_offsets"):
            np.zeros(1, dtype=np.int64).tofile(handles[stem])
        for chunk in chunks:
            chunk = list(chunk)
            digest.update(b"".join(_string_bytes(s) + b"\n" for s in chunk))
            _append_chunk(handles, chunk, tokenizer, max_length, special, meta)
    finally:
        stack.close()
        for fh in handles.values():
            fh.close()
    return meta, digest.hexdigest()


@contextlib.contextmanager
def _tokenizer_threads() -> Iterator[None]:
    """The fast tokenizer on every core for the pass (its own threads; `TOKENIZERS_PARALLELISM`, which the
    command line sets to false against fork warnings, is read at each call), the setting put back after.
    Nothing forks during the pass, and nothing after it forks a process that tokenises."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _real_counts(flat: np.ndarray, lengths: np.ndarray, special: np.ndarray) -> np.ndarray:
    """The number of ids of each string (consecutive runs of `lengths` in `flat`) that are not special."""
    ends = np.cumsum(lengths)
    real_cum = np.concatenate([[0], np.cumsum(~np.isin(flat, special))])
    return real_cum[ends] - real_cum[ends - lengths]


def _append_chunk(handles, chunk: list[str], tokenizer, max_length: int, special: np.ndarray,
                  meta: dict[str, Any]) -> None:
    """Tokenise one chunk, set aside its strings without real tokens, append ids, text and both offsets."""
    if not chunk:
        return
    encoded = _encode(tokenizer, chunk, max_length)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
    real = _real_counts(flat, lengths, special)
    keep = real > 0
    if not keep.all():
        _append_dropped(handles, chunk, keep, meta)
        flat = flat[np.repeat(keep, lengths)]
        lengths, chunk = lengths[keep], [s for s, k in zip(chunk, keep) if k]
    meta["read"] += len(keep)
    if not chunk:
        return
    texts = [_string_bytes(s) for s in chunk]
    text_lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    flat.astype(np.int32).tofile(handles["ids"])
    (meta["tokens"] + np.cumsum(lengths)).tofile(handles["ids_offsets"])
    handles["text"].write(b"".join(texts))
    (meta["text_bytes"] + np.cumsum(text_lengths)).tofile(handles["text_offsets"])
    meta["strings"] += len(chunk)
    meta["tokens"] += int(lengths.sum())
    meta["text_bytes"] += int(text_lengths.sum())
    meta["max_chars"] = max(meta["max_chars"], max(map(len, chunk)))
    meta["max_real_tokens"] = max(meta["max_real_tokens"], int(real[keep].max()))


def _append_dropped(handles, chunk: list[str], keep: np.ndarray, meta: dict[str, Any]) -> None:
    """The chunk's strings without real tokens, kept aside with their positions among the strings read."""
    where = np.flatnonzero(~keep)
    texts = [_string_bytes(chunk[i]) for i in where.tolist()]
    if meta["dropped_example"] is None:
        meta["dropped_example"] = chunk[int(where[0])][:EXAMPLE_CHARS]
    handles["dropped"].write(b"".join(texts))
    (meta["dropped_bytes"] + np.cumsum([len(t) for t in texts], dtype=np.int64)).tofile(handles["dropped_offsets"])
    (meta["read"] + where.astype(np.int64)).tofile(handles["dropped_at"])
    meta["dropped"] += len(texts)
    meta["dropped_bytes"] += sum(map(len, texts))


def _encode(tokenizer, chunk: list[str], max_length: int) -> list[list[int]]:
    """`tokenizer(chunk, add_special_tokens=True, truncation=True, max_length=L)["input_ids"]`, through the fast
    backend's `encode_batch_fast` (no offsets computed: about twice the speed) where the tokenizer has one.

    The backend is called as transformers' own fast path calls it (longest-first truncation on the
    tokenizer's side, no padding), with the backend's settings put back afterwards; the first strings of each
    chunk are checked against the tokenizer's own call, and any difference sends the chunk that way.
    """
    if not chunk:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    encode = getattr(backend, "encode_batch_fast", None) if getattr(tokenizer, "is_fast", False) else None
    reference = lambda texts: tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length,
                                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    if encode is None:
        return reference(chunk)
    checked = reference(chunk[:CHECKED])
    truncation, padding = backend.truncation, backend.padding
    try:
        backend.enable_truncation(max_length, strategy="longest_first",
                                  direction=getattr(tokenizer, "truncation_side", "right"))
        backend.no_padding()
        ids = [e.ids for e in encode(chunk, add_special_tokens=True)]
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


# --------------------------------------------------------------------------- checks on read-back
def check_store(root: Path, key: str, data_sha256: str, tokenizer, max_length: int) -> TokenStore:
    """The store at `root`, opened and checked against the data (module docstring); `StoreDamaged` naming the
    file and the reason when any check fails."""
    if root.is_symlink() or not root.is_dir():
        raise StoreDamaged("not a folder")
    try:
        folder = ConfinedFolder(root, OPTION, KIND)
        meta = folder.read_json(MANIFEST, limit=MAX_MANIFEST_BYTES)
        _check_manifest(meta, key, data_sha256, max_length)
        files = _open_files(folder, _file_counts(meta))
    except UserError as exc:  # the refusal names the file and the path; the option is the warning's
        raise StoreDamaged(str(exc).removeprefix(f"{OPTION} ")) from None
    store = TokenStore(root, meta, files)
    try:
        with _tokenizer_threads():
            _check_content(store, data_sha256, tokenizer, max_length)
    except BaseException:
        store.close()
        raise
    return store


def store_problem(root: Path, key: str, data_sha256: str, tokenizer, max_length: int) -> str | None:
    """Why the store folder `root` cannot be used, or None when it holds the data's strings and their ids."""
    try:
        check_store(root, key, data_sha256, tokenizer, max_length).close()
    except StoreDamaged as exc:
        return str(exc)
    return None


COUNTS = ("strings", "tokens", "text_bytes", "read", "dropped", "dropped_bytes", "max_chars", "max_real_tokens")


def _check_manifest(meta: Any, key: str, data_sha256: str, max_length: int) -> None:
    if meta.get("complete") is not True or meta.get("key") != key or meta.get("format") != FORMAT \
            or meta.get("data_sha256") != data_sha256 or meta.get("max_length") != int(max_length):
        raise StoreDamaged("manifest.json is incomplete or of other strings")
    for name in COUNTS:
        value = meta.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StoreDamaged(f"manifest.json: {name} is not a count")
    if meta["read"] != meta["strings"] + meta["dropped"]:
        raise StoreDamaged("manifest.json: the strings read are not those kept plus those dropped")
    files = meta.get("files")
    if not isinstance(files, dict) or set(files) != {f"{stem}.bin" for stem in ALL_FILES} \
            or not all(isinstance(v, str) for v in files.values()):
        raise StoreDamaged("manifest.json names other files than a store's, or no checksums")
    if not isinstance(meta.get("dropped_example"), (str, type(None))):
        raise StoreDamaged("manifest.json: dropped_example is not a string")


def _check_content(store: TokenStore, data_sha256: str, tokenizer, max_length: int) -> None:
    """Every file's checksum (bit rot); offsets, ids and the recomputed counts; the strings against the data;
    the dropped strings without tokens; the ids against the tokenizer (all, or a fresh sample)."""
    for stem, reader in store._handles.items():
        reader.seek(0)
        if stream_sha256(reader) != store.meta["files"][f"{stem}.bin"]:
            raise StoreDamaged(f"{stem}.bin: SHA-256 differs from the manifest's")
    special = special_ids(tokenizer)
    max_chars, max_real = _check_rows(store, len(tokenizer), special)
    if (max_chars, max_real) != (store.max_chars, store.max_real_tokens):
        raise StoreDamaged("manifest.json: max_chars or max_real_tokens are not those of the strings")
    _check_strings(store, data_sha256)
    dropped = store.dropped_texts()
    for start in range(0, len(dropped), CHUNK):
        chunk = dropped[start:start + CHUNK]
        if any(any(int(t) not in special for t in ids) for ids in _encode(tokenizer, chunk, max_length)):
            raise StoreDamaged("dropped.bin holds a string with tokens (a string was taken out of the store)")
    example = dropped[0][:EXAMPLE_CHARS] if dropped else None
    if store.meta["dropped_example"] != example:
        raise StoreDamaged("manifest.json: dropped_example is not the first dropped string")
    _check_ids(store, tokenizer, max_length)


def _check_rows(store: TokenStore, vocab_size: int, special: np.ndarray) -> tuple[int, int]:
    """Offsets from 0, never decreasing, to their file's end; ids in the vocabulary; a real token in every
    string. Read a block of strings at a time with positioned reads (nothing mapped: a check of every page would
    leave the whole store resident, 10M strings: 1.4 GB of ids). Returns (max_chars, max_real_tokens)."""
    counts, files = _file_counts(store.meta), store._files
    max_chars = max_real = 0
    n = store.n
    for a in range(0, max(n, 1), ROWS):
        b = min(n, a + ROWS)
        bounds = {}
        for stem in ("ids", "text"):
            off = _array(files[f"{stem}_offsets"], INT64, a, b - a + 1)
            if (a == 0 and int(off[0]) != 0) or bool((np.diff(off) < 0).any()) or int(off[-1]) > counts[stem] \
                    or (b == n and int(off[-1]) != counts[stem]):
                raise StoreDamaged(f"{stem}_offsets.bin holds offsets out of order or past {stem}.bin")
            bounds[stem] = off
        if b == a:
            break
        ids = _array(files["ids"], FILES["ids"], int(bounds["ids"][0]), int(bounds["ids"][-1] - bounds["ids"][0]))
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise StoreDamaged("ids.bin holds ids outside the vocabulary")
        real = _real_counts(ids.astype(np.int64), np.diff(bounds["ids"]), special)
        if bool((real <= 0).any()):
            raise StoreDamaged("ids.bin holds a string without real tokens")
        text = _array(files["text"], FILES["text"], int(bounds["text"][0]),
                      int(bounds["text"][-1] - bounds["text"][0]))
        chars = np.concatenate([[0], np.cumsum((text & 0xC0) != 0x80)])  # UTF-8: bytes that start a character
        rel = bounds["text"] - bounds["text"][0]
        max_chars = max(max_chars, int((chars[rel[1:]] - chars[rel[:-1]]).max()))
        max_real = max(max_real, int(real.max()))
    return max_chars, max_real


def _check_strings(store: TokenStore, data_sha256: str) -> None:
    """The strings of the store, the dropped ones put back at their positions, hashed as `data.strings.
    fingerprint` hashes the data's: equal to `data_sha256` only when the store holds exactly the data's strings."""
    counts, files = _file_counts(store.meta), store._files
    d = counts["dropped_at"]
    at = _array(files["dropped_at"], INT64, 0, d)
    bounds = _array(files["dropped_offsets"], INT64, 0, d + 1)
    if d and (int(at[0]) < 0 or bool((np.diff(at) <= 0).any()) or int(at[-1]) >= int(store.meta["read"])):
        raise StoreDamaged("dropped_at.bin holds positions out of order or past the strings read")
    if int(bounds[0]) != 0 or bool((np.diff(bounds) < 0).any()) or int(bounds[-1]) != counts["dropped"]:
        raise StoreDamaged("dropped_offsets.bin holds offsets out of order or past dropped.bin")
    digest, kept = hashlib.sha256(), 0
    for i, before in enumerate((at - np.arange(d)).tolist()):  # kept strings before the i-th dropped one
        _hash_kept(digest, files, kept, before)
        kept = before
        digest.update(files["dropped"].read(int(bounds[i]), int(bounds[i + 1] - bounds[i])) + b"\n")
    _hash_kept(digest, files, kept, store.n)
    if digest.hexdigest() != data_sha256:
        raise StoreDamaged("text.bin and dropped.bin do not hold the data's strings (their SHA-256 is not the "
                           "data's)")


def _hash_kept(digest, files: dict[str, PositionedReader], a: int, b: int) -> None:
    """Add strings a..b of text.bin to `digest`, each followed by a newline, a block at a time."""
    for start in range(a, b, ROWS):
        off = _array(files["text_offsets"], INT64, start, min(b, start + ROWS) - start + 1)
        raw = np.frombuffer(files["text"].read(int(off[0]), int(off[-1] - off[0])), dtype=np.uint8)
        digest.update(np.insert(raw, (off[1:] - off[0]).astype(np.intp), 10).tobytes())


def _check_ids(store: TokenStore, tokenizer, max_length: int) -> None:
    """The stored ids of every string (a store of at most FULL_CHECK strings) or of SAMPLE strings drawn afresh
    from the system's randomness, against the tokenizer's ids of the (already checked) strings."""
    if store.n <= FULL_CHECK:
        groups: Iterable[Sequence[int]] = (range(a, min(store.n, a + CHUNK)) for a in range(0, store.n, CHUNK))
    else:
        rng = np.random.default_rng(secrets.randbits(128))
        rows = np.sort(rng.choice(store.n, size=SAMPLE, replace=False)).tolist()
        groups = (rows[a:a + CHUNK] for a in range(0, len(rows), CHUNK))
    for rows in groups:
        rows = rows if isinstance(rows, range) else list(rows)
        if len(rows) and store.token_ids(rows) != _encode(tokenizer, store.texts(rows), max_length):
            raise StoreDamaged("ids.bin holds ids that are not the tokenizer's ids of the strings")


__all__ = ["CHUNK", "ListStore", "StoreDamaged", "StoreStrings", "TokenStore", "cache_root", "check_store",
           "open_token_store", "store_key", "store_problem", "token_cache_dir", "tokenizer_fingerprint"]
