"""CSLS retrieval for BLI over the exact, chunked, memory-bounded search of :mod:`mirrorbert.search.exact` (ties go
to the smaller key id; ``use_faiss=None``: faiss's exact ``IndexFlatIP`` when installed)."""

from __future__ import annotations

import numpy as np

from mirrorbert.search.exact import DEFAULT_CHUNK_SIZE, chunked_topk, cosine_topk, l2_normalize


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
    """

    def density(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
        scores, _ = cosine_topk(queries, keys, csls_k, chunk_size=chunk_size, use_faiss=use_faiss)
        return scores.mean(axis=1) if scores.shape[1] else np.zeros(scores.shape[0], np.float32)

    src = l2_normalize(sources)
    tgt = l2_normalize(targets)
    r_t = density(src, tgt)
    r_s = density(tgt, src if source_space is None else l2_normalize(source_space))
    # for unit x, y: 2 x.y - r_S(y) = [x, 1] . [2y, -r_S(y)], one inner-product search
    q_aug = np.hstack([src, np.ones((src.shape[0], 1), np.float32)])
    k_aug = np.hstack([2.0 * tgt, -r_s[:, None].astype(np.float32)])
    scores, ids = chunked_topk(q_aug, k_aug, k, chunk_size=chunk_size, use_faiss=use_faiss)
    return scores - r_t[:, None], ids
