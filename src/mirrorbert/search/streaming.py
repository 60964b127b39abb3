"""Exact search over a corpus that is never held: `search --corpus` encodes it a chunk at a time and keeps, per
query, only the k best rows so far (their ids, vectors and texts). The answer equals a whole-corpus search
whatever the chunking: every merge ranks by the same float64 score per (query, row) pair, ties to the smaller id.
"""

from __future__ import annotations

import numpy as np

from mirrorbert.search.exact import Hit, chunked_topk, l2_normalize
from mirrorbert.search.ranking import pair_scores, select_topk


class RunningTopK:
    """The k best corpus rows per query over chunks added in corpus order (`add`), with their texts."""

    def __init__(self, queries: np.ndarray, k: int, use_faiss: bool | None = False):
        self.queries = l2_normalize(queries)
        self.k, self.use_faiss = int(k), use_faiss
        nq, dim = self.queries.shape
        self.ids = np.zeros((nq, 0), np.int64)
        self.vectors = np.zeros((nq, 0, dim), np.float32)
        self.scores = np.zeros((nq, 0), np.float64)
        self.texts: dict[int, str] = {}
        self.seen = 0

    def add(self, vectors: np.ndarray, texts: list[str] | None = None) -> None:
        """The next chunk of the corpus: rows `seen .. seen + len(vectors)`, L2-normalised here."""
        vectors = l2_normalize(vectors)
        if len(vectors) == 0:
            return
        _, local = chunked_topk(self.queries, vectors, self.k, use_faiss=self.use_faiss)  # exact within the chunk
        ids = np.concatenate([self.ids, local + self.seen], axis=1)
        rows = np.concatenate([self.vectors, vectors[local]], axis=1)
        scores, kept = select_topk(pair_scores(self.queries, rows), ids, min(self.k, ids.shape[1]))
        where = np.argmax(ids[:, :, None] == kept[:, None, :], axis=1)  # ids are distinct within a row
        self.vectors = np.take_along_axis(rows, where[:, :, None], axis=1)
        self.ids, self.scores = kept, scores
        if texts is not None:
            self.texts.update((int(i), texts[int(i) - self.seen]) for i in np.unique(local) + self.seen)
            wanted = set(np.unique(kept).tolist())
            self.texts = {i: t for i, t in self.texts.items() if i in wanted}
        self.seen += len(vectors)

    def hits(self) -> list[list[Hit]]:
        """Per query, best first: row position (among the rows added), text (None if none were given), cosine."""
        scores = self.scores.astype(np.float32)  # as `chunked_topk` reports them
        return [[Hit(int(i), self.texts.get(int(i)), float(s)) for s, i in zip(row_s, row_i)]
                for row_s, row_i in zip(scores, self.ids)]


__all__ = ["RunningTopK"]
