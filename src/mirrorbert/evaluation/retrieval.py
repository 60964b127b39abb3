"""Exact nearest-neighbour search in memory-bounded chunks (cosine / inner product, CSLS).

Entity-linking dictionaries reach a million names, so the query x key score matrix is never
materialised: queries are processed in blocks and keys in chunks, keeping a running top-k per
query. Peak extra memory is one ``query_block x chunk_size`` float32 block plus the running
top-k. faiss (``IndexFlatIP``, exact) is used instead when requested or, with ``use_faiss=None``,
when it is importable.

Ties are broken towards the smaller key index, so results are deterministic and independent of
the chunk size.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 16384
DEFAULT_QUERY_BLOCK = 1024


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero) as float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, eps)


def _faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _select_topk(scores: np.ndarray, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k per row of ``scores`` (with key ids ``index``), sorted by score desc then id asc."""
    n = scores.shape[1]
    if n > k:
        # Keep every candidate tied with the k-th score so the id tie-break below stays exact.
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        kth = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        keep = scores >= kth
        if keep.sum() > keep.shape[0] * k:  # ties at the boundary: fall back to a full sort
            order = np.lexsort((index, -scores), axis=1)[:, :k]
        else:
            scores_p = np.take_along_axis(scores, part, axis=1)
            index_p = np.take_along_axis(index, part, axis=1)
            order_p = np.lexsort((index_p, -scores_p), axis=1)
            return np.take_along_axis(scores_p, order_p, axis=1), np.take_along_axis(index_p, order_p, axis=1)
    else:
        order = np.lexsort((index, -scores), axis=1)
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(index, order, axis=1)


def chunked_topk(
    queries: np.ndarray,
    keys: np.ndarray,
    k: int,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    query_block: int = DEFAULT_QUERY_BLOCK,
    use_faiss: bool | None = False,
    show_progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` keys by inner product for every query: ``(scores [nq, k], indices [nq, k])``.

    ``k`` is capped at the number of keys. Exact search; see the module docstring for memory and
    tie-breaking. ``use_faiss``: True forces faiss, None uses it when importable, False never.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    if queries.ndim != 2 or keys.ndim != 2 or queries.shape[1] != keys.shape[1]:
        raise ValueError(f"shape mismatch: queries {queries.shape}, keys {keys.shape}")
    if chunk_size < 1 or query_block < 1:
        raise ValueError("chunk_size and query_block must be positive")
    nq, nk = queries.shape[0], keys.shape[0]
    k = min(int(k), nk)
    if k < 1 or nq == 0:
        return np.zeros((nq, max(k, 0)), np.float32), np.zeros((nq, max(k, 0)), np.int64)

    if use_faiss or (use_faiss is None and _faiss_available()):
        return _faiss_topk(queries, keys, k, chunk_size)

    out_s = np.empty((nq, k), np.float32)
    out_i = np.empty((nq, k), np.int64)
    starts = range(0, nq, query_block)
    if show_progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="nearest neighbours", unit="block")
    for q0 in starts:
        q = queries[q0 : q0 + query_block]
        best_s = np.full((q.shape[0], 0), -np.inf, np.float32)
        best_i = np.zeros((q.shape[0], 0), np.int64)
        for k0 in range(0, nk, chunk_size):
            cand_s, cand_i = _block_topk(q @ keys[k0 : k0 + chunk_size].T, k, k0)
            best_s, best_i = _select_topk(
                np.concatenate([best_s, cand_s], axis=1), np.concatenate([best_i, cand_i], axis=1), k
            )
        out_s[q0 : q0 + q.shape[0]] = best_s
        out_i[q0 : q0 + q.shape[0]] = best_i
    return out_s, out_i


def _block_topk(block: np.ndarray, k: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of one score block with global ids ``offset + column``, in the exact tie order.

    ``torch.topk`` is several times faster than ``np.argpartition`` but leaves the order of equal
    scores unspecified; the candidate *set* is still exact unless the k-th and (k+1)-th scores tie,
    so such rows (rare with real embeddings) are redone with the exact numpy selection.
    """
    import torch

    n = block.shape[1]
    ids = np.arange(offset, offset + n, dtype=np.int64)
    if n <= k:
        return _select_topk(block, np.broadcast_to(ids, block.shape), k)
    vals, cols = torch.topk(torch.from_numpy(block), k + 1, dim=1, sorted=True)
    vals_np, cols_np = vals.numpy(), cols.numpy()
    s, c = vals_np[:, :k], cols_np[:, :k]
    order = np.lexsort((c, -s), axis=1)
    s, c = np.take_along_axis(s, order, axis=1), np.take_along_axis(c, order, axis=1) + offset
    tied = np.flatnonzero(vals_np[:, k - 1] == vals_np[:, k])
    if tied.size:
        rows = block[tied]
        s[tied], c[tied] = _select_topk(rows, np.broadcast_to(ids, rows.shape), k)
    return s, c


def _faiss_topk(queries: np.ndarray, keys: np.ndarray, k: int, chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product search with faiss, keys added in chunks (results merged by faiss)."""
    import faiss

    index = faiss.IndexFlatIP(keys.shape[1])
    for k0 in range(0, keys.shape[0], chunk_size):
        index.add(keys[k0 : k0 + chunk_size])
    scores, ids = index.search(queries, k)
    return scores.astype(np.float32), ids.astype(np.int64)


def cosine_topk(
    queries: np.ndarray,
    keys: np.ndarray,
    k: int,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    query_block: int = DEFAULT_QUERY_BLOCK,
    use_faiss: bool | None = False,
    show_progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` keys by cosine similarity (inputs need not be normalised)."""
    return chunked_topk(
        l2_normalize(queries),
        l2_normalize(keys),
        k,
        chunk_size=chunk_size,
        query_block=query_block,
        use_faiss=use_faiss,
        show_progress=show_progress,
    )


def mean_topk_similarity(
    queries: np.ndarray,
    keys: np.ndarray,
    k: int,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = False,
) -> np.ndarray:
    """Mean cosine of each query to its ``k`` nearest keys (the CSLS neighbourhood density r)."""
    scores, _ = cosine_topk(queries, keys, k, chunk_size=chunk_size, use_faiss=use_faiss)
    return scores.mean(axis=1) if scores.shape[1] else np.zeros(scores.shape[0], np.float32)


def csls_topk(
    sources: np.ndarray,
    targets: np.ndarray,
    k: int = 1,
    *,
    csls_k: int = 10,
    source_space: np.ndarray | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` targets by CSLS (Conneau et al. 2018) for each (already mapped) source vector.

    ``CSLS(x, y) = 2 cos(x, y) - r_T(x) - r_S(y)`` where ``r_T(x)`` is the mean cosine of ``x`` to
    its ``csls_k`` nearest targets and ``r_S(y)`` the mean cosine of ``y`` to its ``csls_k`` nearest
    vectors of ``source_space`` (the mapped source vocabulary; defaults to ``sources``).

    The ranking uses the identity ``2 x.y - r_S(y) = [x, 1] . [2y, -r_S(y)]`` for unit x, y, so the
    same chunked inner-product search serves plain cosine and CSLS.
    """
    src = l2_normalize(sources)
    tgt = l2_normalize(targets)
    space = src if source_space is None else l2_normalize(source_space)
    r_t = mean_topk_similarity(src, tgt, csls_k, chunk_size=chunk_size, use_faiss=use_faiss)
    r_s = mean_topk_similarity(tgt, space, csls_k, chunk_size=chunk_size, use_faiss=use_faiss)
    q_aug = np.hstack([src, np.ones((src.shape[0], 1), np.float32)])
    k_aug = np.hstack([2.0 * tgt, -r_s[:, None].astype(np.float32)])
    scores, ids = chunked_topk(q_aug, k_aug, k, chunk_size=chunk_size, use_faiss=use_faiss)
    return scores - r_t[:, None], ids
