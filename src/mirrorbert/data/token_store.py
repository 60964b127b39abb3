"""Mirror-BERT's training strings in the token cache (`data.token_cache`), one row per string, in
`<cache>/tokens/<key>/` (the key: the strings' `data.strings.fingerprint`, the tokenizer, `max_length`):

* `ids.bin` (int32), `ids_offsets.bin` (int64, rows + 1): row r's ids, `ids[off[r]:off[r + 1]]`, as
  `tokenizer(s, add_special_tokens=True, truncation=True, max_length=L)` gives them;
* `text.bin` (UTF-8), `text_offsets.bin` (int64, rows + 1): the string itself;
* `dropped_at.bin` (int64): the rows whose ids are all special tokens, left out of training (the store's
  string i is the i-th other row).
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from mirrorbert.data.token_cache import (ArrayWriter, CacheDamaged, CacheEntry, cache_key, cache_root, encode_chunk,
                                         open_cache, rows_to_check, tokenizer_threads)
from mirrorbert.errors import UserError

FORMAT = "mirrorbert-tokens/3"  # in the cache key and the manifest: a store of another format is built again
OPTION = "MIRRORBERT_CACHE"  # what a cache error names: the variable that moves the cache
CHUNK = 8192  # strings per fast-tokenizer call: large enough for its batch speed, small enough to bound memory
ROWS = 1 << 16  # rows a check reads at a time
EXAMPLE_CHARS = 40
FILES = {"ids.bin": np.dtype(np.int32), "ids_offsets.bin": np.dtype(np.int64), "text.bin": np.dtype(np.uint8),
         "text_offsets.bin": np.dtype(np.int64), "dropped_at.bin": np.dtype(np.int64)}


def decode_string(raw: bytes) -> str:
    try:
        return raw.decode("utf-8", "surrogatepass")  # as written (a lone surrogate of a Python caller kept)
    except UnicodeDecodeError:  # never for a checked store; shown replaced, never a traceback
        return raw.decode("utf-8", "replace")


def store_key(data_sha256: str, tokenizer, max_length: int) -> str:
    return cache_key(FORMAT, data_sha256, tokenizer, max_length=int(max_length))


def open_token_store(chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
                     cache_dir: str | Path | None = None, source: str = "--data") -> "TokenStore":
    """The store of these strings under this tokenizer: the cached one once checked against `data_sha256` (the
    strings' `data.strings.fingerprint`), else built from `chunks` (read only when building); `source` names the
    data in the error when the strings streamed are not the ones the fingerprint was taken from."""
    layout = StringsLayout(chunks, data_sha256, tokenizer, max_length, source)
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "tokens"
    return TokenStore(open_cache(layout, folder, own=cache_dir is None))


class StringsLayout:
    """The token cache's layout of training strings: the files, one pass to write them, one to check them."""

    fmt, kind, redo, option, files = FORMAT, "token store", "tokenising the strings", OPTION, FILES

    def __init__(self, chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
                 source: str = "--data"):
        self.chunks, self.data_sha256, self.tokenizer, self.max_length = chunks, data_sha256, tokenizer, max_length
        self.source, self.key = source, store_key(data_sha256, tokenizer, max_length)
        self.name = self.key
        self.special = np.array(sorted({int(i) for i in tokenizer.all_special_ids}), dtype=np.int64)

    def write(self, writer: ArrayWriter) -> dict[str, Any]:
        """Each chunk tokenised in one call and appended; the strings streamed must be those the fingerprint was
        taken from: otherwise the data changed under the run, and nothing is kept."""
        rows = _Rows(writer, self.special)
        with tokenizer_threads():
            for chunk in self.chunks:
                chunk = list(chunk)
                texts = [s.encode("utf-8", "surrogatepass") for s in chunk]  # a Python caller's lone surrogate kept
                encoded = encode_chunk(self.tokenizer, chunk, self.max_length)
                id_lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
                rows.append(np.frombuffer(b"".join(texts), dtype=np.uint8),
                            np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)),
                            np.fromiter(itertools.chain.from_iterable(encoded), np.int64, int(id_lengths.sum())),
                            id_lengths)
        if rows.digest.hexdigest() != self.data_sha256:
            raise UserError(f"{self.source}: the strings changed while they were read (their SHA-256 is no longer "
                            "the one taken when the run read them: was the file edited during the run?); nothing "
                            "was cached, run again once the file is complete")
        return self._meta(rows)

    def replay(self, entry: CacheEntry, writer: ArrayWriter) -> dict[str, Any]:
        """The pass again over the rows the entry holds, a block at a time (positioned reads, nothing mapped); then
        the strings must hash to the data's fingerprint, and the rows tokenised again (all, or a fresh sample, and
        every row left out) must give the stored ids."""
        rows, n = _Rows(writer, self.special), entry.counts["ids_offsets.bin"] - 1
        sample, again = rows_to_check(n), []
        for a in range(0, max(n, 0), ROWS):
            b = min(n, a + ROWS)
            (ids, id_lengths), (text, text_lengths) = _block(entry, "ids", a, b), _block(entry, "text", a, b)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= len(self.tokenizer)):
                raise CacheDamaged("ids.bin holds ids outside the vocabulary")
            keep = rows.append(text, text_lengths, ids.astype(np.int64), id_lengths)
            picked = np.arange(a, b) if sample is None else sample[(sample >= a) & (sample < b)]
            again.append(np.union1d(picked, a + np.flatnonzero(~keep)))
        if rows.digest.hexdigest() != self.data_sha256:
            raise CacheDamaged("text.bin does not hold the data's strings (their SHA-256 is not the data's)")
        again = np.concatenate(again) if again else np.zeros(0, dtype=np.int64)
        with tokenizer_threads():
            for start in range(0, len(again), CHUNK):
                group = again[start:start + CHUNK]
                texts = [decode_string(raw) for raw in _slices(entry, "text", group)]
                stored = [np.frombuffer(raw, dtype=np.int32).tolist() for raw in _slices(entry, "ids", group)]
                if encode_chunk(self.tokenizer, texts, self.max_length) != stored:
                    raise CacheDamaged("ids.bin holds ids that are not the tokenizer's ids of the strings")
        return self._meta(rows)

    def _meta(self, rows: "_Rows") -> dict[str, Any]:
        dropped = rows.writer.counts["dropped_at.bin"]
        return {**rows.stats, "strings": rows.stats["read"] - dropped, "dropped": dropped,
                "data_sha256": self.data_sha256, "max_length": int(self.max_length),
                "vocab_size": len(self.tokenizer), "tokenizer_class": type(self.tokenizer).__name__}


class _Rows:
    """The one pass over rows, building a store or checking one: each block of rows appended to the files (the
    rows without a real token listed in dropped_at.bin), the strings hashed as `data.strings.fingerprint` hashes
    them, and the counts the manifest records."""

    def __init__(self, writer: ArrayWriter, special: np.ndarray):
        self.writer, self.special, self.digest = writer, special, hashlib.sha256()
        self.stats: dict[str, Any] = {"read": 0, "dropped_example": None, "max_chars": 0, "max_real_tokens": 0}
        writer.append("ids_offsets.bin", [0])
        writer.append("text_offsets.bin", [0])

    def append(self, text: np.ndarray, text_lengths: np.ndarray, ids: np.ndarray,
               id_lengths: np.ndarray) -> np.ndarray:
        """Append a block of rows (their UTF-8 bytes and ids, end to end, with each row's lengths); which rows
        have a real token."""
        w, s, ends = self.writer, self.stats, np.cumsum(text_lengths)
        self.digest.update(np.insert(text, ends, 10))  # each string followed by a newline
        id_ends, real_cum = np.cumsum(id_lengths), np.concatenate([[0], np.cumsum(~np.isin(ids, self.special))])
        real = real_cum[id_ends] - real_cum[id_ends - id_lengths]  # each row's ids that are not special
        keep = real > 0
        for stem, data, lengths in (("ids", ids, id_lengths), ("text", text, text_lengths)):
            base = w.counts[f"{stem}.bin"]
            w.append(f"{stem}.bin", data)
            w.append(f"{stem}_offsets.bin", base + np.cumsum(lengths))
        w.append("dropped_at.bin", s["read"] + np.flatnonzero(~keep))
        if s["dropped_example"] is None and not keep.all():
            i = int(np.argmin(keep))
            s["dropped_example"] = decode_string(text[ends[i] - text_lengths[i]:ends[i]].tobytes())[:EXAMPLE_CHARS]
        if keep.any():
            starts = np.concatenate([[0], np.cumsum((text & 0xC0) != 0x80)])  # UTF-8: bytes that start a character
            chars = starts[ends] - starts[ends - text_lengths]
            s["max_chars"] = max(s["max_chars"], int(chars[keep].max()))
            s["max_real_tokens"] = max(s["max_real_tokens"], int(real[keep].max()))
        s["read"] += len(keep)
        return keep


def _block(entry: CacheEntry, stem: str, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows a..b of `<stem>.bin`, end to end, and their lengths; offsets that go down or past the file are damage."""
    off = entry.read(f"{stem}_offsets.bin", a, b - a + 1)
    if bool((np.diff(off) < 0).any()) or int(off[0]) < 0 or int(off[-1]) > entry.counts[f"{stem}.bin"]:
        raise CacheDamaged(f"{stem}_offsets.bin holds offsets out of order or past {stem}.bin")
    return entry.read(f"{stem}.bin", int(off[0]), int(off[-1] - off[0])), np.diff(off)


def _slices(entry: CacheEntry, stem: str, rows: np.ndarray) -> list[bytes]:
    """The raw bytes of `rows` of `<stem>.bin`: two positioned reads per row, or two in all for consecutive rows."""
    offsets, data = entry.readers[f"{stem}_offsets.bin"], entry.readers[f"{stem}.bin"]
    size = entry.dtypes[f"{stem}.bin"].itemsize
    if len(rows) > 1 and np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows))):
        bounds = np.frombuffer(offsets.read(8 * int(rows[0]), 8 * (len(rows) + 1)), dtype=np.int64)
        block = data.read(size * int(bounds[0]), size * int(bounds[-1] - bounds[0]))
        starts = (bounds - bounds[0]) * size
        return [block[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
    out = []
    for r in rows.tolist():
        a, b = np.frombuffer(offsets.read(8 * r, 16), dtype=np.int64).tolist()
        out.append(data.read(size * a, size * (b - a)))
    return out


class TokenStore:
    """A checked store, memory-mapped: `token_ids(indices)` and `texts(indices)` read only those strings (the rows
    left out skipped: index i is the i-th row with a real token)."""

    def __init__(self, entry: CacheEntry):
        self.entry, self.root, self.meta = entry, entry.root, entry.manifest
        self.n = int(self.meta["strings"])
        self.max_chars, self.max_real_tokens, self.dropped = (int(self.meta[k]) for k in
                                                              ("max_chars", "max_real_tokens", "dropped"))
        at = entry.read("dropped_at.bin")
        self._skip = at - np.arange(len(at))  # strings kept before each row left out

    def __len__(self) -> int:
        return self.n

    def _rows(self, indices: Sequence[int]) -> np.ndarray:
        if isinstance(indices, range) and indices.step == 1 and len(indices):
            kept = np.arange(range(self.n)[indices.start], range(self.n)[indices.stop - 1] + 1)
        else:
            kept = np.fromiter((range(self.n)[i] for i in indices), dtype=np.int64)  # IndexError outside
        return kept + np.searchsorted(self._skip, kept, side="right")

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]:
        return [np.frombuffer(raw, dtype=np.int32).tolist() for raw in _slices(self.entry, "ids", self._rows(indices))]

    def texts(self, indices: Sequence[int]) -> list[str]:
        return [decode_string(raw) for raw in _slices(self.entry, "text", self._rows(indices))]

    def dropped_texts(self) -> list[str]:
        """The strings without real tokens that the store leaves out, in their order."""
        return [decode_string(raw) for raw in _slices(self.entry, "text", self.entry.read("dropped_at.bin"))]

    def close(self) -> None:
        self.entry.close()

    @property
    def strings(self) -> "StoreStrings":
        return StoreStrings(self)


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
        return self.store.texts([i])[0]  # IndexError outside

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


__all__ = ["CHUNK", "ListStore", "StoreStrings", "StringsLayout", "TokenStore", "open_token_store", "store_key"]
