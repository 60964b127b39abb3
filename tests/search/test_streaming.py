"""Streamed exact search (search/streaming.py): a running top-k over corpus chunks equals one search over the
whole corpus, whatever the chunking, ties included; `search --corpus` never encodes more than a chunk."""

from __future__ import annotations

import numpy as np
import pytest

from mirrorbert.search.exact import chunked_topk, l2_normalize, search
from mirrorbert.search.streaming import RunningTopK
from tests.support import cli_hits, run_cli


def stream_topk(queries, chunks, k):
    """`RunningTopK` over (vectors, texts) chunks, as `search --corpus` drives it."""
    running = RunningTopK(queries, k)
    for vectors, texts in chunks:
        running.add(vectors, texts)
    return running.hits()


def _chunks(keys, size):
    return ((keys[a:a + size], [f"row {j}" for j in range(a, min(a + size, len(keys)))])
            for a in range(0, len(keys), size))


@pytest.mark.parametrize("size", [1, 7, 256, 1000, 3000])
def test_running_topk_equals_whole_search_with_ties_across_chunks(size):
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((1000, 12)).astype(np.float32)
    keys[900] = keys[40]  # exact ties that land in different chunks: the smaller id must come first
    keys[611] = keys[5]
    queries = rng.standard_normal((30, 12)).astype(np.float32)
    queries[0], queries[1] = keys[40], keys[5]
    scores, ids = chunked_topk(l2_normalize(queries), l2_normalize(keys), 10)
    hits = stream_topk(queries, _chunks(keys, size), 10)
    assert [[h.corpus_id for h in row] for row in hits] == ids.tolist()
    assert [[h.score for h in row] for row in hits] == scores.tolist()
    assert all(h.text == f"row {h.corpus_id}" for row in hits for h in row)
    assert [h.corpus_id for h in hits[0][:2]] == [40, 900] and [h.corpus_id for h in hits[1][:2]] == [5, 611]


def test_running_topk_matches_an_independent_float64_ranking():
    rng = np.random.default_rng(2)
    keys = rng.standard_normal((500, 8))
    queries = rng.standard_normal((20, 8))
    q, c = queries / np.linalg.norm(queries, axis=1, keepdims=True), keys / np.linalg.norm(keys, axis=1, keepdims=True)
    truth = np.argsort(-(q @ c.T), axis=1, kind="stable")[:, :5]
    hits = stream_topk(queries.astype(np.float32), ((keys[a:a + 64].astype(np.float32), None)
                                                    for a in range(0, 500, 64)), 5)
    assert [[h.corpus_id for h in row] for row in hits] == truth.tolist()
    assert all(h.text is None for row in hits for h in row)


def test_running_topk_keeps_only_the_texts_of_current_hits():
    rng = np.random.default_rng(3)
    running = RunningTopK(rng.standard_normal((4, 6)).astype(np.float32), 3)
    for vectors, texts in _chunks(rng.standard_normal((400, 6)).astype(np.float32), 50):
        running.add(vectors, texts)
        assert set(running.texts) == set(running.ids.ravel().tolist())
    assert running.seen == 400 and running.ids.shape == (4, 3)


def test_fewer_rows_than_k_gives_every_row():
    hits = stream_topk(np.eye(2, 3, dtype=np.float32), [(np.eye(2, 3, dtype=np.float32), ["a", "b"])], 5)
    assert [[h.text for h in row] for row in hits] == [["a", "b"], ["b", "a"]]


def test_cli_search_corpus_streams_in_chunks_with_the_whole_search_hits(tiny_bert, corpus, tmp_path, capsys,
                                                                        monkeypatch):
    from mirrorbert.encoder import streaming
    from mirrorbert.encoder.model import Encoder

    lines = corpus + ["", *corpus[:3][::-1]]  # a blank line keeps its number; duplicates are separate rows
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    queries = corpus[:4]
    encoder = Encoder.load(str(tiny_bert), device="cpu")
    whole = search(encoder, queries, [t for t in lines if t.strip()], top_k=5)  # encoded whole, in memory
    numbers = [i for i, t in enumerate(lines) if t.strip()]

    largest = []
    real_encode = Encoder.encode

    def encode(self, texts, *args, **kwargs):
        largest.append(len(texts))
        return real_encode(self, texts, *args, **kwargs)

    monkeypatch.setattr(streaming, "STREAM_ROWS", 4)
    monkeypatch.setattr(Encoder, "encode", encode)
    argv = ["search", "--model", tiny_bert, "--corpus", path, "--top-k", 5, "--device", "cpu", "--no-progress"]
    code, out, err = run_cli(capsys, argv + [arg for q in queries for arg in ("--query", q)])
    assert code == 0, err
    assert max(largest) == 4 and sum(largest) == len(numbers) + len(queries)
    for got, want in zip(cli_hits(out), whole):
        assert [h["text"] for h in got] == [lines[h["id"]] for h in got]
        assert [h["score"] for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
        assert {h["id"] for h in got if h["score"] > got[-1]["score"] + 1e-4} <= {numbers[h.corpus_id] for h in want}
