"""The token store's files and reading them: `TokenStore` over a built store folder, `ListStore` over lists.

A store keeps, per training string i (in the order given, after dropping strings without tokens):

* `ids.bin` (int32) and `ids_offsets.bin` (int64, n + 1): its token ids, special tokens included and truncated at
  `max_length` exactly as `tokenizer(s, add_special_tokens=True, truncation=True, max_length=L)` gives them, are
  `ids[off[i]:off[i + 1]]`;
* `text.bin` (UTF-8) and `text_offsets.bin` (int64, n + 1): the string itself (character masking re-tokenises a
  batch's masked strings; the collapse check encodes a sample);
* `dropped.bin`, `dropped_offsets.bin` and `dropped_at.bin` (int64): the strings without real tokens and their
  positions among the strings read, so that the store's strings can be checked against the data's hash.

A batch reads only its strings (positioned reads: `os.pread`; the files are also open as `numpy.memmap` for bulk
use), so a run's memory does not grow with the number of strings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import PositionedReader

FORMAT = "mirrorbert-tokens/2"  # in the cache key and the manifest: a store of another format is built again
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
INT64 = np.dtype(np.int64)


class StoreDamaged(Exception):
    """Why a cached store cannot be used (its message is the reason the warning names)."""


def string_bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")  # as written (a lone surrogate of a Python caller kept)


class TokenStore:
    """A built store folder, memory-mapped: `token_ids(indices)` and `texts(indices)` read only those strings.

    `files` are the store's files, opened (and checked) by `open_token_store`; without them they are opened
    through the store's `ConfinedFolder`."""

    def __init__(self, root: Path, meta: dict[str, Any], files: dict[str, Any] | None = None):
        self.root, self.meta = Path(root), meta
        self.n = int(meta["strings"])
        counts = file_counts(meta)
        if files is None:
            files = open_files(ConfinedFolder(self.root, OPTION, KIND), counts)
        self._handles = files
        self._arrays = {stem: _memmap(files[stem], dtype, counts[stem]) for stem, dtype in FILES.items()}
        self.ids, self.id_offsets = self._arrays["ids"], self._arrays["ids_offsets"]
        self.text, self.text_offsets = self._arrays["text"], self._arrays["text_offsets"]
        # A batch is read with positioned reads, not through the maps: a page fault maps the neighbouring pages
        # too (the kernel's fault-around), so random batches through a map leave most of the store resident in
        # the process (benchmarks/train_scale.py measures the peak RSS). The maps stay for bulk use.
        self._files = {stem: PositionedReader(fh) for stem, fh in files.items()}

    def __len__(self) -> int:
        return self.n

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]:
        return [np.frombuffer(raw, dtype=FILES["ids"]).tolist() for raw in self._slices("ids", indices)]

    def text_at(self, i: int) -> str:
        return decode_string(self._slices("text", [i])[0])

    def texts(self, indices: Sequence[int]) -> list[str]:
        return [decode_string(raw) for raw in self._slices("text", indices)]

    def dropped_texts(self) -> list[str]:
        """The strings without real tokens that the store left out, in their order."""
        count = int(self.meta["dropped"])
        bounds = read_array(self._files["dropped_offsets"], INT64, 0, count + 1).tolist()
        raw = self._files["dropped"].read(0, bounds[-1]) if count else b""
        return [decode_string(raw[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

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


def decode_string(raw: bytes) -> str:
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


def file_counts(meta: dict[str, Any]) -> dict[str, int]:
    n, dropped = int(meta["strings"]), int(meta["dropped"])
    return {"ids": int(meta["tokens"]), "ids_offsets": n + 1, "text": int(meta["text_bytes"]), "text_offsets": n + 1,
            "dropped": int(meta["dropped_bytes"]), "dropped_offsets": dropped + 1, "dropped_at": dropped}


def open_files(folder: ConfinedFolder, counts: dict[str, int]) -> dict[str, Any]:
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


def read_array(reader: PositionedReader, dtype: np.dtype, start: int, count: int) -> np.ndarray:
    """`count` values of `dtype` from value `start` of a file, by one positioned read (nothing mapped)."""
    return np.frombuffer(reader.read(start * dtype.itemsize, count * dtype.itemsize), dtype=dtype)
