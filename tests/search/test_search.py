"""Search: chunked exact top-k with and without faiss equals a brute-force argsort; Encoder API; CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mirrorbert.search import exact as S
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError

REPO = Path(__file__).resolve().parents[2]
has_faiss = pytest.mark.skipif(not S.faiss_available(), reason="faiss not installed")
FAISS_MODES = [False, pytest.param(True, marks=has_faiss)]


def brute_force(queries: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent reference: full cosine matrix in float64, stable sort by (-score, id)."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    scores = q.astype(np.float64) @ c.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize("use_faiss", FAISS_MODES)
@pytest.mark.parametrize("chunk_size", [7, 1000])
def test_search_index_equals_brute_force_on_random_vectors(use_faiss, chunk_size):
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(300, 16)).astype(np.float32)
    queries = rng.normal(size=(25, 16)).astype(np.float32)
    texts = [f"entry {i}" for i in range(len(keys))]
    index = S.SearchIndex.from_vectors(keys, texts, use_faiss=use_faiss)
    assert (index.faiss_index is not None) == use_faiss
    hits = index.search_vectors(queries, 10, chunk_size=chunk_size, use_faiss=use_faiss)
    ref_s, ref_i = brute_force(queries, keys, 10)
    assert [[h.corpus_id for h in row] for row in hits] == ref_i.tolist()
    np.testing.assert_allclose([[h.score for h in row] for row in hits], ref_s, atol=1e-5)
    assert hits[3][0].text == f"entry {ref_i[3, 0]}"


@pytest.mark.parametrize("use_faiss", FAISS_MODES)
def test_ties_go_to_the_smaller_id_on_every_path(use_faiss):
    # Duplicated keys make exact ties, also across the k-th place (ids 2, 5, 8 tie for places 1-3, k=2).
    base = np.eye(4, dtype=np.float32)
    keys = np.stack([base[1], base[2], base[0], base[3], base[1], base[0], base[2], base[3], base[0]])
    queries = base[[0, 1]]
    scores, ids = S.chunked_topk(queries, keys, 2, chunk_size=3, use_faiss=use_faiss)
    assert ids.tolist() == [[2, 5], [0, 4]]
    np.testing.assert_allclose(scores, 1.0)


@has_faiss
def test_faiss_equals_exact_path_on_tie_heavy_count_vectors():
    """Bag-of-n-gram counts tie (and nearly tie after rounding) all the time: faiss must still agree."""
    from mirrorbert.evaluation.retrieval import csls_topk

    rng = np.random.default_rng(2)
    keys = rng.poisson(0.3, size=(2000, 24)).astype(np.float32)
    keys[:, 0] += 1  # no zero rows
    queries = np.concatenate([keys[rng.choice(2000, 50)], rng.poisson(0.3, size=(50, 24)).astype(np.float32) + 1])
    exact = S.cosine_topk(queries, keys, 5, chunk_size=300, use_faiss=False)
    fast = S.cosine_topk(queries, keys, 5, chunk_size=300, use_faiss=True)
    np.testing.assert_array_equal(fast[1], exact[1])
    np.testing.assert_allclose(fast[0], exact[0], atol=1e-5)
    csls_exact = csls_topk(queries[:40], keys, 3, csls_k=5, use_faiss=False)
    csls_fast = csls_topk(queries[:40], keys, 3, csls_k=5, use_faiss=True)
    np.testing.assert_array_equal(csls_fast[1], csls_exact[1])


@pytest.mark.parametrize("use_faiss", FAISS_MODES)
def test_ranking_does_not_depend_on_query_batch_chunks_or_threads(use_faiss):
    """float32 BLAS rounding depends on the batch shape and the thread count; the final ranking must not.

    Mathematically tied count vectors are ranked by corpus order whether the queries come all at once,
    one by one or permuted, whatever the chunk size and the number of threads (this is what differed
    between machines before: 7 of 500 ids on an AVX2 CPU).
    """
    import torch

    rng = np.random.default_rng(7)
    keys = rng.poisson(0.3, size=(1500, 16)).astype(np.float32)
    keys[:, 0] += 1
    queries = np.concatenate([keys[rng.choice(1500, 30)], rng.poisson(0.3, size=(30, 16)).astype(np.float32) + 1])
    reference = S.cosine_topk(queries, keys, 6, use_faiss=False)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            whole = S.cosine_topk(queries, keys, 6, chunk_size=257, use_faiss=use_faiss)
            single = [S.cosine_topk(queries[i : i + 1], keys, 6, chunk_size=1000, use_faiss=use_faiss)[1][0]
                      for i in range(len(queries))]
            perm = rng.permutation(len(queries))
            permuted = S.cosine_topk(queries[perm], keys, 6, query_block=7, use_faiss=use_faiss)
            np.testing.assert_array_equal(whole[1], reference[1])
            np.testing.assert_array_equal(np.stack(single), reference[1])
            np.testing.assert_array_equal(permuted[1], reference[1][perm])
            np.testing.assert_array_equal(whole[0], reference[0])  # the same float64 scores, to the bit
    finally:
        torch.set_num_threads(threads)
    # and against an independent float64 brute force with a stable sort (ties by id)
    _, ids = brute_force(queries, keys, 6)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    exact = q.astype(np.float64) @ c.astype(np.float64).T
    # where the brute force's order differs, the two keys' float64 scores must tie to rounding
    for row, col in zip(*np.nonzero(ids != reference[1])):
        assert abs(exact[row, ids[row, col]] - exact[row, reference[1][row, col]]) < 1e-12


def test_top_k_larger_than_corpus_is_capped():
    index = S.SearchIndex.from_vectors(np.eye(3, dtype=np.float32), ["a", "b", "c"], use_faiss=False)
    assert [len(row) for row in index.search_vectors(np.eye(3), 10)] == [3, 3, 3]


def test_index_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    index = S.SearchIndex.from_vectors(rng.normal(size=(20, 8)), [f"t{i}" for i in range(20)], use_faiss=False,
                                       meta={"model": "m"})
    index.save(tmp_path / "idx")
    loaded = S.SearchIndex.load(tmp_path / "idx", use_faiss=False)
    np.testing.assert_array_equal(loaded.vectors, index.vectors)
    assert loaded.texts == index.texts and loaded.meta["model"] == "m"
    q = rng.normal(size=(4, 8))
    assert loaded.search_vectors(q, 5) == index.search_vectors(q, 5)
    with pytest.raises(UserError, match="not a saved search index"):
        S.SearchIndex.load(tmp_path)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_bert):
    return Encoder.load(tiny_bert, pooling="mean", device="cpu")


@pytest.mark.parametrize("use_faiss", FAISS_MODES)
def test_encoder_search_equals_brute_force_on_a_tiny_model(tiny_encoder, corpus, use_faiss):
    queries = ["a cat on a mat", "interest rates", "football"]
    index = tiny_encoder.build_index(corpus, use_faiss=use_faiss)
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-5)
    hits = tiny_encoder.search(queries, index, top_k=4, use_faiss=use_faiss)
    ref_s, ref_i = brute_force(tiny_encoder.encode(queries), tiny_encoder.encode(corpus), 4)
    assert [[h.corpus_id for h in row] for row in hits] == ref_i.tolist()
    np.testing.assert_allclose([[h.score for h in row] for row in hits], ref_s, atol=1e-5)
    assert all(h.text == corpus[h.corpus_id] for row in hits for h in row)
    # a plain list of strings works as the corpus, a single string query gives one list of hits
    single = tiny_encoder.search(queries[0], corpus, top_k=4, use_faiss=use_faiss)
    assert [(h.corpus_id, h.text) for h in single] == [(h.corpus_id, h.text) for h in hits[0]]
    np.testing.assert_allclose([h.score for h in single], [h.score for h in hits[0]], atol=1e-5)


def test_encoder_search_rejects_bad_input(tiny_encoder, corpus):
    with pytest.raises(UserError, match="top-k"):
        tiny_encoder.search("x", corpus, top_k=0)
    with pytest.raises(UserError, match="empty"):
        tiny_encoder.build_index([])


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "mirrorbert.cli.app", "search", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_cli_search_query_and_queries_file(tiny_bert, tiny_encoder, corpus, tmp_path, capsys):
    """--queries end to end in a subprocess (the installed entry point's path); --query in process."""
    from mirrorbert.cli.app import main

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    queries = ["a cat on a mat", "rain tomorrow"]
    queries_file = tmp_path / "queries.txt"
    queries_file.write_text("\n".join(queries) + "\n", encoding="utf-8")
    code = main(["search", "--model", str(tiny_bert), "--corpus", str(corpus_file), "--query", queries[0],
                 "--top-k", "3", "--pooling", "mean", "--no-progress"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 1 and lines[0]["query"] == queries[0]
    expected = tiny_encoder.search(queries[0], corpus, top_k=3)
    assert [(h["id"], h["text"]) for h in lines[0]["hits"]] == [(h.corpus_id, h.text) for h in expected]
    np.testing.assert_allclose([h["score"] for h in lines[0]["hits"]], [h.score for h in expected], atol=1e-5)

    many = _cli("--model", str(tiny_bert), "--corpus", str(corpus_file), "--queries", str(queries_file),
                "--top-k", "2", "--pooling", "mean", "--faiss", "no", "--no-progress")
    assert many.returncode == 0, many.stderr
    lines = [json.loads(line) for line in many.stdout.splitlines()]
    assert [line["query"] for line in lines] == queries
    assert all(len(line["hits"]) == 2 for line in lines)
    assert lines[0]["hits"][0]["id"] == expected[0].corpus_id


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda d: ["--corpus", str(d / "missing.txt"), "--query", "x"], "--corpus .*no such file"),
        (lambda d: ["--corpus", str(d / "empty.txt"), "--query", "x"], "--corpus .*empty"),
        (lambda d: ["--corpus", str(d / "corpus.txt"), "--query", "x", "--top-k", "0"], "--top-k must be a whole number >= 1"),
        (lambda d: ["--corpus", str(d / "corpus.txt")], "either --query"),
        (lambda d: ["--corpus", str(d / "corpus.txt"), "--query", "x", "--queries", str(d / "corpus.txt")], "either --query"),
        (lambda d: ["--corpus", str(d / "corpus.txt"), "--queries", str(d / "nope.txt")], "--queries .*no such file"),
        (lambda d: ["--corpus", str(d / "corpus.txt"), "--query", "x", "--faiss", "maybe"], "--faiss"),
    ],
)
def test_cli_search_bad_input_is_one_line_exit_2(tmp_path, capsys, make_args, message):
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "corpus.txt").write_text("a\nb\n", encoding="utf-8")
    from mirrorbert.cli.app import main

    # the model does not exist: every error must come before it is loaded
    assert main(["search", "--model", str(tmp_path / "no-model"), *make_args(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mirrorbert: error:")
    assert re.search(message, err[0]), err[0]


def test_cli_search_never_returns_blank_lines_and_ids_stay_line_numbers(tiny_bert, corpus, tmp_path, capsys):
    from mirrorbert.cli.app import main

    lines_in = []
    for text in corpus[:6]:
        lines_in += [text, "", "   "]  # blank and whitespace-only lines between the entries
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(lines_in) + "\n", encoding="utf-8")
    assert main(["search", "--model", str(tiny_bert), "--corpus", str(corpus_file), "--query", corpus[0],
                 "--top-k", str(len(lines_in)), "--pooling", "mean", "--no-progress"]) == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[0])["hits"]
    assert len(hits) == 6 and all(h["text"].strip() for h in hits)
    assert all(lines_in[h["id"]] == h["text"] for h in hits)  # an id names the line it came from
