"""An index folder's files read back as untrusted, through its `ConfinedFolder`; each refusal is one `UserError`
naming the file. Every file's SHA-256 is matched before it is parsed, from the same open file; a hit's text is read
again when shown (`StoredTexts`) and must be the line that was checked; with `--corpus`, the texts and ids are
checked against the corpus's records (`CorpusRecords`).
"""

from __future__ import annotations

import collections.abc
import hashlib
import io
import json
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mirrorbert.data.hf_datasets import input_kind, table_records
from mirrorbert.data.readers import MAX_LINE_BYTES, encodable, iter_records, read_errors
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import PositionedReader, open_checked, stream_sha256
from mirrorbert.search.approximate import IVFParts
from mirrorbert.search.index_claims import IVF_FILES, Manifest

FINITE_CHUNK = 1 << 16  # rows checked finite at a time
NORM_TOLERANCE = 1e-3  # |norm - 1| of a stored row: l2_normalize in float32 is within 1e-6 of 1
MAX_TEXT_LINE = 6 * MAX_LINE_BYTES + 3  # a line of texts.jsonl: a corpus line, every byte a \u escape at worst


def damaged(folder: ConfinedFolder | Path, name: str, problem: str) -> UserError:
    where = folder.given if isinstance(folder, ConfinedFolder) else folder
    option = folder.option if isinstance(folder, ConfinedFolder) else "--index"
    return UserError(f"{option} {where / name}: damaged ({problem}); rebuild the index with `mirrorbert index`")


def npy_header(buffer: BinaryIO, folder: Path, name: str) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran order, dtype) of a .npy file's header, read without pickles; the buffer is left at
    the first data byte."""
    try:
        version = np.lib.format.read_magic(buffer)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(buffer)
        if version in ((2, 0), (3, 0)):
            return np.lib.format.read_array_header_2_0(buffer)
        raise ValueError(f"unknown .npy version {version}")
    except (ValueError, SyntaxError, TypeError, OverflowError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise damaged(folder, name, f"not a .npy file: {reason}") from None


def _data_offset(folder: ConfinedFolder, name: str, buffer: BinaryIO, size: int, dtype: str, shape: tuple) -> int:
    """Where the data of a .npy file of `size` bytes starts, once its header says `dtype` and `shape` and the data
    has the length they need."""
    found_shape, fortran, found = npy_header(buffer, folder, name)
    if found.hasobject or found != np.dtype(dtype):
        raise damaged(folder, name, f"dtype {found}, expected {np.dtype(dtype).name} (an index holds no objects)")
    if fortran or tuple(found_shape) != shape:
        raise damaged(folder, name, f"shape {tuple(found_shape)}, manifest.json says {shape}")
    need = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size - buffer.tell() != need:
        raise damaged(folder, name, f"{size - buffer.tell()} bytes of data, the header needs {need}")
    return buffer.tell()


def own_npy(path: Path) -> np.ndarray:
    """A .npy this run has just written (a temporary of the write policy), memory-mapped read-only through the
    reader's open (a link there is refused, never followed)."""
    with os.fdopen(open_checked(path, follow=False), "rb") as fh:
        shape, fortran, dtype = npy_header(fh, path.parent, path.name)
        return np.memmap(fh, dtype=dtype, mode="r", offset=fh.tell(), shape=tuple(shape),
                         order="F" if fortran else "C")


def open_vectors(folder: ConfinedFolder, rows: int, dim: int, expected_sha256: str) -> np.ndarray:
    """vectors.npy memory-mapped read-only as float32 [rows, dim] from the file whose SHA-256 and header were
    checked; every value finite and every row of unit length (a longer row would win every query)."""
    name = "vectors.npy"
    with os.fdopen(folder.open(name, 4096 + rows * dim * 4), "rb") as fh:
        if stream_sha256(fh) != expected_sha256:
            raise damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
        fh.seek(0)
        offset = _data_offset(folder, name, fh, os.fstat(fh.fileno()).st_size, "<f4", (rows, dim))
        vectors = np.memmap(fh, dtype="<f4", mode="r", offset=offset, shape=(rows, dim))
    for r0 in range(0, rows, FINITE_CHUNK):
        chunk = vectors[r0:r0 + FINITE_CHUNK]
        finite = np.isfinite(chunk).all(axis=1)
        if not finite.all():
            raise damaged(folder, name, f"row {r0 + int(np.flatnonzero(~finite)[0])} is not finite (NaN or infinity)")
        norms = np.sqrt(np.einsum("ij,ij->i", chunk, chunk, dtype=np.float64))
        off = np.flatnonzero((np.abs(norms - 1) > NORM_TOLERANCE) & (norms != 0))
        if off.size:
            raise damaged(folder, name, f"row {r0 + int(off[0])} has length {norms[off[0]]:.4g}, not 1 (the "
                                        "vectors of an index are L2-normalised)")
    return vectors


def read_checked(folder: ConfinedFolder, name: str, expected_sha256: str, limit: int) -> bytes:
    """A file of the index, whole: its size bounded, its SHA-256 matched before it is parsed."""
    raw = folder.read_bytes(name, limit)
    if hashlib.sha256(raw).hexdigest() != expected_sha256:
        raise damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
    return raw


def read_small_npy(folder: ConfinedFolder, name: str, expected_sha256: str, dtype: str, shape: tuple) -> np.ndarray:
    """A small array file of the index, whole: size bounded by its shape, SHA-256 matched before parsing,
    header and length checked."""
    raw = read_checked(folder, name, expected_sha256, 4096 + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    offset = _data_offset(folder, name, io.BytesIO(raw), len(raw), dtype, shape)
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(shape).copy()


def read_ids_npy(folder: ConfinedFolder, rows: int, corpus_lines: int, expected_sha256: str) -> np.ndarray:
    """ids.npy: `rows` int64 line numbers of the corpus, increasing, each below its line count."""
    name = "ids.npy"
    ids = read_small_npy(folder, name, expected_sha256, "<i8", (rows,))
    bad = np.flatnonzero((ids < 0) | (ids >= corpus_lines))
    if bad.size:
        raise damaged(folder, name, f"entry {bad[0]} is {ids[bad[0]]}, not a line number of the corpus "
                                    f"(0 to {corpus_lines - 1})")
    back = np.flatnonzero(np.diff(ids) <= 0)
    if back.size:
        raise damaged(folder, name, f"entry {back[0] + 1} ({ids[back[0] + 1]}) is not after the one before it")
    return ids


def read_ivf_parts(folder: ConfinedFolder, rows: int, dim: int, ivf: dict, files: dict):
    """The IVF parts the manifest describes, each file checked: centroids [nlist, dim] and the 8-bit quantiser's
    ranges [2 * dim] (a minimum and a range per dimension) finite float32, list numbers [rows] int32 in
    0..nlist-1. A tampered part that passes can only make the index find fewer true neighbours."""
    nlist = ivf["nlist"]
    centroids = read_small_npy(folder, IVF_FILES[0], files[IVF_FILES[0]], "<f4", (nlist, dim))
    sq = read_small_npy(folder, IVF_FILES[1], files[IVF_FILES[1]], "<f4", (2 * dim,))
    lists = read_small_npy(folder, IVF_FILES[2], files[IVF_FILES[2]], "<i4", (rows,))
    for name, array in zip(IVF_FILES[:2], (centroids, sq)):
        if not np.isfinite(array).all():
            raise damaged(folder, name, "a value is not finite (NaN or infinity)")
    bad = np.flatnonzero((lists < 0) | (lists >= nlist))
    if bad.size:
        raise damaged(folder, IVF_FILES[2], f"entry {bad[0]} is {lists[bad[0]]}, not a list number "
                                            f"(0 to {nlist - 1}, manifest.json's nlist)")
    return IVFParts(centroids, sq, lists, ivf["nprobe"], ivf["seed"])


class StoredTexts(collections.abc.Sequence):
    """The index's texts, each read from the checked texts.jsonl (kept open) when a hit needs it; a line read
    again must have the digest it had when it was checked (a file rewritten in place since is refused)."""

    def __init__(self, folder: ConfinedFolder, reader: PositionedReader, starts, digests):
        self.folder, self._reader, self._starts, self._digests = folder, reader, starts, digests

    def __len__(self) -> int:
        return len(self._starts) - 1

    def lengths(self):
        """Each row's stored line length in bytes (an array), without reading the texts."""
        return np.diff(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]
        start, end = int(self._starts[index]), int(self._starts[index + 1])
        line = self._reader.read(start, end - start)
        if _digest(line) != self._digests[index]:
            raise damaged(self.folder, f"texts.jsonl:{index + 1}", "changed since it was checked")
        return _parse_text(self.folder, f"texts.jsonl:{index + 1}", line[:-1] if line.endswith(b"\n") else line)

    def close(self) -> None:
        self._reader.close()


def read_texts(folder: ConfinedFolder, manifest: Manifest, corpus: "CorpusRecords | None" = None) -> StoredTexts:
    """texts.jsonl, checked whole (its SHA-256, `rows` lines, each a JSON string; with `corpus` each the text of
    the corpus's record), then kept open for `StoredTexts`."""
    name = "texts.jsonl"
    fh = os.fdopen(folder.open(name, 1 << 34), "rb")
    try:
        if stream_sha256(fh) != manifest.files[name]:
            raise damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
        fh.seek(0)
        starts = np.zeros(manifest.rows + 1, dtype=np.int64)
        digests = np.zeros(manifest.rows, dtype=np.uint64)
        position = lineno = 0
        while line := fh.readline(MAX_TEXT_LINE + 1):
            lineno += 1
            if lineno > manifest.rows:
                raise damaged(folder, name, f"{lineno + _newlines(fh)} lines, manifest.json says "
                                            f"{manifest.rows} rows")
            if len(line) > MAX_TEXT_LINE:
                raise damaged(folder, f"{name}:{lineno}", f"a line longer than {MAX_TEXT_LINE} bytes")
            text = _parse_text(folder, f"{name}:{lineno}", line[:-1] if line.endswith(b"\n") else line)
            if corpus is not None:
                corpus.check(lineno - 1, text)
            position += len(line)
            starts[lineno], digests[lineno - 1] = position, _digest(line)
        if lineno != manifest.rows:
            raise damaged(folder, name, f"{lineno} lines, manifest.json says {manifest.rows} rows")
        if corpus is not None:
            corpus.finish()
    except BaseException:
        fh.close()
        raise
    return StoredTexts(folder, PositionedReader(fh), starts, digests)


def _digest(line: bytes) -> int:
    """A line's 64-bit BLAKE2b digest: what `StoredTexts` matches a line read again against."""
    return int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little")


def _newlines(fh) -> int:
    """Line ends left in an open file, counted a block at a time."""
    return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 22), b""))


def _parse_text(folder: ConfinedFolder, where: str, line: bytes) -> str:
    """One line of texts.jsonl: a JSON string (nothing nested), valid UTF-8, no lone surrogate."""
    if not line.startswith(b'"'):
        raise damaged(folder, where, "expected a JSON string")
    try:
        text = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise damaged(folder, where, f"not a JSON string: {str(exc)[:80]}") from None
    if not isinstance(text, str):
        raise damaged(folder, where, "expected a JSON string")
    if not encodable(text):  # a lone surrogate escape: not text, and unprintable as a hit
        raise damaged(folder, where, "a lone surrogate escape, not text")
    return text


class CorpusRecords:
    """The corpus's non-blank records (--corpus, matched against the manifest's SHA-256) walked beside texts.jsonl:
    row i of the index must be the i-th of them, with that record's id and text."""

    def __init__(self, corpus: str | Path, manifest: Manifest, ids, skip_bad_lines: bool, folder: ConfinedFolder):
        self.path, self.manifest, self.ids, self.folder = Path(corpus), manifest, ids, folder
        self.records = _non_blank_records(self.path, manifest, skip_bad_lines)

    def check(self, row: int, text: str) -> None:
        record = next(self.records, None)
        if record is None:
            raise UserError(f"--corpus {self.path}: {row} entries, but the index {self.folder.given} has "
                            f"{self.manifest.rows} rows: not the corpus it was built from; rebuild it with "
                            "`mirrorbert index`")
        record_id, expected = record
        if int(self.ids[row]) != record_id:
            raise damaged(self.folder, "ids.npy", f"entry {row} is {int(self.ids[row])}, but the corpus's entry "
                                                  f"{row} is its record {record_id}")
        if text != expected:
            raise damaged(self.folder, f"texts.jsonl:{row + 1}", f"not the text of record {record_id} of "
                                                                 f"--corpus {self.path}")

    def finish(self) -> None:
        if next(self.records, None) is not None:
            raise UserError(f"--corpus {self.path}: more entries than the {self.manifest.rows} rows of the index "
                            f"{self.folder.given}: not the corpus it was built from; rebuild it with "
                            "`mirrorbert index`")


def _non_blank_records(path: Path, manifest: Manifest, skip_bad_lines: bool):
    """(record id, text) of the corpus's non-blank records, read as `mirrorbert index` read them (the manifest's
    --column/--field/--no-header)."""
    if input_kind(path, "--corpus") == "table":
        records = table_records(path, manifest.column, "--corpus")
    else:
        records = iter_records(path, manifest.column, manifest.field, skip_bad_lines, [], "--corpus", manifest.header)
    with read_errors(path, "--corpus"):
        yield from ((record_id, text) for record_id, text in records if text.strip())


__all__ = ["CorpusRecords", "MAX_TEXT_LINE", "StoredTexts", "damaged", "npy_header", "open_vectors", "read_checked",
           "read_ids_npy", "read_ivf_parts", "read_small_npy", "read_texts"]
