"""What every search path shares: unit-length rows, float64 scores per (query, key) pair, the top-k by score
then smaller id, and faiss where it is wanted and installed (imported only when used)."""

from __future__ import annotations

import numpy as np

from mirrorbert.errors import UserError

ADD_ROWS = 16384  # rows added to a faiss index at a time (bounds the float32 copy of a memory-mapped chunk)
RESCORE_BLOCK_VALUES = 1 << 22  # float64 values per rescoring block (32 MiB)


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero) as float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, eps)


def select_topk(scores: np.ndarray, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k per row of ``scores`` (with key ids ``index``), sorted by score desc then id asc."""
    if scores.shape[1] > k:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        kth = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        if (scores >= kth).sum() == scores.shape[0] * k:  # no ties at the k-th place: sort the k best only
            scores, index = np.take_along_axis(scores, part, axis=1), np.take_along_axis(index, part, axis=1)
    order = np.lexsort((index, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(index, order, axis=1)


def pair_scores(queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float64 inner product of query `i` with each of its rows `rows[i]` ([nq, m, dim]): one fixed summation
    per pair, whatever the number of rows or the BLAS, so every path ranks from the same numbers."""
    q = queries.astype(np.float64)[:, None, :]
    return (q * np.ascontiguousarray(rows).astype(np.float64)).sum(axis=-1)


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def wants_faiss(use_faiss: bool | None) -> bool:
    """True: faiss (an error if missing); None: faiss when importable; False: never."""
    if use_faiss and not faiss_available():
        raise UserError("faiss was requested but is not installed: pip install \"mirrorbert[faiss]\"")
    return bool(use_faiss) or (use_faiss is None and faiss_available())


def build_faiss_index(keys: np.ndarray, chunk_size: int = ADD_ROWS):
    """An exact inner-product faiss index (`IndexFlatIP`) over ``keys``, added in chunks."""
    import faiss

    index = faiss.IndexFlatIP(keys.shape[1])
    for k0 in range(0, keys.shape[0], chunk_size):
        index.add(np.ascontiguousarray(keys[k0 : k0 + chunk_size], dtype=np.float32))
    return index


__all__ = ["build_faiss_index", "faiss_available", "l2_normalize", "pair_scores", "select_topk", "wants_faiss"]
