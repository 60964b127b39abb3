"""Retrieval for the evaluation tasks: cosine top-k (BEL) and CSLS (BLI).

The exact, chunked, memory-bounded search itself lives in :mod:`mirrorbert.search.exact` (shared with
the `search` command); its names are re-exported here for the evaluation modules. Ties go to the smaller
key id on every path; with ``use_faiss=None`` faiss (exact ``IndexFlatIP``) is used when installed.
"""

from __future__ import annotations

import logging

import numpy as np

from mirrorbert.search.exact import (  # noqa: F401  (re-exported: bel.py, bli.py and tests import them here)
    DEFAULT_CHUNK_SIZE,
    DEFAULT_QUERY_BLOCK,
    chunked_topk,
    cosine_topk,
    l2_normalize,
)

logger = logging.getLogger(__name__)


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
