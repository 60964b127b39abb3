"""Exact nearest-neighbour search: `chunked_topk` (behind `search`, `search --corpus` and the evaluation's
retrieval), `SearchIndex`, and `build_index` and `search` over any encoder (an object with `encode`). Every path
ranks alike, never materialising the score matrix: float32 products propose candidates, one float64 score per
(query, key) pair orders them, ties to the smaller key id (docs/design.md, "Ranking alike on every path").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from mirrorbert.errors import UserError
from mirrorbert.search.approximate import IVFIndex, check_query_nprobe, resolve_index_type
from mirrorbert.search.index_claims import Manifest
from mirrorbert.search.index_store import read_index, save_search_index
from mirrorbert.search.quantized import SEARCH_QUANTIZATIONS, check_quantization, quantized_topk
from mirrorbert.search.ranking import (RESCORE_BLOCK_VALUES, build_faiss_index, faiss_available, l2_normalize,
                                      pair_scores, select_topk, wants_faiss)

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 16384
DEFAULT_QUERY_BLOCK = 1024
CANDIDATE_EXTRA = 8
RESCORE_MARGIN = 1e-4  # far above the ~1e-6 float32 error of a unit-vector dot product


def chunked_topk(
    queries: np.ndarray,
    keys: np.ndarray,
    k: int,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    query_block: int = DEFAULT_QUERY_BLOCK,
    use_faiss: bool | None = False,
    faiss_index: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` keys by inner product for every query: ``(scores [nq, k], indices [nq, k])``, ``k`` capped at
    the number of keys; the same ids and scores with or without faiss. ``use_faiss``: True forces faiss, None
    uses it when importable, False never. ``faiss_index``: an ``IndexFlatIP`` already holding ``keys``.
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
        cand_s, cand_i = _float32_candidates(queries, keys, n_cand, chunk_size, query_block)
    return _exact_ranking(queries, keys, cand_s, cand_i, k, chunk_size)


def _float32_candidates(queries: np.ndarray, keys: np.ndarray, n_cand: int, chunk_size: int,
                        query_block: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``n_cand`` best keys per query by float32 inner product, score-sorted; memory-bounded."""
    import torch

    nq, nk = queries.shape[0], keys.shape[0]
    out_s = np.empty((nq, n_cand), np.float32)
    out_i = np.empty((nq, n_cand), np.int64)
    for q0 in range(0, nq, query_block):
        q = queries[q0 : q0 + query_block]
        best_s = np.full((q.shape[0], 0), -np.inf, np.float32)
        best_i = np.zeros((q.shape[0], 0), np.int64)
        for k0 in range(0, nk, chunk_size):
            block = q @ keys[k0 : k0 + chunk_size].T
            take = min(n_cand, block.shape[1])
            vals, cols = torch.topk(torch.from_numpy(block), take, dim=1)  # order of ties irrelevant here
            best_s, best_i = select_topk(np.concatenate([best_s, vals.numpy()], axis=1),
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
    # a row whose last candidate is within the margin of its k-th may miss a key: it takes every key within it
    open_rows = (cand_s[:, n_cand - 1] >= cand_s[:, k - 1] - RESCORE_MARGIN) & (n_cand < keys.shape[0])
    closed = np.flatnonzero(~open_rows)
    step = max(1, RESCORE_BLOCK_VALUES // max(1, n_cand * keys.shape[1]))
    for b0 in range(0, closed.size, step):
        rows = closed[b0 : b0 + step]
        ids = cand_i[rows]
        out_s[rows], out_i[rows] = select_topk(pair_scores(queries[rows], keys[ids]), ids, k)
    for row in np.flatnonzero(open_rows):
        threshold = cand_s[row, k - 1] - RESCORE_MARGIN
        ids = np.concatenate([k0 + np.flatnonzero(keys[k0 : k0 + chunk_size] @ queries[row] >= threshold)
                              for k0 in range(0, keys.shape[0], chunk_size)])
        scores = np.concatenate([pair_scores(queries[row : row + 1], keys[ids[None, c0 : c0 + chunk_size]])
                                 for c0 in range(0, ids.size, chunk_size)], axis=1)
        s, i = select_topk(scores, ids[None, :], k)
        out_s[row], out_i[row] = s[0], i[0]
    return out_s, out_i


def cosine_topk(queries: np.ndarray, keys: np.ndarray, k: int, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` keys by cosine similarity (inputs need not be normalised); options as `chunked_topk`."""
    return chunked_topk(l2_normalize(queries), l2_normalize(keys), k, **options)


class Hit(NamedTuple):
    """One search result: position of the entry in the corpus, its text and the cosine similarity."""

    corpus_id: int
    text: str | None
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.corpus_id, "text": self.text, "score": self.score}


@dataclass
class SearchIndex:
    """L2-normalised corpus vectors with their texts (and a faiss index when faiss is used); ``save``/``load``
    keep it as the index folder `mirrorbert index` writes. A hit's corpus id is `ids[row]` where the index
    skipped blank entries (their numbering kept), else the row. ``approximate``: an IVF index
    (search/approximate.py) proposing candidates instead of a scan."""

    vectors: np.ndarray
    texts: list[str] | None = None
    faiss_index: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    quantized_cache: dict = field(default_factory=dict, repr=False)  # quantised corpus and faiss index per precision
    approximate: Any = None  # an approximate.IVFIndex, or None: exact search
    ids: Any = None  # int64 [rows]: each row's place in the corpus; None: the row itself

    def __post_init__(self) -> None:
        self.vectors = np.ascontiguousarray(np.atleast_2d(self.vectors), dtype=np.float32)
        if self.texts is not None and len(self.texts) != len(self.vectors):
            raise ValueError(f"{len(self.texts)} texts for {len(self.vectors)} vectors")
        if self.ids is not None and len(self.ids) != len(self.vectors):
            raise ValueError(f"{len(self.ids)} ids for {len(self.vectors)} vectors")

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @classmethod
    def from_vectors(cls, vectors: np.ndarray, texts: Sequence[str] | None = None, *, use_faiss: bool | None = None,
                     meta: dict[str, Any] | None = None, normalize: bool = True,
                     index_type: str = "exact") -> "SearchIndex":
        """An index of ``vectors``, L2-normalised here unless ``normalize=False``; each must be finite and not all
        zeros (a UserError names the first that is not). ``index_type``: "exact", "ivf" (approximate, needs
        faiss: hits found approximately, scores exact cosines) or "auto" (IVF from `AUTO_IVF_ROWS` rows)."""
        vectors = check_nonzero(as_vectors(vectors, "vectors"), "vectors")
        vectors = l2_normalize(vectors) if normalize else vectors
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
        """Hits for query vectors (normalised here), best first. ``use_faiss``: None uses the index's faiss or IVF
        index if it has one, True builds a faiss one if needed, False scans exactly. ``nprobe``: an approximate
        index's lists scanned per query (refused where none are scanned). ``quantize="int8"|"ubinary"``:
        candidates from the quantised corpus, scored against the dequantised vectors (search/quantized.py)."""
        check_top_k(top_k)
        queries = l2_normalize(check_nonzero(as_vectors(queries, "queries", self.dim), "queries"))
        _check_nprobe(nprobe, self, use_faiss, quantize)
        if quantize != "float32":
            scores, ids = quantized_topk(queries, self.vectors, quantize, top_k, self.quantized_cache)
        elif self.approximate is not None and use_faiss is not False:  # False: an exact scan, even here
            scores, ids = self.approximate.topk(queries, self.vectors, top_k, nprobe=nprobe)
        else:
            use = self.faiss_index is not None if use_faiss is None else wants_faiss(use_faiss)
            if use and self.faiss_index is None:
                self.faiss_index = build_faiss_index(self.vectors)
            scores, ids = chunked_topk(queries, self.vectors, top_k, chunk_size=chunk_size, use_faiss=False,
                                       faiss_index=self.faiss_index if use else None)
        return self._hits(scores, ids)

    def _hits(self, scores: np.ndarray, rows: np.ndarray) -> list[list[Hit]]:
        texts, ids = self.texts, self.ids
        return [
            [Hit(int(ids[i]) if ids is not None else int(i), texts[i] if texts is not None else None, float(s))
             for s, i in zip(row_s, row_i) if i >= 0]
            for row_s, row_i in zip(scores, rows)
        ]

    def save(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write the index into the new folder ``folder`` in the index folder format, atomically through the write
        policy (an existing folder is replaced only with ``overwrite`` and only when mirrorbert wrote it; a
        failure is a UserError that leaves it as it was). ``meta``'s model, pooling and max_length become the
        manifest's; its other entries must be flat (strings, numbers, bools)."""
        return save_search_index(self, folder, overwrite)

    @classmethod
    def load(cls, folder: str | Path, use_faiss: bool | None = None) -> "SearchIndex":
        """An index folder (`save`, `mirrorbert index`), read as untrusted with every check `search --index` makes
        of its files; the vectors memory-mapped, a text read when a hit needs it. ``use_faiss``: as
        `search_vectors`."""
        return cls(**read_index(Path(folder), Manifest.read(Path(folder), "folder"), use_faiss, option="folder"))


def _check_nprobe(nprobe: Any, index: SearchIndex | None, use_faiss: bool | None, quantize: str) -> None:
    """``nprobe`` (None: nothing to check) is for an approximate index's lists: a UserError where a search of
    `index` (None: strings, searched exactly) scans none, or where the index has fewer lists."""
    if nprobe is None:
        return
    approximate = index.approximate if index is not None else None
    check_query_nprobe(nprobe, approximate.parts.nlist if approximate is not None else None,
                       scan="use_faiss=False (an exact scan)" if use_faiss is False else
                       f"quantize={quantize!r}" if quantize != "float32" else None)


def is_entry(text: str) -> bool:
    """Whether a corpus string is indexed (every path's rule): a blank one keeps its place in the corpus's
    numbering but is never a hit."""
    return bool(text.strip())


def build_index(encoder, corpus: Sequence[str], *, batch_size: int = 64, use_faiss: bool | None = None,
                show_progress: bool = False) -> SearchIndex:
    """A SearchIndex of ``corpus``'s entries (`is_entry`; each hit's id its place in ``corpus``) encoded with
    ``encoder`` (anything with ``encode``, such as `mirrorbert.Encoder`); its meta records the encoder's source,
    pooling and max_length where it has them."""
    corpus = check_texts(corpus, "corpus")
    kept = [i for i, text in enumerate(corpus) if is_entry(text)]
    if not kept:
        raise UserError("corpus: no entries to index (it is empty or every string is blank)")
    entries = corpus if len(kept) == len(corpus) else [corpus[i] for i in kept]
    vectors = encoder.encode(entries, batch_size=batch_size, normalize=True, show_progress=show_progress)
    meta = {name: getattr(encoder, attribute) for name, attribute in
            (("model", "source"), ("pooling", "pooling"), ("max_length", "max_length"))
            if getattr(encoder, attribute, None) is not None}
    index = SearchIndex.from_vectors(vectors, entries, use_faiss=use_faiss, meta=meta)
    if len(kept) != len(corpus):
        index.ids = np.asarray(kept, dtype=np.int64)
    return index


def as_vectors(value: Any, name: str, dim: int | None = None) -> np.ndarray:
    """`value` as a finite float32 matrix [n, dim] (a single vector is one row); anything else (strings, ragged
    or nested lists, another dimension, NaN or infinity) is a UserError naming the argument."""
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


def check_nonzero(array: np.ndarray, name: str) -> np.ndarray:
    """`array` (finite vectors) unless a row is all zeros (no direction: its cosine is undefined)."""
    zero = ~array.any(axis=1)
    if zero.any():
        raise UserError(f"{name}: vector {int(np.flatnonzero(zero)[0])} is all zeros (no direction: its cosine "
                        "with anything is undefined)")
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
    """A whole number >= 1, else a UserError."""
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 1:
        raise UserError(f"--top-k must be a whole number >= 1, not {top_k!r}")


def search(encoder, queries: str | Sequence[str], corpus_or_index: SearchIndex | Sequence[str], top_k: int = 10, *,
           batch_size: int = 64, use_faiss: bool | None = None, quantize: str = "float32",
           nprobe: int | None = None) -> list[Hit] | list[list[Hit]]:
    """The ``top_k`` corpus entries nearest (cosine) to each query, encoded with ``encoder`` (anything with
    ``encode``, such as `mirrorbert.Encoder`): per query a list of Hit(corpus_id, text, score), best first
    (ties: smaller id); one list of hits for a single string. ``corpus_or_index``: a SearchIndex, or strings
    (encoded here, as `build_index` does). ``use_faiss``, ``quantize``, ``nprobe``: as
    `SearchIndex.search_vectors`."""
    check_top_k(top_k)
    if quantize != "float32":
        check_quantization(quantize, "quantize", SEARCH_QUANTIZATIONS)
    index = corpus_or_index if isinstance(corpus_or_index, SearchIndex) else None
    _check_nprobe(nprobe, index, use_faiss, quantize)  # before any encoding
    if index is None:
        index = build_index(encoder, corpus_or_index, batch_size=batch_size, use_faiss=use_faiss)
    single = isinstance(queries, str)
    queries = check_texts(queries, "queries")
    if not queries:
        return []
    vectors = encoder.encode(queries, batch_size=batch_size, normalize=True)
    hits = index.search_vectors(vectors, top_k, use_faiss=use_faiss, quantize=quantize, nprobe=nprobe)
    return hits[0] if single else hits


__all__ = [
    "DEFAULT_CHUNK_SIZE", "DEFAULT_QUERY_BLOCK", "Hit", "SearchIndex", "build_index", "is_entry", "search",
    "chunked_topk", "cosine_topk", "l2_normalize", "faiss_available",
]
