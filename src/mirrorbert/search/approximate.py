"""An approximate index for corpora too large to scan: faiss IVF with 8-bit codes, exact rescoring from the
float vectors.

Exact search reads every vector for every query block; at a million rows that is most of a query's time, and a
10M x 768 corpus (30 GB of float32) does not fit in memory at all. The approximate index keeps only what finding
*candidates* needs in memory: `nlist` centroids (k-means on a seeded sample) and an 8-bit scalar-quantised code
of every row's residual (faiss `IndexIVFScalarQuantizer`, inner product on L2-normalised vectors: a quarter of
the float32 size). A query scans the `nprobe` lists nearest to it; the `RESCORE_FACTOR * k` best candidates are
then rescored against the float vectors (memory-mapped, read only for those rows) in float64, so every
returned score is the exact cosine of the returned id, ordered as exact search orders (score, then smaller id).
Only *which* rows are found is approximate (recall@10 is measured on real sentence vectors by
benchmarks/ivf_recall.py, on synthetic clusters up to 1M rows by benchmarks/index_scale.py). `nprobe` is the
index's default (recorded in its manifest); a search may set another (`search --nprobe`, `nprobe=`).

The index is defined by three small arrays, not by a faiss file: the centroids, the quantiser's trained ranges
and each row's list number. They are numpy files an untrusted folder can hold without any faiss
deserialisation (a crafted faiss file can name other files to map); the faiss index is rebuilt from them and
the vectors at load, by the same function that builds it, so a loaded index is the one that was written.

`auto` picks exact search below `AUTO_IVF_ROWS` rows (a scan is fast there, and exact) and IVF from there on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirrorbert.errors import UserError
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
    ranges (float32, faiss's layout: per-dimension minima then ranges) and each row's list number; `seed`
    drew the k-means sample (recorded in an index folder's manifest)."""
    centroids: np.ndarray
    sq_trained: np.ndarray
    lists: np.ndarray
    nprobe: int
    seed: int = 0

    @property
    def nlist(self) -> int:
        return int(self.centroids.shape[0])


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
    """Lists scanned per query: NPROBE_PER_SQRT_NLIST * sqrt(nlist), never more than there are (all of them up
    to 16 lists). Real sentence vectors are not the tight clusters k-means likes: a query's true neighbours lie
    in many lists, and the share of lists it must scan for a given recall falls only as about 1/sqrt(nlist).
    So nprobe grows with sqrt(nlist): with the corpus's size to the power 1/4 from 25,600 rows, where
    default_nlist reaches 4 * sqrt(rows);
    on all-MiniLM-L6-v2 vectors of Wikipedia, STS and WordNet texts this keeps recall@10 at 0.976-0.984 from 2k
    to 192k rows (benchmarks/ivf_recall.py, docs/guide/search.md), where 32 lists found 0.92-0.94 from 27k on."""
    return min(nlist, max(1, round(NPROBE_PER_SQRT_NLIST * math.sqrt(nlist))))


def check_query_nprobe(nprobe: Any, nlist: int | None, scan: str | None = None, where: str = "the index") -> None:
    """A query-time nprobe (`search --nprobe`, `nprobe=`) against what it is for: a whole number from 1 to the
    index's `nlist` (None: an exact index, which has no lists), and only where the lists are scanned (`scan`
    names what answers instead, e.g. an exact scan). Each case is a UserError naming the option."""
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


def sq_trained_size(dim: int) -> int:
    """Floats in an 8-bit (non-uniform) quantiser's trained ranges: a minimum and a range per dimension."""
    return 2 * dim


def ivf_from_parts(vectors: np.ndarray, parts: IVFParts, check_finite: bool = False):
    """The faiss index of `parts` over `vectors`, rows added in chunks with their stored list numbers (no
    search, so loading is one encoding pass); with `check_finite` each chunk is checked on the way (the row
    number of the first non-finite one is raised as ValueError)."""
    import faiss

    rows, dim = vectors.shape
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(np.ascontiguousarray(parts.centroids, dtype=np.float32))
    index = _empty_ivf(faiss, quantizer, dim, parts.nlist)
    faiss.copy_array_to_vector(np.ascontiguousarray(parts.sq_trained, dtype=np.float32), index.sq.trained)
    index.is_trained = True
    for r0 in range(0, rows, ADD_CHUNK):
        x = _chunk(vectors, r0)
        if check_finite and not np.isfinite(x).all():
            raise ValueError(r0 + int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0]))
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


def rescore(queries: np.ndarray, vectors: np.ndarray, cand: np.ndarray, k: int,
            block_values: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """The top `k` of each row's candidate ids (-1: none) by float64 inner product with the float vectors,
    ties towards the smaller id; only the candidates' rows of `vectors` are read. The float64 sum is exact
    search's own (`_pair_scores`), so a hit's score is the one exact search gives that id."""
    from mirrorbert.search.ranking import _pair_scores, _select_topk

    nq, n_cand = cand.shape
    out_s = np.full((nq, k), -np.inf, np.float32)
    out_i = np.full((nq, k), -1, np.int64)
    step = max(1, block_values // max(1, n_cand * vectors.shape[1]))
    for q0 in range(0, nq, step):
        ids = cand[q0:q0 + step]
        valid = ids >= 0
        safe = np.where(valid, ids, 0)
        scores = np.where(valid, _pair_scores(queries[q0:q0 + step], vectors, safe), -np.inf)
        s, i = _select_topk(scores, np.where(valid, ids, np.iinfo(np.int64).max), k)
        out_s[q0:q0 + step], out_i[q0:q0 + step] = s, np.where(np.isfinite(s), i, -1)
    return out_s, out_i


__all__ = ["AUTO_IVF_ROWS", "INDEX_TYPES", "IVFIndex", "IVFParts", "check_query_nprobe", "default_nlist", "default_nprobe",
           "ivf_from_parts", "rescore", "resolve_index_type", "train_ivf"]
