"""Exact nearest-neighbour search: the one implementation behind `search`, `search --corpus` and the evaluation's
retrieval; `SearchIndex`, a corpus encoded once; `build_index` and `search`, which take any encoder (an object
with `encode`, such as `mirrorbert.Encoder`).

Entity-linking dictionaries and search corpora reach a million entries, so the query x key score matrix
is never materialised: queries are processed in blocks and keys in chunks, keeping a running top-k per
query. Peak extra memory is one ``query_block x chunk_size`` float32 block plus the running top-k.

faiss (``IndexFlatIP``: exact inner product) replaces the numpy/torch path when requested
(``use_faiss=True``) or, with ``use_faiss=None``, whenever it is importable. Both paths return the same
neighbours and scores: both only propose candidates in float32; the final order comes from one float64
score per (query, key) pair, ties broken towards the smaller key id, so results do not depend on the
chunk size, the batch of queries, the BLAS kernel or the CPU.

numpy only at import; torch and faiss are imported when used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from mirrorbert.errors import UserError
from mirrorbert.search.faiss_backend import build_faiss_index, faiss_available, wants_faiss
from mirrorbert.search.ranking import _pair_scores, _select_topk, l2_normalize

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 16384
DEFAULT_QUERY_BLOCK = 1024


# ------------------------------------------------------------------------------------------ exact top-k
# How the ranking is made the same on every path and every CPU: float32 matrix products (numpy/torch
# BLAS or faiss) only *propose* candidates; their rounding depends on the kernel, the CPU and the shape of
# the batch, so mathematically tied keys can come out 1 ulp apart in either order. The final order comes
# from one float64 score per (query, key) pair computed the same way on every path, ties by corpus order.
# Candidates: the k + CANDIDATE_EXTRA best float32 scores; a row whose last candidate is within
# RESCORE_MARGIN of its k-th (so a key outside the set might belong in the top k) takes every key within
# the margin instead. float32 error of a unit-vector dot product is ~1e-6, far below the margin.
CANDIDATE_EXTRA = 8
RESCORE_MARGIN = 1e-4
_RESCORE_BLOCK_VALUES = 1 << 22  # float64 values per rescoring block (32 MiB)


def chunked_topk(
    queries: np.ndarray,
    keys: np.ndarray,
    k: int,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    query_block: int = DEFAULT_QUERY_BLOCK,
    use_faiss: bool | None = False,
    show_progress: bool = False,
    faiss_index: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` keys by inner product for every query: ``(scores [nq, k], indices [nq, k])``.

    ``k`` is capped at the number of keys. Exact search, the same ids and scores with or without faiss
    on any CPU (see the comment above); ties go to the smaller key id. ``use_faiss``: True forces faiss,
    None uses it when importable, False never. ``faiss_index``: an already built ``IndexFlatIP``
    holding ``keys`` (saves rebuilding it).
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
    n_cand = min(nk, k + CANDIDATE_EXTRA)
    if faiss_index is not None or wants_faiss(use_faiss):
        index = faiss_index if faiss_index is not None else build_faiss_index(keys, chunk_size)
        cand_s, cand_i = index.search(queries, n_cand)
        cand_s, cand_i = cand_s.astype(np.float32), cand_i.astype(np.int64)
    else:
        cand_s, cand_i = _float32_candidates(queries, keys, n_cand, chunk_size, query_block, show_progress)
    return _exact_ranking(queries, keys, cand_s, cand_i, k, chunk_size)


def _float32_candidates(queries: np.ndarray, keys: np.ndarray, n_cand: int, chunk_size: int, query_block: int,
                        show_progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """The ``n_cand`` best keys per query by float32 inner product, score-sorted; memory-bounded."""
    import torch

    nq, nk = queries.shape[0], keys.shape[0]
    out_s = np.empty((nq, n_cand), np.float32)
    out_i = np.empty((nq, n_cand), np.int64)
    starts = range(0, nq, query_block)
    if show_progress:
        from mirrorbert.reporting.progress import progress_bar

        starts = progress_bar(starts, desc="nearest neighbours", unit="block")
    for q0 in starts:
        q = queries[q0 : q0 + query_block]
        best_s = np.full((q.shape[0], 0), -np.inf, np.float32)
        best_i = np.zeros((q.shape[0], 0), np.int64)
        for k0 in range(0, nk, chunk_size):
            block = q @ keys[k0 : k0 + chunk_size].T
            take = min(n_cand, block.shape[1])
            vals, cols = torch.topk(torch.from_numpy(block), take, dim=1)  # order of ties irrelevant here
            best_s, best_i = _select_topk(np.concatenate([best_s, vals.numpy()], axis=1),
                                          np.concatenate([best_i, cols.numpy().astype(np.int64) + k0], axis=1), n_cand)
        out_s[q0 : q0 + q.shape[0]] = best_s
        out_i[q0 : q0 + q.shape[0]] = best_i
    return out_s, out_i


def _exact_ranking(queries: np.ndarray, keys: np.ndarray, cand_s: np.ndarray, cand_i: np.ndarray, k: int,
                   chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The final top-k from float32 candidates (score-sorted rows): float64 scores, ties by key id."""
    nq, n_cand = cand_i.shape
    out_s = np.empty((nq, k), np.float32)
    out_i = np.empty((nq, k), np.int64)
    if n_cand < keys.shape[0]:
        open_rows = cand_s[:, n_cand - 1] >= cand_s[:, k - 1] - RESCORE_MARGIN
    else:
        open_rows = np.zeros(nq, bool)
    closed = np.flatnonzero(~open_rows)
    step = max(1, _RESCORE_BLOCK_VALUES // max(1, n_cand * keys.shape[1]))
    for b0 in range(0, closed.size, step):
        rows = closed[b0 : b0 + step]
        ids = cand_i[rows]
        out_s[rows], out_i[rows] = _select_topk(_pair_scores(queries[rows], keys, ids), ids, k)
    for row in np.flatnonzero(open_rows):
        threshold = cand_s[row, k - 1] - RESCORE_MARGIN
        ids = np.concatenate([k0 + np.flatnonzero(keys[k0 : k0 + chunk_size] @ queries[row] >= threshold)
                              for k0 in range(0, keys.shape[0], chunk_size)])
        scores = np.concatenate([_pair_scores(queries[row : row + 1], keys, ids[None, c0 : c0 + chunk_size])
                                 for c0 in range(0, ids.size, chunk_size)], axis=1)
        s, i = _select_topk(scores, ids[None, :], k)
        out_s[row], out_i[row] = s[0], i[0]
    return out_s, out_i


def cosine_topk(queries: np.ndarray, keys: np.ndarray, k: int, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` keys by cosine similarity (inputs need not be normalised); options as `chunked_topk`."""
    return chunked_topk(l2_normalize(queries), l2_normalize(keys), k, **options)


# ------------------------------------------------------------------------------------------ text search
class Hit(NamedTuple):
    """One search result: position of the entry in the corpus, its text and the cosine similarity."""

    corpus_id: int
    text: str | None
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.corpus_id, "text": self.text, "score": self.score}


@dataclass
class SearchIndex:
    """L2-normalised corpus vectors with their texts (and a faiss index when faiss is used).

    Corpus ids are row positions. ``save``/``load`` keep it as an index folder (search/index_store.py: the
    format `mirrorbert index` writes), so a large corpus is encoded once. ``approximate``: an IVF index
    (search/approximate.py) that proposes candidates instead of a scan, for corpora too large to scan; the
    vectors may then be memory-mapped (only the candidates' rows are read).
    """

    vectors: np.ndarray
    texts: list[str] | None = None
    faiss_index: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    quantized_cache: dict = field(default_factory=dict, repr=False)  # quantised corpus and faiss index per precision
    approximate: Any = None  # an approximate.IVFIndex, or None: exact search

    def __post_init__(self) -> None:
        self.vectors = np.ascontiguousarray(np.atleast_2d(self.vectors), dtype=np.float32)
        if self.texts is not None and len(self.texts) != len(self.vectors):
            raise ValueError(f"{len(self.texts)} texts for {len(self.vectors)} vectors")

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @classmethod
    def from_vectors(cls, vectors: np.ndarray, texts: Sequence[str] | None = None, use_faiss: bool | None = None,
                     meta: dict[str, Any] | None = None, normalize: bool = True,
                     index_type: str = "exact") -> "SearchIndex":
        """``vectors`` are L2-normalised here unless ``normalize=False`` (already unit length).

        ``index_type``: "exact" (default), "ivf" (an approximate IVF index, needs faiss; hits are found
        approximately, their scores are exact cosines) or "auto" (IVF from `approximate.AUTO_IVF_ROWS` rows)."""
        from mirrorbert.search.approximate import IVFIndex, resolve_index_type

        vectors = l2_normalize(np.atleast_2d(vectors)) if normalize else vectors
        index = cls(vectors, list(texts) if texts is not None else None, meta=dict(meta or {}))
        kind = resolve_index_type(index_type, len(index), faiss_available())
        if len(index) and kind == "ivf":
            index.approximate = IVFIndex.build(index.vectors)
        elif len(index) and wants_faiss(use_faiss):
            index.faiss_index = build_faiss_index(index.vectors)
        return index

    def search_vectors(self, queries: np.ndarray, top_k: int, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                       use_faiss: bool | None = None, quantize: str = "float32",
                       nprobe: int | None = None) -> list[list[Hit]]:
        """Hits for already computed query vectors (normalised here), best first.

        ``use_faiss=None`` searches with the index's faiss index if it has one; True builds one if needed.
        With an approximate index, candidates come from it unless ``use_faiss=False`` (an exact scan);
        ``nprobe`` sets its lists scanned per query for this search (None: the index's own), and is refused
        where no lists are scanned (an exact index or scan, quantised candidates).
        ``quantize="int8"|"ubinary"``: candidates from the quantised corpus, rescored (search/quantized.py); the
        scores are then the float query against the dequantised vectors, not exact cosines.
        """
        check_top_k(top_k)
        queries = as_vectors(queries, "queries", self.dim)
        self.check_nprobe(nprobe, use_faiss, quantize)
        if quantize != "float32":
            from mirrorbert.search.quantized import quantized_topk

            scores, ids = quantized_topk(l2_normalize(queries), self.vectors, quantize, top_k, self.quantized_cache)
            return self._hits(scores, ids)
        if self.approximate is not None and use_faiss is not False:  # False: an exact scan, even here
            scores, ids = self.approximate.topk(l2_normalize(queries), self.vectors, top_k, nprobe=nprobe)
            return self._hits(scores, ids)
        use = self.faiss_index is not None if use_faiss is None else wants_faiss(use_faiss)
        if use and self.faiss_index is None:
            self.faiss_index = build_faiss_index(self.vectors)
        scores, ids = chunked_topk(l2_normalize(queries), self.vectors, top_k, chunk_size=chunk_size,
                                   use_faiss=False, faiss_index=self.faiss_index if use else None)
        return self._hits(scores, ids)

    def check_nprobe(self, nprobe: Any, use_faiss: bool | None = None, quantize: str = "float32") -> None:
        """``nprobe`` (None: nothing to check) is for an approximate index's lists: a UserError where this search
        scans none, or where the index has fewer lists."""
        if nprobe is None:
            return
        from mirrorbert.search.approximate import check_query_nprobe

        check_query_nprobe(nprobe, self.approximate.parts.nlist if self.approximate is not None else None,
                           scan="use_faiss=False (an exact scan)" if use_faiss is False else
                           f"quantize={quantize!r}" if quantize != "float32" else None)

    def _hits(self, scores: np.ndarray, ids: np.ndarray) -> list[list[Hit]]:
        texts = self.texts
        return [
            [Hit(int(i), texts[i] if texts is not None else None, float(s)) for s, i in zip(row_s, row_i) if i >= 0]
            for row_s, row_i in zip(scores, ids)
        ]

    def save(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write the index into the new folder ``folder`` in the index folder format (vectors.npy, texts.jsonl,
        ids.npy, the faiss index or the IVF parts, manifest.json with each file's SHA-256), atomically through
        the write policy (safeguards/writes): an existing folder (other than an empty one) is replaced only
        with ``overwrite`` and only when mirrorbert wrote all of it; a file there, or a failed write, is a
        UserError naming ``folder`` and leaves what was there as it was. ``meta``'s model, pooling and
        max_length are recorded as the manifest's; other entries must be flat (strings, numbers, bools)."""
        from mirrorbert.search.index_store import save_search_index

        return save_search_index(self, folder, overwrite)

    @classmethod
    def load(cls, folder: str | Path, use_faiss: bool | None = None) -> "SearchIndex":
        """An index folder (`save`, `mirrorbert index`), read as untrusted with every check `search --index`
        makes of its files (search/index_store.py); the vectors memory-mapped, the texts read when a hit needs
        one. ``use_faiss``: as `search_vectors` (None: the stored faiss or IVF index when faiss is installed)."""
        from mirrorbert.search.index_store import read_saved_index

        return cls.from_stored(read_saved_index(folder, use_faiss))

    @classmethod
    def from_stored(cls, stored) -> "SearchIndex":
        """A SearchIndex over the parts `index_store.read_index` read from a folder."""
        return cls(stored.vectors, stored.texts, faiss_index=stored.faiss_index, meta=dict(stored.meta),
                   approximate=stored.approximate)


def build_index(encoder, corpus: Sequence[str], *, batch_size: int = 64, use_faiss: bool | None = None,
                show_progress: bool = False) -> SearchIndex:
    """Encode and L2-normalise ``corpus`` with ``encoder`` (anything with ``encode``, such as
    `mirrorbert.Encoder`) into a SearchIndex; its meta records the encoder's source, pooling and max_length
    where it has them (what `SearchIndex.save` writes into the manifest)."""
    corpus = check_texts(corpus, "corpus")
    if not corpus:
        raise UserError("the search corpus is empty")
    vectors = encoder.encode(corpus, batch_size=batch_size, normalize=True, show_progress=show_progress)
    meta = {name: getattr(encoder, attribute) for name, attribute in
            (("model", "source"), ("pooling", "pooling"), ("max_length", "max_length"))
            if getattr(encoder, attribute, None) is not None}
    return SearchIndex.from_vectors(vectors, corpus, use_faiss=use_faiss, meta=meta)


def as_vectors(value: Any, name: str, dim: int | None = None) -> np.ndarray:
    """`value` as a finite float32 matrix [n, dim] (a single vector is one row); anything else -- strings, ragged
    or nested lists, another dimension, NaN or infinity -- is a UserError naming the argument (a NaN query
    would otherwise match nothing and answer an empty list as if that were a result)."""
    if isinstance(value, (str, bytes)):
        raise UserError(f"{name}: expected vectors (an array of numbers), got a string")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{name}: expected vectors of one dimension each ({str(exc).splitlines()[0][:100]})") from None
    if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
        raise UserError(f"{name}: expected vectors of numbers, got an array of {array.dtype}")
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0:
        raise UserError(f"{name}: expected a matrix of vectors, got shape {array.shape}")
    if dim is not None and array.shape[1] != dim:
        raise UserError(f"{name}: vectors of dimension {array.shape[1]}, the index has {dim}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    finite = np.isfinite(array).all(axis=1)
    if not finite.all():
        raise UserError(f"{name}: vector {int(np.flatnonzero(~finite)[0])} is not finite (NaN or infinity)")
    return array


def check_texts(value: Any, name: str) -> list[str]:
    """A string or a sequence of strings as a list; anything else is a UserError naming the argument."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, dict, set)) or not isinstance(value, Sequence):
        raise UserError(f"{name}: expected a string or a list of strings, not {type(value).__name__}")
    texts = list(value)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"{name}: item {i} is {type(text).__name__}, not a string")
    return texts


def check_top_k(top_k: Any) -> None:
    """A whole number >= 1 (2.5 or "3" would fail deep in the ranking, or be silently truncated)."""
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 1:
        raise UserError(f"--top-k must be a whole number >= 1, not {top_k!r}")


def search(encoder, queries: str | Sequence[str], corpus_or_index: SearchIndex | Sequence[str], top_k: int = 10, *,
           batch_size: int = 64, use_faiss: bool | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
           show_progress: bool = False, quantize: str = "float32",
           nprobe: int | None = None) -> list[Hit] | list[list[Hit]]:
    """The ``top_k`` corpus entries nearest (cosine) to each query, encoded with ``encoder`` (anything with
    ``encode``, such as `mirrorbert.Encoder`): per query a list of Hit(corpus_id, text, score), best first
    (ties: smaller id); one list of hits for a single string. ``corpus_or_index``: a SearchIndex, or strings
    (encoded here, as `build_index` does). ``nprobe``: an approximate index's lists scanned per query
    (`SearchIndex.search_vectors`)."""
    check_top_k(top_k)
    if quantize != "float32":
        from mirrorbert.search.quantized import SEARCH_QUANTIZATIONS, check_quantization

        check_quantization(quantize, "quantize", SEARCH_QUANTIZATIONS)
    index = corpus_or_index
    if isinstance(index, SearchIndex):
        index.check_nprobe(nprobe, use_faiss, quantize)  # before any encoding
    elif nprobe is not None:  # a corpus of strings is searched exactly
        from mirrorbert.search.approximate import check_query_nprobe

        check_query_nprobe(nprobe, None)
    if not isinstance(index, SearchIndex):
        index = build_index(encoder, index, batch_size=batch_size, use_faiss=use_faiss, show_progress=show_progress)
    single = isinstance(queries, str)
    queries = check_texts(queries, "queries")
    if not queries:
        return []
    vectors = encoder.encode(queries, batch_size=batch_size, normalize=True)
    hits = index.search_vectors(vectors, top_k, chunk_size=chunk_size, use_faiss=use_faiss, quantize=quantize,
                                nprobe=nprobe)
    return hits[0] if single else hits


__all__ = [
    "DEFAULT_CHUNK_SIZE", "DEFAULT_QUERY_BLOCK", "Hit", "SearchIndex", "build_index", "search",
    "chunked_topk", "cosine_topk", "l2_normalize", "faiss_available",
]
