"""The approximate index: faiss IVF with 8-bit codes; a query's candidates from its `nprobe` nearest lists are
rescored in float64 against the float vectors, so only which rows are found is approximate. The index is defined
by three numpy arrays (`IVFParts`), never a faiss file (docs/design.md, "The approximate index").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirrorbert.errors import UserError
from mirrorbert.search.ranking import RESCORE_BLOCK_VALUES, pair_scores, select_topk
from mirrorbert.settings.choices import AUTO_IVF_ROWS, INDEX_TYPES

TRAIN_ROWS_PER_LIST = 40  # k-means sample: 40 rows per centroid (faiss warns below 39)
KMEANS_ITERATIONS = 10
NPROBE_PER_SQRT_NLIST = 4  # default_nprobe: lists scanned per query, per square root of the lists
RESCORE_FACTOR = 4  # candidates per wanted hit rescored against the float vectors
ADD_CHUNK = 65536  # rows assigned and encoded at a time (bounds the float copy of a chunk)
CODES = "sq8"


@dataclass
class IVFParts:
    """What defines an IVF index besides the vectors: centroids [nlist, dim], the 8-bit quantiser's trained
    ranges (faiss's layout: per-dimension minima, then ranges), each row's list number; `seed` drew the sample."""
    centroids: np.ndarray
    sq_trained: np.ndarray
    lists: np.ndarray
    nprobe: int
    seed: int = 0

    @property
    def nlist(self) -> int:
        return int(self.centroids.shape[0])

    def description(self) -> dict[str, Any]:
        """The `ivf` entry of an index folder's manifest."""
        return {"nlist": self.nlist, "nprobe": self.nprobe, "codes": CODES, "metric": "inner_product",
                "seed": self.seed}


def resolve_index_type(index_type: str, rows: int, faiss_installed: bool) -> str:
    """exact | ivf for a corpus of `rows` rows: `auto` is exact below AUTO_IVF_ROWS (and without faiss)."""
    if index_type not in INDEX_TYPES:
        raise UserError(f"--index-type: unknown value {index_type!r}; choose one of {', '.join(INDEX_TYPES)}")
    if index_type == "auto":
        return "ivf" if rows >= AUTO_IVF_ROWS and faiss_installed else "exact"
    if index_type == "ivf" and not faiss_installed:
        raise UserError('--index-type ivf needs faiss: pip install "mirrorbert[faiss]"')
    return index_type


def default_nlist(rows: int) -> int:
    """About 4 * sqrt(rows) lists, but never fewer than TRAIN_ROWS_PER_LIST rows to train each centroid."""
    return max(1, min(int(round(4 * math.sqrt(rows))), rows // TRAIN_ROWS_PER_LIST))


def default_nprobe(nlist: int) -> int:
    """Lists scanned per query: NPROBE_PER_SQRT_NLIST * sqrt(nlist), never more than there are."""
    return min(nlist, max(1, round(NPROBE_PER_SQRT_NLIST * math.sqrt(nlist))))


def check_query_nprobe(nprobe: Any, nlist: int | None, scan: str | None = None, where: str = "the index") -> None:
    """A query-time nprobe (`search --nprobe`, `nprobe=`): a whole number from 1 to the index's `nlist` (None:
    an exact index), given only where lists are scanned (`scan`: what answers instead). Else a UserError."""
    if not isinstance(nprobe, (int, np.integer)) or isinstance(nprobe, bool) or nprobe < 1:
        raise UserError(f"--nprobe {nprobe!r}: must be an integer >= 1")
    if nlist is None:
        raise UserError(f"--nprobe {nprobe}: {where} is exact (no lists to scan); build an approximate one with "
                        "`mirrorbert index --index-type ivf`")
    if scan is not None:
        raise UserError(f"--nprobe {nprobe} with {scan}: no lists are scanned; leave one of them out")
    if nprobe > nlist:
        raise UserError(f"--nprobe {nprobe}: {where} has {nlist} lists; choose 1 to {nlist}")


def train_ivf(vectors: np.ndarray, nlist: int | None = None, nprobe: int | None = None, seed: int = 0) -> IVFParts:
    """Train centroids and the quantiser on a seeded sample, then assign every row (in chunks, read from
    `vectors`, which may be memory-mapped: only the sample and one chunk are copied)."""
    import faiss

    rows, dim = vectors.shape
    nlist = nlist or default_nlist(rows)
    sample_rows = min(rows, TRAIN_ROWS_PER_LIST * nlist)
    picked = np.sort(np.random.default_rng(seed).choice(rows, size=sample_rows, replace=False))
    index = _empty_ivf(faiss, faiss.IndexFlatIP(dim), dim, nlist)
    index.cp.niter, index.cp.seed, index.cp.verbose = KMEANS_ITERATIONS, seed, False
    index.cp.min_points_per_centroid = 1  # the sample is ours (faiss would warn below 39 rows a list)
    index.cp.max_points_per_centroid = TRAIN_ROWS_PER_LIST  # ... and not subsampled again
    index.train(np.ascontiguousarray(vectors[picked], dtype=np.float32))
    centroids = index.quantizer.reconstruct_n(0, nlist)
    lists = np.empty(rows, np.int32)
    for r0 in range(0, rows, ADD_CHUNK):
        lists[r0:r0 + ADD_CHUNK] = index.quantizer.search(_chunk(vectors, r0), 1)[1][:, 0]
    return IVFParts(centroids, faiss.vector_to_array(index.sq.trained).astype(np.float32), lists,
                    min(nlist, nprobe or default_nprobe(nlist)), seed)


def _chunk(vectors: np.ndarray, r0: int) -> np.ndarray:
    return np.ascontiguousarray(vectors[r0:r0 + ADD_CHUNK], dtype=np.float32)


def _empty_ivf(faiss, quantizer, dim: int, nlist: int):
    index = faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                          faiss.METRIC_INNER_PRODUCT)
    return index  # faiss's wrapper keeps a reference to `quantizer` for as long as the index lives


def ivf_from_parts(vectors: np.ndarray, parts: IVFParts):
    """The faiss index of `parts` over `vectors`, rows added in chunks with their stored list numbers."""
    import faiss

    rows, dim = vectors.shape
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(np.ascontiguousarray(parts.centroids, dtype=np.float32))
    index = _empty_ivf(faiss, quantizer, dim, parts.nlist)
    faiss.copy_array_to_vector(np.ascontiguousarray(parts.sq_trained, dtype=np.float32), index.sq.trained)
    index.is_trained = True
    for r0 in range(0, rows, ADD_CHUNK):
        x = _chunk(vectors, r0)
        assign = np.ascontiguousarray(parts.lists[r0:r0 + len(x)], dtype=np.int64)
        index.add_core(len(x), faiss.swig_ptr(x), None, faiss.swig_ptr(assign))
    index.nprobe = parts.nprobe
    return index


@dataclass
class IVFIndex:
    """A built IVF index with the parts it came from; `topk` proposes candidates and rescores them exactly."""
    faiss_index: Any
    parts: IVFParts

    @classmethod
    def build(cls, vectors: np.ndarray, nlist: int | None = None, nprobe: int | None = None,
              seed: int = 0) -> "IVFIndex":
        parts = train_ivf(vectors, nlist, nprobe, seed)
        return cls(ivf_from_parts(vectors, parts), parts)

    def topk(self, queries: np.ndarray, vectors: np.ndarray, k: int,
             nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) [nq, k]: candidates from the lists nearest each query, exact float64 cosines of
        them against `vectors`, ordered by score then id; a row may end in -1 ids when the scanned lists
        held fewer than k rows."""
        k = min(int(k), vectors.shape[0])
        n_cand = min(vectors.shape[0], max(RESCORE_FACTOR * k, k + 8))
        self.faiss_index.nprobe = min(self.parts.nlist, nprobe or self.parts.nprobe)
        _, cand = self.faiss_index.search(np.ascontiguousarray(queries, dtype=np.float32), n_cand)
        return rescore(queries, vectors, cand.astype(np.int64), k)


def rescore(queries: np.ndarray, vectors: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top `k` of each row's candidate ids (-1: none) by exact search's float64 score (`pair_scores`), ties
    towards the smaller id; only the candidates' rows of `vectors` are read."""
    nq, n_cand = cand.shape
    out_s = np.full((nq, k), -np.inf, np.float32)
    out_i = np.full((nq, k), -1, np.int64)
    step = max(1, RESCORE_BLOCK_VALUES // max(1, n_cand * vectors.shape[1]))
    for q0 in range(0, nq, step):
        ids = cand[q0:q0 + step]
        valid = ids >= 0
        safe = np.where(valid, ids, 0)
        scores = np.where(valid, pair_scores(queries[q0:q0 + step], vectors[safe]), -np.inf)
        s, i = select_topk(scores, np.where(valid, ids, np.iinfo(np.int64).max), k)
        out_s[q0:q0 + step], out_i[q0:q0 + step] = s, np.where(np.isfinite(s), i, -1)
    return out_s, out_i


__all__ = ["AUTO_IVF_ROWS", "INDEX_TYPES", "IVFIndex", "IVFParts", "check_query_nprobe", "default_nlist", "default_nprobe",
           "ivf_from_parts", "rescore", "resolve_index_type", "train_ivf"]
