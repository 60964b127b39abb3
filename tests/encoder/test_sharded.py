"""Sharded encode (encoder/sharded.py): each process's contiguous rows, written into its slice of one .npy."""

from __future__ import annotations

import numpy as np
import pytest

from mirrorbert.encoder.sharded import encode_sharded, row_range, rows_between, write_rows
from mirrorbert.encoder.streaming import ChunkedInput, create_npy
from mirrorbert.errors import UserError
from mirrorbert.runtime.distributed import DistContext

TEXTS = [f"string number {i}" + "!" * (i % 5) for i in range(23)]


def _fake_encode(chunk: list[str]) -> np.ndarray:
    """A row per string that names it: its number and its length (any mix-up of rows shows)."""
    return np.array([[float(text.split()[2].rstrip("!")), float(len(text))] for text in chunk], dtype=np.float32)


def _source(chunk_rows: int) -> ChunkedInput:
    return ChunkedInput(len(TEXTS), lambda: (TEXTS[i:i + chunk_rows] for i in range(0, len(TEXTS), chunk_rows)))


@pytest.mark.parametrize("world", [1, 2, 3, 5, 30])
def test_row_ranges_cover_every_row_once_in_order(world):
    ranges = [row_range(DistContext(rank=r, world_size=world), len(TEXTS)) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(TEXTS)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


@pytest.mark.parametrize("chunk_rows, out_rows", [(1, 4), (4, 3), (7, 100), (23, 5)])
def test_rows_between_is_the_slice_whatever_the_chunking(chunk_rows, out_rows):
    for start, stop in ((0, 23), (5, 12), (22, 23), (7, 7)):
        got = [text for chunk in rows_between(_source(chunk_rows).chunks(), start, stop, out_rows) for text in chunk]
        assert got == TEXTS[start:stop]
        assert all(len(chunk) <= out_rows for chunk in rows_between(_source(chunk_rows).chunks(), start, stop, out_rows))


def test_every_rank_writing_its_slice_gives_the_whole_matrix(tmp_path):
    path = create_npy(tmp_path / "v.npy", len(TEXTS), 2)
    for rank in range(3):  # the three processes of a job, one after the other
        start, stop = row_range(DistContext(rank=rank, world_size=3), len(TEXTS))
        assert write_rows(_fake_encode, _source(4), path, start, stop, chunk_rows=3) == stop - start
    assert np.array_equal(np.load(path), _fake_encode(TEXTS))


def test_one_process_job_writes_everything(tmp_path):
    target = tmp_path / "out.npy"
    written = encode_sharded(DistContext(), _fake_encode, _source(5), 2, tmp_path / "tmp.npy", target, chunk_rows=4)
    assert written == len(TEXTS) and np.array_equal(np.load(tmp_path / "tmp.npy"), _fake_encode(TEXTS))


def test_an_input_that_shrank_is_an_error(tmp_path):
    path = create_npy(tmp_path / "v.npy", len(TEXTS), 2)
    short = ChunkedInput(len(TEXTS), lambda: iter([TEXTS[:10]]))
    with pytest.raises(UserError, match="changed while it was read"):
        write_rows(_fake_encode, short, path, 5, 20, chunk_rows=4)
