"""Training strings as token ids on disk: flat arrays with offsets, memory-mapped, cached by content.

Why: Python lists of token ids (and every second view of an epoch drawn up front) cost about 10 KB per
training string, so a million strings needed 10 GB before the first step. The store keeps, per training
string i (in the order given, after dropping strings without tokens):

* `ids.bin` (int32) and `ids_offsets.bin` (int64, n + 1): its token ids, special tokens included and truncated at
  `max_length` exactly as `tokenizer(s, add_special_tokens=True, truncation=True, max_length=L)` gives them, are
  `ids[off[i]:off[i + 1]]`;
* `text.bin` (UTF-8) and `text_offsets.bin` (int64, n + 1): the string itself (character masking re-tokenises a
  batch's masked strings; the collapse check encodes a sample).

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

Read back as untrusted (the cache outlives the run that wrote it; anyone who can write there can edit it):
`manifest.json` must be a bounded, well-formed object of this key with non-negative counts; every file must be a
regular file of the size the counts give and the SHA-256 the manifest records; offsets must start at 0, never
decrease and end at their file's length; ids must lie inside the tokenizer's vocabulary. A store that fails any
check is set aside (renamed `<key>.damaged-<time>`, never used or deleted) with one warning line naming the
reason, and the strings are tokenised again.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import PositionedReader, file_sha256, parse_json, read_regular_bytes, set_aside
from mirrorbert.safeguards.writes import remove_tree, write_error, write_errors, write_failure

logger = logging.getLogger(__name__)

FORMAT = "mirrorbert-tokens/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 16
CHUNK = 8192  # strings per fast-tokenizer call: large enough for its batch speed, small enough to bound memory
OPTION = "MIRRORBERT_CACHE"  # what a cache error names: the variable that moves the cache
# file stem -> dtype; a string's ids and text are slices between consecutive offsets
FILES: dict[str, np.dtype] = {"ids": np.dtype(np.int32), "ids_offsets": np.dtype(np.int64),
                              "text": np.dtype(np.uint8), "text_offsets": np.dtype(np.int64)}
EXAMPLE_CHARS = 40
CHECKED = 32  # strings of each chunk also tokenised through the tokenizer's own call, as a check


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


# --------------------------------------------------------------------------- the stores
class TokenStore:
    """A built store folder, memory-mapped: `token_ids(indices)` and `texts(indices)` read only those strings."""

    def __init__(self, root: Path, meta: dict[str, Any]):
        self.root, self.meta = Path(root), meta
        self.n = int(meta["strings"])
        counts = _file_counts(meta)
        self._arrays = {stem: _memmap(self.root / f"{stem}.bin", dtype, counts[stem]) for stem, dtype in FILES.items()}
        self.ids, self.id_offsets = self._arrays["ids"], self._arrays["ids_offsets"]
        self.text, self.text_offsets = self._arrays["text"], self._arrays["text_offsets"]
        # A batch is read with positioned reads, not through the maps: a page fault maps the neighbouring pages
        # too (the kernel's fault-around), so random batches through a map left most of the store resident in
        # the process (10M strings, 100 steps: 2.4 GB of its RSS). The maps stay for bulk use.
        self._files = {stem: PositionedReader(open(self.root / f"{stem}.bin", "rb")) for stem in FILES}  # noqa: SIM115

    def __len__(self) -> int:
        return self.n

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]:
        return [np.frombuffer(raw, dtype=FILES["ids"]).tolist() for raw in self._slices("ids", indices)]

    def text_at(self, i: int) -> str:
        return _decode(self._slices("text", [i])[0])

    def texts(self, indices: Sequence[int]) -> list[str]:
        return [_decode(raw) for raw in self._slices("text", indices)]

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
    except UnicodeDecodeError:  # edited bytes with a matching manifest: shown replaced, never a traceback
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
    n = int(meta["strings"])
    return {"ids": int(meta["tokens"]), "ids_offsets": n + 1, "text": int(meta["text_bytes"]), "text_offsets": n + 1}


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


# --------------------------------------------------------------------------- open or build
def open_token_store(chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
                     cache_dir: str | Path | None = None) -> TokenStore:
    """The store of these strings under this tokenizer: the cached one when intact, else built from `chunks`
    (read only when building). `data_sha256` must be the strings' content hash (it keys the cache)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else token_cache_dir()
    key = store_key(data_sha256, tokenizer, max_length)
    root = cache_dir / key
    store = _cached(root, key, len(tokenizer))
    if store is not None:
        return store
    with write_errors(cache_dir, OPTION):  # a full disk: one line naming the cache, nothing left there
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir))
    try:
        meta = _write_store(tmp, chunks, tokenizer, max_length)
        meta.update(format=FORMAT, key=key, data_sha256=data_sha256, max_length=int(max_length),
                    vocab_size=len(tokenizer), tokenizer_class=type(tokenizer).__name__,
                    files={f"{stem}.bin": file_sha256(tmp / f"{stem}.bin", what=OPTION) for stem in FILES},
                    complete=True)
        (tmp / MANIFEST).write_text(jsonio.dumps(meta, indent=2) + "\n", encoding="utf-8")
        store = _cached(root, key, len(tokenizer), quiet=True)  # another run may have built it meanwhile
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


def _cached(root: Path, key: str, vocab_size: int, quiet: bool = False) -> TokenStore | None:
    """The intact store at `root`, or None (nothing there, or a damaged one, which is set aside)."""
    if not os.path.lexists(root):
        return None
    problem = store_problem(root, key, vocab_size)
    if problem is None:
        meta = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        if not quiet:
            logger.info("using the token store %s (%d strings)", root, meta["strings"])
        return TokenStore(root, meta)
    aside = set_aside(root, OPTION)
    logger.warning("token store %s is damaged (%s): set aside as %s; tokenising the strings again", root, problem,
                   aside.name)
    return None


# --------------------------------------------------------------------------- the streaming pass
def _write_store(out: Path, chunks: Iterable[Sequence[str]], tokenizer, max_length: int) -> dict[str, Any]:
    """One pass: each chunk tokenised in one call and appended to the four files; returns the counts."""
    special = special_ids(tokenizer)
    stack = contextlib.ExitStack()
    meta: dict[str, Any] = {"strings": 0, "tokens": 0, "text_bytes": 0, "read": 0, "dropped": 0,
                            "dropped_example": None, "max_chars": 0, "max_real_tokens": 0}
    handles = {stem: open(out / f"{stem}.bin", "wb") for stem in FILES}
    try:
        stack.enter_context(_tokenizer_threads())
        np.zeros(1, dtype=np.int64).tofile(handles["ids_offsets"])
        np.zeros(1, dtype=np.int64).tofile(handles["text_offsets"])
        for chunk in chunks:
            _append_chunk(handles, list(chunk), tokenizer, max_length, special, meta)
    finally:
        stack.close()
        for fh in handles.values():
            fh.close()
    return meta


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


def _append_chunk(handles, chunk: list[str], tokenizer, max_length: int, special: np.ndarray,
                  meta: dict[str, Any]) -> None:
    """Tokenise one chunk, drop its strings without real tokens, append ids, text and both offsets."""
    if not chunk:
        return
    encoded = _encode(tokenizer, chunk, max_length)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
    ends = np.cumsum(lengths)
    real_cum = np.concatenate([[0], np.cumsum(~np.isin(flat, special))])
    real = real_cum[ends] - real_cum[ends - lengths]
    keep = real > 0
    meta["read"] += len(chunk)
    if not keep.all():
        if meta["dropped_example"] is None:
            meta["dropped_example"] = chunk[int(np.argmin(keep))][:EXAMPLE_CHARS]
        meta["dropped"] += int((~keep).sum())
        flat = flat[np.repeat(keep, lengths)]
        lengths, chunk = lengths[keep], [s for s, k in zip(chunk, keep) if k]
    if not chunk:
        return
    texts = [s.encode("utf-8", "surrogatepass") for s in chunk]
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


def _encode(tokenizer, chunk: list[str], max_length: int) -> list[list[int]]:
    """`tokenizer(chunk, add_special_tokens=True, truncation=True, max_length=L)["input_ids"]`, through the fast
    backend's `encode_batch_fast` (no offsets computed: about twice the speed) where the tokenizer has one.

    The backend is called as transformers' own fast path calls it (longest-first truncation on the
    tokenizer's side, no padding), with the backend's settings put back afterwards; the first strings of each
    chunk are checked against the tokenizer's own call, and any difference sends the chunk that way.
    """
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
def store_problem(root: Path, key: str, vocab_size: int) -> str | None:
    """Why the store folder `root` cannot be used, or None when it is complete and intact (module docstring)."""
    if root.is_symlink() or not root.is_dir():
        return "not a folder"
    try:
        meta = parse_json(read_regular_bytes(root / MANIFEST, OPTION, MAX_MANIFEST_BYTES), OPTION, root / MANIFEST)
    except UserError as exc:
        return str(exc).split(": ", 1)[-1]
    problem = _manifest_problem(meta, key)
    if problem is not None:
        return problem
    counts = _file_counts(meta)
    for stem, dtype in FILES.items():
        path = root / f"{stem}.bin"
        if path.is_symlink() or not path.is_file():
            return f"{path.name} is missing or not a regular file"
        if path.stat().st_size != counts[stem] * dtype.itemsize:
            return f"{path.name} has {path.stat().st_size} bytes, the manifest needs {counts[stem] * dtype.itemsize}"
        if meta["files"].get(path.name) != file_sha256(path, what=OPTION):
            return f"{path.name}: SHA-256 differs from the manifest's"
    return _content_problem(root, meta, counts, vocab_size)


def _manifest_problem(meta: Any, key: str) -> str | None:
    if not isinstance(meta, dict) or meta.get("complete") is not True or meta.get("key") != key \
            or meta.get("format") != FORMAT:
        return "manifest.json is incomplete or of other strings"
    for name in ("strings", "tokens", "text_bytes", "read", "dropped", "max_chars", "max_real_tokens"):
        value = meta.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"manifest.json: {name} is not a count"
    if not isinstance(meta.get("files"), dict) or not isinstance(meta.get("dropped_example"), (str, type(None))):
        return "manifest.json has no checksums"
    return None


def _content_problem(root: Path, meta: dict[str, Any], counts: dict[str, int], vocab_size: int) -> str | None:
    """Offsets from 0, never decreasing, to their file's end; ids inside the vocabulary. Read a block at a time
    with plain reads, not through the memory map: a check of every page would otherwise leave the whole store
    resident in this process (10M sentences: 1.4 GB of ids)."""
    for stem, target in (("ids", "ids_offsets"), ("text", "text_offsets")):
        previous, last = None, None
        for block in _blocks(root / f"{target}.bin", FILES[target], counts[target]):
            if (previous is None and int(block[0]) != 0) or (previous is not None and int(block[0]) < previous) \
                    or bool((np.diff(block) < 0).any()):
                return f"{target}.bin holds offsets out of order or past {stem}.bin"
            previous = last = int(block[-1])
        if last != counts[stem]:
            return f"{target}.bin holds offsets out of order or past {stem}.bin"
    for block in _blocks(root / "ids.bin", FILES["ids"], counts["ids"]):
        if int(block.min()) < 0 or int(block.max()) >= vocab_size:
            return "ids.bin holds ids outside the vocabulary"
    return None


def _blocks(path: Path, dtype: np.dtype, count: int, size: int = 1 << 22):
    """The file's `count` values, `size` at a time (plain reads: nothing stays mapped)."""
    with open(path, "rb") as fh:
        for start in range(0, count, size):
            block = np.fromfile(fh, dtype=dtype, count=min(size, count - start))
            if block.size == 0:
                return
            yield block


__all__ = ["CHUNK", "ListStore", "StoreStrings", "TokenStore", "cache_root", "open_token_store",
           "store_key", "store_problem", "token_cache_dir", "tokenizer_fingerprint"]
