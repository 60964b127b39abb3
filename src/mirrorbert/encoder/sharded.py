"""`encode` under torchrun: every process writes its own rows into the one output .npy, nothing is gathered.

Rank 0 creates the output's temporary .npy at full size; each process writes a contiguous range of rows into
its slice, chunk by chunk; rank 0 renames the file into place only once every process has succeeded (one that
fails tells the others at the closing agreement, and nothing is renamed). The output must be on a filesystem
every process sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch.distributed as dist

from mirrorbert.encoder.streaming import ChunkedInput, RowWriter, create_npy
from mirrorbert.errors import UserError
from mirrorbert.runtime.distributed import DistContext
from mirrorbert.search.index_files import own_npy


def row_range(ctx: DistContext, n: int) -> tuple[int, int]:
    """This process's contiguous rows [start, stop) of n (the first n % W processes take one more)."""
    sizes = ctx.shard_sizes(n)
    start = sum(sizes[: ctx.rank])
    return start, start + sizes[ctx.rank]


def rows_between(chunks: Iterator[list[str]], start: int, stop: int, chunk_rows: int) -> Iterator[list[str]]:
    """The strings of rows [start, stop) of a chunked input, re-cut into chunks of at most `chunk_rows`."""
    offset, pending = 0, []
    for chunk in chunks:
        lo, hi = max(start - offset, 0), min(stop - offset, len(chunk))
        offset += len(chunk)
        if lo < hi:
            pending.extend(chunk[lo:hi])
        while len(pending) >= chunk_rows:
            yield pending[:chunk_rows]
            pending = pending[chunk_rows:]
        if offset >= stop:
            break
    if pending:
        yield pending


def write_rows(encode: Callable[[list[str]], np.ndarray], source: ChunkedInput, path: Path, start: int, stop: int,
               chunk_rows: int, on_rows: Callable[[int], None] | None = None) -> int:
    """Encode rows [start, stop) of `source` into the .npy at `path` (already of the full size); rows written."""
    shape = own_npy(Path(path)).shape  # the header rank 0 wrote: (rows, dim)
    written = start
    with RowWriter(path, *shape) as out:
        for chunk in rows_between(source.chunks(), start, stop, chunk_rows):
            out.write(written, encode(chunk))
            written += len(chunk)
            if on_rows is not None:
                on_rows(len(chunk))
    if written != stop:
        raise UserError(f"the input changed while it was read ({written - start} of rows {start}..{stop - 1} read)")
    return stop - start


def encode_sharded(ctx: DistContext, encode: Callable[[list[str]], np.ndarray], source: ChunkedInput, dim: int,
                   tmp: Path | None, target: Path, *, chunk_rows: int,
                   on_rows: Callable[[int], None] | None = None) -> int:
    """Every process's rows into rank 0's temporary .npy `tmp` (None on the other ranks); the rows written
    by this process. Raises on every process when any process failed."""
    path = ctx.on_main(lambda: str(create_npy(tmp, source.count, dim, target)), None)
    shared = [path]
    if ctx.enabled:
        dist.broadcast_object_list(shared, src=0)
    start, stop = row_range(ctx, source.count)
    try:
        written = write_rows(encode, source, Path(shared[0]), start, stop, chunk_rows, on_rows)
    except BaseException:
        try:
            ctx.agree(1)  # the others stop at the agreement below instead of waiting for a timeout
        except Exception:  # noqa: BLE001  the collective itself failed: the original error is the news
            pass
        raise
    if ctx.agree(0):
        raise UserError(f"rank {ctx.rank}: another process failed while encoding its rows; nothing was written")
    return written
