"""Search: chunked exact top-k with and without faiss equals a brute-force argsort; `search`/`build_index` over an
encoder; `SearchIndex.save`/`load` in the index folder format; CLI."""

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
    from mirrorbert.evaluation.bli import csls_topk

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


def test_index_save_load_round_trip_in_the_index_folder_format(tmp_path):
    rng = np.random.default_rng(1)
    meta = {"model": "m", "pooling": "cls", "max_length": 32, "note": "dev set", "version": 3}
    index = S.SearchIndex.from_vectors(rng.normal(size=(20, 8)), [f"t{i}" for i in range(20)], use_faiss=False,
                                       meta=meta)
    index.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert not (tmp_path / "idx" / "index.json").exists() and manifest["format"] == "mirrorbert-index/2"
    assert manifest["model"] == "m" and manifest["model_sha256"] is None and manifest["corpus"] is None
    assert manifest["meta"] == {"note": "dev set", "version": 3}
    assert set(manifest["files"]) >= {"vectors.npy", "ids.npy", "texts.jsonl"}
    loaded = S.SearchIndex.load(tmp_path / "idx", use_faiss=False)
    np.testing.assert_array_equal(loaded.vectors, index.vectors)
    assert list(loaded.texts) == index.texts and loaded.meta == meta
    q = rng.normal(size=(4, 8))
    assert loaded.search_vectors(q, 5) == index.search_vectors(q, 5)
    with pytest.raises(UserError, match="not a mirrorbert index"):
        S.SearchIndex.load(tmp_path)


def test_an_index_without_texts_or_meta_round_trips(tmp_path):
    index = S.SearchIndex.from_vectors(np.eye(3, 4), use_faiss=False)
    loaded = S.SearchIndex.load(index.save(tmp_path / "idx"), use_faiss=False)
    assert loaded.texts is None and loaded.meta == {} and not (tmp_path / "idx" / "texts.jsonl").exists()
    assert [h.corpus_id for h in loaded.search_vectors(np.eye(1, 4), 1)[0]] == [0]


def test_save_refuses_an_empty_index_and_meta_a_manifest_cannot_hold(tmp_path):
    with pytest.raises(UserError, match="empty"):
        S.SearchIndex.from_vectors(np.zeros((0, 4)), use_faiss=False).save(tmp_path / "empty")
    for meta, field in (({"nested": {"a": 1}}, "meta"), ({"pooling": "median"}, "pooling"),
                        ({"max_length": 0}, "max_length")):
        with pytest.raises(UserError, match=f"field '{field}'"):
            S.SearchIndex.from_vectors(np.eye(2, 4), meta=meta, use_faiss=False).save(tmp_path / "bad")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "empty").exists()


@has_faiss
def test_an_approximate_index_saves_its_parts_and_loads_to_the_same_hits(tmp_path):
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((2000, 16)).astype(np.float32)
    index = S.SearchIndex.from_vectors(keys, index_type="ivf")
    loaded = S.SearchIndex.load(index.save(tmp_path / "ivf"))
    assert loaded.approximate is not None and loaded.approximate.parts.nlist == index.approximate.parts.nlist
    np.testing.assert_array_equal(loaded.approximate.parts.centroids, index.approximate.parts.centroids)
    queries = rng.standard_normal((10, 16))
    assert loaded.search_vectors(queries, 5) == index.search_vectors(queries, 5)


def test_a_folder_without_a_manifest_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "first"
    folder.mkdir()
    np.save(folder / "vectors.npy", np.eye(3, 4, dtype=np.float32))
    (folder / "index.json").write_text(json.dumps({"model": "m", "pooling": "cls"}), encoding="utf-8")
    with pytest.raises(UserError, match=r"not a mirrorbert index \(no manifest.json") as info:
        S.SearchIndex.load(folder, use_faiss=False)
    assert "\n" not in str(info.value) and str(folder) in str(info.value)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_bert):
    return Encoder.load(tiny_bert, pooling="mean", device="cpu")


@pytest.mark.parametrize("use_faiss", FAISS_MODES)
def test_search_with_an_encoder_equals_brute_force_on_a_tiny_model(tiny_encoder, corpus, use_faiss):
    queries = ["a cat on a mat", "interest rates", "football"]
    index = S.build_index(tiny_encoder, corpus, use_faiss=use_faiss)
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-5)
    assert index.meta == {"model": tiny_encoder.source, "pooling": "mean", "max_length": tiny_encoder.max_length}
    hits = S.search(tiny_encoder, queries, index, top_k=4, use_faiss=use_faiss)
    ref_s, ref_i = brute_force(tiny_encoder.encode(queries), tiny_encoder.encode(corpus), 4)
    assert [[h.corpus_id for h in row] for row in hits] == ref_i.tolist()
    np.testing.assert_allclose([[h.score for h in row] for row in hits], ref_s, atol=1e-5)
    assert all(h.text == corpus[h.corpus_id] for row in hits for h in row)
    # a plain list of strings works as the corpus, a single string query gives one list of hits
    single = S.search(tiny_encoder, queries[0], corpus, top_k=4, use_faiss=use_faiss)
    assert [(h.corpus_id, h.text) for h in single] == [(h.corpus_id, h.text) for h in hits[0]]
    np.testing.assert_allclose([h.score for h in single], [h.score for h in hits[0]], atol=1e-5)


def test_search_rejects_bad_input(tiny_encoder, corpus):
    with pytest.raises(UserError, match="top-k"):
        S.search(tiny_encoder, "x", corpus, top_k=0)
    with pytest.raises(UserError, match="empty"):
        S.build_index(tiny_encoder, [])
    from mirrorbert.search import build_index, search  # the package's names, without importing numpy first

    assert (search, build_index) == (S.search, S.build_index)
    assert not hasattr(tiny_encoder, "search") and not hasattr(tiny_encoder, "push_to_hub")


def test_an_index_saved_from_python_is_searched_with_model_and_checked_against_it(tiny_bert, tiny_encoder, corpus,
                                                                                  tmp_path, capsys):
    from mirrorbert.cli.app import main

    folder = S.build_index(tiny_encoder, corpus, use_faiss=False).save(tmp_path / "idx")
    code = main(["search", "--index", str(folder), "--query", "a cat", "--no-progress"])
    assert code == 2 and "give the model that encoded it with --model" in capsys.readouterr().err
    code = main(["search", "--index", str(folder), "--model", str(tiny_bert), "--query", "a cat on a mat",
                 "--top-k", "2", "--no-progress"])
    assert code == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[0])["hits"]
    expected = S.search(tiny_encoder, "a cat on a mat", corpus, top_k=2)
    assert [(h["id"], h["text"]) for h in hits] == [(h.corpus_id, h.text) for h in expected]
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    code = main(["search", "--index", str(folder), "--model", str(tiny_bert), "--corpus", str(corpus_file),
                 "--query", "x", "--no-progress"])
    assert code == 2 and "leave --corpus out" in capsys.readouterr().err
    cls_encoder = Encoder.load(tiny_bert, pooling="cls", device="cpu")  # vectors of another pooling: refused
    S.build_index(cls_encoder, corpus, use_faiss=False).save(tmp_path / "cls")
    idx = json.loads((tmp_path / "cls" / "manifest.json").read_text())
    idx["pooling"] = "mean"  # a manifest edited to the model's default: the stored vectors disagree
    (tmp_path / "cls" / "manifest.json").write_text(json.dumps(idx), encoding="utf-8")
    code = main(["search", "--index", str(tmp_path / "cls"), "--model", str(tiny_bert), "--query", "x",
                 "--no-progress"])
    assert code == 2 and "is not what --model makes of its text" in capsys.readouterr().err
    S.SearchIndex.from_vectors(np.eye(3, 4), ["a", "b", "c"], use_faiss=False).save(tmp_path / "bare")
    code = main(["search", "--index", str(tmp_path / "bare"), "--model", str(tiny_bert), "--query", "x",
                 "--no-progress"])
    assert code == 2 and "without its pooling and its max_length" in capsys.readouterr().err


def test_an_index_the_command_built_loads_in_python(tiny_bert, tiny_encoder, corpus, tmp_path, capsys):
    from mirrorbert.cli.app import main

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    assert main(["index", "--model", str(tiny_bert), "--corpus", str(corpus_file), "--output", str(tmp_path / "i"),
                 "--pooling", "mean", "--no-progress"]) == 0
    capsys.readouterr()
    index = S.SearchIndex.load(tmp_path / "i", use_faiss=False)
    assert index.meta["pooling"] == "mean" and list(index.texts) == corpus
    hits, expected = (S.search(tiny_encoder, "interest rates", where, top_k=3) for where in (index, corpus))
    assert [(h.corpus_id, h.text) for h in hits] == [(h.corpus_id, h.text) for h in expected]
    np.testing.assert_allclose([h.score for h in hits], [h.score for h in expected], atol=1e-5)


def test_build_index_and_the_index_command_index_the_same_entries(tiny_bert, tiny_encoder, tmp_path, capsys):
    """Blank strings (empty, spaces, a tab) are skipped by both, one rule (`is_entry`); the others keep their
    place in the corpus as their ids, in Python, in the command's folder and in a folder Python saved."""
    from mirrorbert.cli.app import main

    lines = ["the cat sat on the mat", "", "a dog ran in the park", "   ", "\t", "rain is expected tomorrow", ""]
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["index", "--model", str(tiny_bert), "--corpus", str(corpus_file), "--output", str(tmp_path / "cli"),
                 "--pooling", "mean", "--no-progress"]) == 0
    capsys.readouterr()
    built = S.build_index(tiny_encoder, lines, use_faiss=False)
    indexes = [built, S.SearchIndex.load(tmp_path / "cli", use_faiss=False),
               S.SearchIndex.load(built.save(tmp_path / "api"), use_faiss=False)]
    entries = [text for text in lines if text.strip()]
    for index in indexes:
        assert len(index) == 3 and list(index.texts) == entries and list(index.ids) == [0, 2, 5]
    found = [[(h.corpus_id, h.text) for h in S.search(tiny_encoder, "a cat", index, top_k=3)] for index in indexes]
    assert found[0] == found[1] == found[2] and {i for i, _ in found[0]} == {0, 2, 5}
    assert [(h.corpus_id, h.text) for h in S.search(tiny_encoder, "a cat", lines, top_k=3)] == found[0]
    with pytest.raises(UserError, match="corpus: no entries"):
        S.build_index(tiny_encoder, ["", "  "])


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
    expected = S.search(tiny_encoder, queries[0], corpus, top_k=3)
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
        (lambda d: ["--corpus", str(d / "corpus.txt"), "--query", "x", "--top-k", "0"], "--top-k 0: must be an integer >= 1"),
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
