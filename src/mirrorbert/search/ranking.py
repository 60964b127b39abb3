"""The ranking primitives every search path shares: unit-length rows, float64 scores per (query, key) pair and
the top-k by score then smaller id. A module of their own so that `exact` (which builds approximate indexes for
`SearchIndex`), `approximate` (which rescores with them) and the index folder's reader do not import each other."""

from __future__ import annotations

import numpy as np


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero) as float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, eps)


def _select_topk(scores: np.ndarray, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k per row of ``scores`` (with key ids ``index``), sorted by score desc then id asc."""
    if scores.shape[1] > k:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        kth = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        if (scores >= kth).sum() > scores.shape[0] * k:  # ties at the k-th place: sort whole rows
            order = np.lexsort((index, -scores), axis=1)[:, :k]
            return np.take_along_axis(scores, order, axis=1), np.take_along_axis(index, order, axis=1)
        scores, index = np.take_along_axis(scores, part, axis=1), np.take_along_axis(index, part, axis=1)
    order = np.lexsort((index, -scores), axis=1)
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(index, order, axis=1)


def _pair_scores(queries: np.ndarray, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """float64 inner product of each query row with its keys ``ids[row]``: one fixed summation per pair,
    whatever the number of rows or the BLAS, so every path ranks from the same numbers."""
    return pair_scores(queries, keys[ids])


def pair_scores(queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float64 inner product of query `i` with each of its rows `rows[i]` ([nq, m, dim]): the one formula every
    ranking uses (`_pair_scores` gathers the rows by id; search/streaming.py keeps them)."""
    q = queries.astype(np.float64)[:, None, :]
    return (q * np.ascontiguousarray(rows).astype(np.float64)).sum(axis=-1)
