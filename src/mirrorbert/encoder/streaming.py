"""`encode` for inputs larger than memory: the input read one chunk of `STREAM_ROWS` strings at a time, each
chunk's vectors written straight into the .npy on disk (`RowWriter`: positioned writes); the vectors equal an
in-memory encode's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from mirrorbert.errors import UserError

STREAM_ROWS = 65536  # strings per chunk: the tokenised chunk and its vectors stay well under a gigabyte


@dataclass
class ChunkedInput:
    """An input's row count and a way to walk its strings chunk by chunk (`rows`: the skipped lines and the
    rows' ids, for --skip-bad-lines' row ids; None for tables, which skip nothing)."""
    count: int
    chunks: Callable[[], Iterator[list[str]]]
    rows: object | None = None


def chunked_input(path: str, column: str | None, field: str | None, skip_bad_lines: bool,
                  option: str = "--input", chunk_rows: int | None = None, *, header: bool = True) -> ChunkedInput:
    """Every input streams: tables a record batch at a time, text/CSV/JSONL files a chunk of lines at a time
    (counted and checked by a first pass, so a bad line fails before the model loads); a .csv/.tsv without a
    `header` row is all data."""
    chunk_rows = chunk_rows or STREAM_ROWS
    from mirrorbert.data.readers import TextRows, check_header_applies, chunked
    from mirrorbert.data.strings import read_rows
    from mirrorbert.data.hf_datasets import count_rows, is_hub_dataset, is_table, iter_table_column

    check_header_applies(path, header, option)

    if not is_hub_dataset(path) and Path(path).exists() and is_table(Path(path)):
        if field:
            raise UserError(f"{path}: --field applies to .jsonl files; tabular data takes --column")
        count = count_rows(path, option)
        first = next(iter_table_column(path, column, option, chunk_rows=1), None)  # column checked before work
        if count == 0 or first is None:
            raise UserError(f"{option} {path}: no rows in the data")
        return ChunkedInput(count, lambda: iter_table_column(path, column, option, chunk_rows))
    if is_hub_dataset(path):  # a Hub dataset is read whole (datasets streams it to its own cache first)
        rows = read_rows(path, column=column, field=field, skip_bad_lines=skip_bad_lines, option=option)
        texts = rows.texts
        if not any(t.strip() for t in texts):
            raise UserError(f"{option} {path}: no text in the data (every row is blank)")
        return ChunkedInput(len(texts), lambda: chunked(texts, chunk_rows), rows)
    source = TextRows(path, column, field, skip_bad_lines, option, header=header)
    if not source.any_text:
        raise UserError(f"{option} {path}: no text in the file (every line is blank)")
    return ChunkedInput(source.count, lambda: source.chunks(chunk_rows), source)


def create_npy(path: Path, rows: int, dim: int, target: Path | None = None, option: str = "--output") -> Path:
    """A float32 .npy of `rows` x `dim` at `path` (a temporary mirrorbert just made: opened without following
    a link), its blocks reserved before any row is written (`safeguards.writes.preallocate`): a full disk is
    one error naming `target` (what `path` becomes) and the bytes needed, not a SIGBUS halfway."""
    from mirrorbert.safeguards.writes import open_temporary, preallocate

    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
              "shape": (rows, dim)}
    with open_temporary(path, "r+b") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        size = fh.tell() + rows * dim * np.dtype(np.float32).itemsize
        fh.truncate(size)
        fh.flush()
        preallocate(fh.fileno(), os.fstat(fh.fileno()).st_size, target or path, option)
    return Path(path)


class RowWriter:
    """Rows written into a .npy made by `create_npy` with positioned writes (not a memory map), so a process's
    memory does not grow with the matrix it writes."""

    def __init__(self, path: Path, rows: int, dim: int):
        self.row_bytes = dim * np.dtype(np.float32).itemsize
        self.fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        self.offset = os.fstat(self.fd).st_size - rows * self.row_bytes  # the header's length
        self.rows, self.dim = rows, dim

    def write(self, start: int, block: np.ndarray) -> None:
        data = np.ascontiguousarray(block, dtype=np.float32)
        if data.shape[1:] != (self.dim,) or start + len(data) > self.rows:
            raise ValueError(f"rows {start}..{start + len(data)} of width {data.shape[1:]} do not fit "
                             f"{self.rows} x {self.dim}")
        view, position = memoryview(data).cast("B"), self.offset + start * self.row_bytes
        while view:
            done = os.pwrite(self.fd, view, position)
            view, position = view[done:], position + done

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def encode_to_npy(encode: Callable[[list[str]], np.ndarray], source: ChunkedInput, dim: int, path: Path, *,
                  show_progress: bool = False, what: str = "--input", target: Path | None = None) -> int:
    """Encode `source` chunk by chunk into a float32 .npy at `path` (see `create_npy`, `RowWriter`); the
    rows written."""
    from mirrorbert.reporting.progress import progress_bar

    written, any_text = 0, False
    with RowWriter(create_npy(path, source.count, dim, target), source.count, dim) as out, \
            progress_bar(total=source.count, show=show_progress, desc="encode", unit="string") as bar:
        for chunk in source.chunks():
            if written + len(chunk) > source.count:
                raise UserError(f"{what}: the input grew while it was read (more than {source.count} rows)")
            any_text = any_text or any(t.strip() for t in chunk)
            out.write(written, encode(chunk))
            written += len(chunk)
            bar.update(len(chunk))
    if written != source.count:
        raise UserError(f"{what}: the input changed while it was read ({written} rows, {source.count} expected)")
    if not any_text:
        raise UserError(f"{what}: no text in the data (every row is blank)")
    return written
