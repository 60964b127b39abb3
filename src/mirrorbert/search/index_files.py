"""Reading an index folder's numpy files back as untrusted: the vectors memory-mapped, ids.npy, the IVF parts.

Why a module of its own: the vectors of a large index (10M x 768 float32 is 30 GB) must never be read into
memory whole, so `vectors.npy` is hashed in a streaming pass, its header parsed without pickles and checked
against the manifest, and then memory-mapped from the same open file; its values are checked finite a chunk
at a time. The small arrays (ids.npy, the IVF centroids, quantiser ranges and list numbers) are read whole
after their checksum matched, and their dtype, shape and values are checked before any use. Every file is
opened through the folder's `safeguards.confined.ConfinedFolder` (inside the folder, a regular file, of
bounded size). Every refusal is one `UserError` naming the file.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import stream_sha256

FINITE_CHUNK = 1 << 16  # rows checked finite at a time
NORM_TOLERANCE = 1e-3  # |norm - 1| of a stored row: l2_normalize in float32 is within 1e-6 of 1


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


def _check_layout(folder: Path, name: str, header, dtype: str, shape: tuple, noun: str) -> None:
    found_shape, fortran, found = header
    if found.hasobject or found != np.dtype(dtype):
        raise damaged(folder, name, f"dtype {found}, expected {noun} (an index holds no objects)")
    if fortran or tuple(found_shape) != shape:
        raise damaged(folder, name, f"shape {tuple(found_shape)}, manifest.json says {shape}")


def open_member(folder: ConfinedFolder, name: str, limit: int) -> BinaryIO:
    """A file of the index opened through the confined reader: inside the folder, a regular file (a FIFO or a
    link leading out is refused before any read), at most `limit` bytes."""
    return os.fdopen(folder.open(name, limit), "rb")


def open_vectors(folder: ConfinedFolder, rows: int, dim: int, expected_sha256: str | None) -> np.ndarray:
    """vectors.npy memory-mapped read-only as float32 [rows, dim]: its size bounded, its SHA-256 (when
    recorded) matched by a streaming pass over the opened file, its header checked, then the same file mapped;
    every value finite and every row of unit length (search ranks by inner product: a longer row would win
    every query), checked a chunk at a time, so only the page cache holds it."""
    name = "vectors.npy"
    with open_member(folder, name, 4096 + rows * dim * 4) as fh:
        size = os.fstat(fh.fileno()).st_size
        if expected_sha256 is not None and stream_sha256(fh) != expected_sha256:
            raise damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
        fh.seek(0)
        _check_layout(folder, name, npy_header(fh, folder, name), "<f4", (rows, dim), "float32")
        offset = fh.tell()
        if size - offset != rows * dim * 4:
            raise damaged(folder, name, f"{size - offset} bytes of data, the header needs {rows * dim * 4}")
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


def read_checked(folder: ConfinedFolder, name: str, expected_sha256: str | None, limit: int) -> bytes:
    """A file of the index, whole: its size bounded, its SHA-256 (when recorded) matched before it is parsed."""
    raw = folder.read_bytes(name, limit)
    if expected_sha256 is not None and hashlib.sha256(raw).hexdigest() != expected_sha256:
        raise damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
    return raw


def read_small_npy(folder: ConfinedFolder, name: str, expected_sha256: str | None, dtype: str, shape: tuple,
                   noun: str) -> np.ndarray:
    """A small array file of the index, whole: size bounded by its shape, SHA-256 matched (when recorded)
    before parsing, header and length checked."""
    itemsize = np.dtype(dtype).itemsize
    raw = read_checked(folder, name, expected_sha256, 4096 + int(np.prod(shape)) * itemsize)
    buffer = io.BytesIO(raw)
    _check_layout(folder, name, npy_header(buffer, folder, name), dtype, shape, noun)
    need = int(np.prod(shape)) * itemsize
    if len(raw) - buffer.tell() != need:
        raise damaged(folder, name, f"{len(raw) - buffer.tell()} bytes of data, the header needs {need}")
    return np.frombuffer(raw, dtype=dtype, offset=buffer.tell()).reshape(shape).copy()


def read_ids_npy(folder: ConfinedFolder, rows: int, corpus_lines: int, expected_sha256: str | None) -> np.ndarray:
    """ids.npy: `rows` int64 line numbers of the corpus, increasing, each below its line count."""
    name = "ids.npy"
    ids = read_small_npy(folder, name, expected_sha256, "<i8", (rows,), "int64")
    bad = np.flatnonzero((ids < 0) | (ids >= corpus_lines))
    if bad.size:
        raise damaged(folder, name, f"entry {bad[0]} is {ids[bad[0]]}, not a line number of the corpus "
                                    f"(0 to {corpus_lines - 1})")
    back = np.flatnonzero(np.diff(ids) <= 0)
    if back.size:
        raise damaged(folder, name, f"entry {back[0] + 1} ({ids[back[0] + 1]}) is not after the one before it")
    return ids


IVF_FILES = ("ivf_centroids.npy", "ivf_sq.npy", "ivf_lists.npy")


def read_ivf_parts(folder: ConfinedFolder, rows: int, dim: int, ivf: dict, files: dict | None):
    """The IVF parts the manifest describes, each file checked: centroids [nlist, dim] and quantiser ranges
    [2 * dim] finite float32, list numbers [rows] int32 in 0..nlist-1. A tampered part that passes these
    checks can only make the index find fewer true neighbours: ids are row numbers by construction and
    every score is recomputed from vectors.npy."""
    from mirrorbert.search.approximate import IVFParts, sq_trained_size

    nlist = ivf["nlist"]
    sums = files or {}
    centroids = read_small_npy(folder, IVF_FILES[0], sums.get(IVF_FILES[0]), "<f4", (nlist, dim), "float32")
    sq = read_small_npy(folder, IVF_FILES[1], sums.get(IVF_FILES[1]), "<f4", (sq_trained_size(dim),), "float32")
    lists = read_small_npy(folder, IVF_FILES[2], sums.get(IVF_FILES[2]), "<i4", (rows,), "int32")
    for name, array in zip(IVF_FILES[:2], (centroids, sq)):
        if not np.isfinite(array).all():
            raise damaged(folder, name, "a value is not finite (NaN or infinity)")
    bad = np.flatnonzero((lists < 0) | (lists >= nlist))
    if bad.size:
        raise damaged(folder, IVF_FILES[2], f"entry {bad[0]} is {lists[bad[0]]}, not a list number "
                                            f"(0 to {nlist - 1}, manifest.json's nlist)")
    return IVFParts(centroids, sq, lists, ivf["nprobe"], ivf["seed"])


__all__ = ["IVF_FILES", "damaged", "npy_header", "open_member", "open_vectors", "read_checked", "read_ids_npy",
           "read_ivf_parts", "read_small_npy"]
