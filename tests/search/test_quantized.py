"""Quantised embeddings (issue 19, part 3): int8/binary vectors from `encode`, and search over uint8 or binary
corpus vectors with rescoring, checked against independent formulas and exact search."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("faiss")

from mirrorbert.cli.app import main  # noqa: E402
from mirrorbert.errors import UserError  # noqa: E402
from mirrorbert.search.quantized import quantize, quantized_topk  # noqa: E402
from mirrorbert.search.exact import SearchIndex, cosine_topk, l2_normalize  # noqa: E402


@pytest.fixture(scope="module")
def clustered():
    """200 unit vectors and, per vector, a query that is a small perturbation of it (its true nearest)."""
    rng = np.random.default_rng(0)
    corpus = l2_normalize(rng.standard_normal((200, 64)).astype(np.float32))
    queries = l2_normalize(corpus + 0.05 * rng.standard_normal(corpus.shape).astype(np.float32))
    return corpus, queries


def test_quantisers_match_their_definitions(clustered):
    corpus, _ = clustered
    packed = quantize(corpus, "ubinary")
    np.testing.assert_array_equal(packed, np.packbits(corpus > 0, axis=-1))  # sign bits, 8 per byte
    np.testing.assert_array_equal(quantize(corpus, "binary"), (packed.astype(np.int16) - 128).astype(np.int8))
    int8 = quantize(corpus, "int8")
    assert int8.dtype == np.int8 and int8.shape == corpus.shape
    low, high = corpus.min(axis=0), corpus.max(axis=0)  # ranges from the vectors themselves
    expected = ((corpus - low) / ((high - low) / 255) - 128).astype(np.int8)
    assert np.abs(int8.astype(int) - expected.astype(int)).max() <= 1
    with pytest.raises(UserError, match="--quantize"):
        quantize(corpus, "int4")


@pytest.mark.parametrize("precision, least", [("int8", 0.9), ("ubinary", 0.4)])
def test_quantised_search_finds_what_exact_search_finds(clustered, precision, least):
    corpus, queries = clustered
    _, exact = cosine_topk(queries, corpus, 10)
    scores, ids = quantized_topk(queries, corpus, precision, 10, cache={})
    assert ids.shape == exact.shape and (np.diff(scores, axis=1) <= 1e-9).all()  # best first
    assert (ids[:, 0] == np.arange(len(corpus))).mean() >= 0.95  # each query's own source is found first
    recall = np.mean([len(set(r.tolist()) & set(a.tolist())) / len(r) for r, a in zip(exact, ids)])
    assert recall >= least


def test_index_caches_the_quantised_corpus(clustered):
    corpus, queries = clustered
    index = SearchIndex.from_vectors(corpus, [str(i) for i in range(len(corpus))], use_faiss=False)
    first = index.search_vectors(queries[:5], 3, quantize="int8")
    assert ("index", "int8") in index.quantized_cache
    assert index.search_vectors(queries[:5], 3, quantize="int8") == first
    assert [h.text for h in first[0]][0] == "0"


def test_cli_encode_and_search_quantised(tiny_bert, corpus, tmp_path, capsys):
    data = tmp_path / "c.txt"
    data.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    base = ["encode", "--model", str(tiny_bert), "--input", str(data)]
    assert main([*base, "--output", str(tmp_path / "f.npy")]) == 0
    assert main([*base, "--output", str(tmp_path / "b.npy"), "--quantize", "ubinary"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["dtype"] == "uint8" and record["dim"] == 32
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.packbits(np.load(tmp_path / "f.npy") > 0, axis=-1))
    assert main(["search", "--model", str(tiny_bert), "--corpus", str(data), "--query", corpus[2], "--top-k", "3",
                 "--quantize", "int8"]) == 0
    hits = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["hits"]
    assert hits[0]["id"] == 2 and len(hits) == 3
    assert main(["search", "--model", str(tiny_bert), "--corpus", str(data), "--query", "x", "--quantize", "uint8"]) == 2
    assert "--quantize uint8: not one of float32, int8, ubinary" in capsys.readouterr().err


def test_wide_vectors_take_the_integer_path():
    """Beyond 1023 dimensions float32 no longer holds the integer sums exactly: the int64 path answers."""
    rng = np.random.default_rng(1)
    corpus = l2_normalize(rng.standard_normal((50, 1100)).astype(np.float32))
    queries = l2_normalize(corpus + 0.05 * rng.standard_normal(corpus.shape).astype(np.float32))
    _, ids = quantized_topk(queries, corpus, "int8", 5, cache={})
    assert (ids[:, 0] == np.arange(50)).all()
