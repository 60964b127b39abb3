"""Quantised embeddings: int8/uint8 (4x smaller) and binary (32x smaller) vectors for `encode`, and search over
int8 or binary corpus vectors with float32 rescoring of the candidates. The quantisers and the binary faiss
search are sentence-transformers' (`quantize_embeddings`, `semantic_search_faiss`); int8 ranges come from the
corpus, not the queries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mirrorbert.settings.choices import ENCODE_QUANTIZATIONS, SEARCH_QUANTIZATIONS
from mirrorbert.errors import UserError

RESCORE_MULTIPLIER = 4  # candidates per wanted hit rescored


def st_quantization():
    try:
        from sentence_transformers.util import quantization
    except ImportError:
        raise UserError('quantised embeddings need sentence-transformers: pip install "mirrorbert[st]"') from None
    return quantization


def check_quantization(precision: Any, option: str, choices=ENCODE_QUANTIZATIONS) -> None:
    if precision not in choices:
        raise UserError(f"{option}: unknown value {precision!r}; choose one of {', '.join(choices)}")


def quantize(vectors: np.ndarray, precision: str) -> np.ndarray:
    """`vectors` in `precision`: int8/uint8 with per-dimension ranges from the vectors themselves, binary/ubinary
    packed 8 dimensions per byte (sign bits)."""
    check_quantization(precision, "--quantize")
    vectors = np.asarray(vectors, dtype=np.float32)
    if precision == "float32":
        return vectors
    return st_quantization().quantize_embeddings(vectors, precision=precision, calibration_embeddings=vectors)


def quantized_topk(queries: np.ndarray, corpus: np.ndarray, precision: str, top_k: int,
                   cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of the `top_k` nearest corpus rows: `RESCORE_MULTIPLIER * top_k` candidates from the
    quantised corpus (exact search over the codes), re-ranked by the float32 query against the dequantised
    candidates. `cache` (the caller's, per corpus) keeps the codes and the faiss binary index between calls."""
    check_quantization(precision, "--quantize", SEARCH_QUANTIZATIONS)
    queries = np.asarray(queries, dtype=np.float32)
    if precision == "int8":
        return _int8_topk(queries, corpus, top_k, cache)
    quantization = st_quantization()
    index = cache.get(("index", precision))
    codes = None if index is not None else quantization.quantize_embeddings(corpus, precision=precision)
    results, _, index = quantization.semantic_search_faiss(
        queries, corpus_embeddings=codes, corpus_index=index, corpus_precision=precision, top_k=top_k,
        rescore=True, rescore_multiplier=RESCORE_MULTIPLIER, exact=True, output_index=True)
    cache[("index", precision)] = index
    return hits_as_arrays(results, len(queries), min(top_k, len(corpus)))


def _int8_topk(queries: np.ndarray, corpus: np.ndarray, top_k: int, cache: dict,
               query_block: int = 256, corpus_block: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    quantization = st_quantization()
    if ("index", "int8") not in cache:
        ranges = np.vstack([corpus.min(axis=0), corpus.max(axis=0)])
        cache[("index", "int8")] = (quantization.quantize_embeddings(corpus, "int8", ranges=ranges), ranges)
    codes, ranges = cache[("index", "int8")]
    steps = (ranges[1] - ranges[0]) / 255
    n, dim = codes.shape
    k, m = min(top_k, n), min(n, top_k * RESCORE_MULTIPLIER)
    # integer dot products through float32 BLAS while exact (docs/design.md); wider vectors take the int64 path
    kind = np.float32 if dim * 128 * 128 < 2 ** 24 else np.int64
    scores, ids = np.empty((len(queries), k)), np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), query_block):
        block = queries[start:start + query_block]
        block_codes = quantization.quantize_embeddings(block, "int8", ranges=ranges)
        coarse = np.empty((len(block), n), dtype=kind)
        for lo in range(0, n, corpus_block):
            part = codes[lo:lo + corpus_block]
            coarse[:, lo:lo + len(part)] = block_codes.astype(kind) @ part.astype(kind).T
        candidates = np.argpartition(-coarse, m - 1, axis=1)[:, :m] if m < n else np.tile(np.arange(n), (len(block), 1))
        dequantised = (codes[candidates].astype(np.float32) + 128) * steps + ranges[0]  # [b, m, d]
        fine = np.einsum("bd,bmd->bm", block, dequantised)
        order = np.lexsort((candidates, -fine), axis=1)[:, :k]  # best first; ties: the smaller id
        scores[start:start + len(block)] = np.take_along_axis(fine, order, 1)
        ids[start:start + len(block)] = np.take_along_axis(candidates, order, 1)
    return scores, ids


def hits_as_arrays(results: list[list[dict]], n_queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = np.full((n_queries, k), -np.inf, dtype=np.float64)
    ids = np.full((n_queries, k), -1, dtype=np.int64)
    for row, hits in enumerate(results):
        for col, hit in enumerate(hits[:k]):
            scores[row, col], ids[row, col] = hit["score"], hit["corpus_id"]
    return scores, ids


__all__ = ["hits_as_arrays", "quantize", "quantized_topk", "st_quantization"]
