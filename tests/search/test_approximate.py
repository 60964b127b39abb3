"""The approximate (IVF) index: recall against exact search, exact scores for what it returns, the manifest
that records it, `search --index` over it end to end, and tampered IVF parts refused in one line."""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import numpy as np
import pytest

from support import cli_hits as hits
from support import run_cli as run

faiss = pytest.importorskip("faiss")

from mirrorbert.search.approximate import (AUTO_IVF_ROWS, IVFIndex, default_nlist, default_nprobe,  # noqa: E402
                                           resolve_index_type)
from mirrorbert.search.exact import SearchIndex, chunked_topk, l2_normalize  # noqa: E402
from mirrorbert.search.ranking import pair_scores  # noqa: E402

CORPUS = (b"the cat sat on the mat\n\na dog ran in the park\nthe bank raised interest rates again\n"
          b"heart attack and myocardial infarction\nthe stock market fell sharply today\n"
          b"rain is expected tomorrow in the north\n")
QUERIES = ["the bank", "a cat on a mat", "weather tomorrow"]


def clustered(n: int, dim: int, seed: int, centers: np.ndarray) -> np.ndarray:
    """Unit vectors around seeded centres (the benchmark's generator, small)."""
    rng = np.random.default_rng(seed)
    x = centers[rng.integers(0, len(centers), n)] + rng.standard_normal((n, dim)).astype(np.float32) * 0.1
    return l2_normalize(x)


@pytest.fixture(scope="module")
def data():
    dim = 32
    centers = l2_normalize(np.random.default_rng(0).standard_normal((40, dim)).astype(np.float32))
    return clustered(4000, dim, 1, centers), clustered(200, dim, 2, centers)


def recall_at_10(found: np.ndarray, truth: np.ndarray) -> float:
    """Share of the exact top-10 ids found (sets: no dependence on the order of tied scores)."""
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))


def test_ivf_recall_at_10_against_exact_search_at_the_defaults(data):
    keys, queries = data
    _, truth = chunked_topk(queries, keys, 10, use_faiss=False)
    ivf = IVFIndex.build(keys)
    assert ivf.parts.nlist == default_nlist(len(keys)) and ivf.parts.nprobe == default_nprobe(ivf.parts.nlist)
    scores, ids = ivf.topk(queries, keys, 10)
    assert recall_at_10(ids, truth) >= 0.95
    # every returned score is the exact (float64) cosine of the returned id, best first
    assert np.array_equal(scores, pair_scores(queries, keys[ids]).astype(np.float32))
    assert (np.diff(scores, axis=1) <= 0).all()
    # too few lists scanned still answers, with exact scores (only recall suffers)
    s1, i1 = ivf.topk(queries, keys, 10, nprobe=1)
    valid = i1 >= 0
    assert np.array_equal(s1[valid], pair_scores(queries, keys[np.where(valid, i1, 0)]).astype(np.float32)[valid])


def test_the_ivf_index_rebuilt_from_its_parts_is_the_one_built(data):
    from mirrorbert.search.approximate import ivf_from_parts

    keys, queries = data
    built = IVFIndex.build(keys, seed=3)
    rebuilt = IVFIndex(ivf_from_parts(keys, built.parts), built.parts)
    assert all(np.array_equal(a, b) for a, b in zip(built.topk(queries, keys, 10), rebuilt.topk(queries, keys, 10)))


def test_search_index_takes_an_approximate_index_and_false_means_an_exact_scan(data):
    keys, queries = data
    index = SearchIndex.from_vectors(keys, [str(i) for i in range(len(keys))], index_type="ivf")
    assert index.approximate is not None and index.faiss_index is None
    approx = index.search_vectors(queries, 10)
    exact = index.search_vectors(queries, 10, use_faiss=False)
    truth = SearchIndex.from_vectors(keys, use_faiss=False).search_vectors(queries, 10)
    assert [[h.corpus_id for h in row] for row in exact] == [[h.corpus_id for h in row] for row in truth]
    assert recall_at_10([[h.corpus_id for h in r] for r in approx], [[h.corpus_id for h in r] for r in truth]) >= 0.95
    assert SearchIndex.from_vectors(keys, index_type="auto").approximate is None  # below the threshold


def test_the_auto_rule_and_the_defaults():
    assert resolve_index_type("auto", AUTO_IVF_ROWS - 1, True) == "exact"
    assert resolve_index_type("auto", AUTO_IVF_ROWS, True) == "ivf"
    assert resolve_index_type("auto", 10 * AUTO_IVF_ROWS, False) == "exact"  # no faiss: an exact scan
    assert resolve_index_type("exact", 10 * AUTO_IVF_ROWS, True) == "exact"
    assert default_nlist(1_000_000) == 4000 and default_nlist(6) == 1 and default_nlist(2000) == 2000 // 40
    # 4 x sqrt(nlist) (real sentence vectors, benchmarks/ivf_recall.py): every list up to 16, never more than nlist
    assert default_nprobe(4000) == 253 and default_nprobe(665) == 103 and default_nprobe(100) == 40
    assert default_nprobe(16) == 16 and default_nprobe(17) == 16 and default_nprobe(10) == 10
    assert default_nprobe(1) == 1


def test_nprobe_is_set_per_search_and_refused_where_no_lists_are_scanned(data):
    from mirrorbert.errors import UserError
    from mirrorbert.search.exact import search

    keys, queries = data
    index = SearchIndex.from_vectors(keys, index_type="ivf")
    nlist = index.approximate.parts.nlist
    ids = lambda hits: [[h.corpus_id for h in row] for row in hits]  # noqa: E731
    truth = ids(index.search_vectors(queries, 10, use_faiss=False))
    default = ids(index.search_vectors(queries, 10))
    one, every = ids(index.search_vectors(queries, 10, nprobe=1)), ids(index.search_vectors(queries, 10, nprobe=nlist))
    assert recall_at_10(every, truth) == 1.0 > recall_at_10(one, truth)  # every list scanned: exact hits
    assert ids(index.search_vectors(queries, 10)) == default  # nothing sticks: the index's own nprobe again
    bad = {0: "must be an integer >= 1", -2: "must be an integer >= 1", 2.5: "must be an integer >= 1",
           True: "must be an integer >= 1", "3": "must be an integer >= 1", nlist + 1: f"has {nlist} lists"}
    for nprobe, message in bad.items():
        with pytest.raises(UserError, match=message):
            index.search_vectors(queries, 10, nprobe=nprobe)
    with pytest.raises(UserError, match="use_faiss=False"):
        index.search_vectors(queries, 10, nprobe=2, use_faiss=False)
    with pytest.raises(UserError, match="quantize='int8'"):
        index.search_vectors(queries, 10, nprobe=2, quantize="int8")
    with pytest.raises(UserError, match="is exact"):
        SearchIndex.from_vectors(keys).search_vectors(queries, 10, nprobe=2)
    with pytest.raises(UserError, match="is exact"):  # a corpus of strings: refused before anything is encoded
        search(None, ["a query"], ["a corpus string"], nprobe=2)


# ----------------------------------------------------------------------------- the command line
@pytest.fixture
def ivf_index(capsys, tiny_bert, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(CORPUS)
    index = tmp_path / "built"
    code, out, err = run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", index,
                                  "--index-type", "ivf", "--no-progress"])
    assert code == 0, err
    assert json.loads(out)["index_type"] == "ivf"
    return index, corpus


def test_index_type_ivf_end_to_end_gives_the_hits_of_search_over_the_corpus(capsys, tiny_bert, ivf_index):
    index, corpus = ivf_index
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "mirrorbert-index/2" and manifest["index_type"] == "ivf"
    assert manifest["ivf"] == {"nlist": 1, "nprobe": 1, "codes": "sq8", "metric": "inner_product", "seed": 0}
    assert set(manifest["files"]) == {"vectors.npy", "texts.jsonl", "ids.npy", "ivf_centroids.npy", "ivf_sq.npy",
                                      "ivf_lists.npy"}
    assert not (index / "faiss.index").exists()
    queries = [a for q in QUERIES for a in ("--query", q)]
    common = ["--model", tiny_bert, "--top-k", "4", "--no-progress", *queries]
    code_a, from_index, _ = run(capsys, ["search", "--index", index, *common])
    code_b, exact_scan, _ = run(capsys, ["search", "--index", index, "--faiss", "no", *common])
    code_c, from_corpus, _ = run(capsys, ["search", "--corpus", corpus, *common])
    assert code_a == code_b == code_c == 0
    # one list holds every row here: the candidates are the whole corpus, so the hits are exact
    assert hits(from_index) == hits(exact_scan) == hits(from_corpus)


def test_nprobe_is_refused_for_an_exact_index(capsys, tiny_bert, tmp_path):
    code, _, err = run(capsys, ["index", "--model", tiny_bert, "--corpus", tmp_path / "x.txt", "--output",
                                tmp_path / "i", "--index-type", "exact", "--nprobe", "4"])
    assert code == 2 and "--nprobe" in err and err.count("mirrorbert: error:") == 1


@pytest.fixture
def two_list_index(capsys, tiny_bert, tmp_path):
    """An IVF index of 100 lines: 2 lists (at least 40 training rows each), both scanned by default."""
    corpus = tmp_path / "corpus.txt"
    topics = ["the weather", "a football match", "the stock market", "a new film", "the heart"]
    corpus.write_text("".join(f"line {i} is about {topics[i % 5]} and {i * 7 % 13} more\n" for i in range(100)),
                      encoding="utf-8")
    index = tmp_path / "built"
    code, out, err = run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", index,
                                  "--index-type", "ivf", "--no-progress"])
    assert code == 0, err
    assert {k: json.loads(out)[k] for k in ("nlist", "nprobe")} == {"nlist": 2, "nprobe": 2}
    return index


def test_search_nprobe_sets_the_lists_scanned_at_query_time(capsys, tiny_bert, two_list_index):
    common = ["search", "--index", two_list_index, "--model", tiny_bert, "--top-k", "5", "--no-progress",
              "--query", "the weather today", "--query", "stock prices"]
    code_a, exact_scan, _ = run(capsys, [*common, "--faiss", "no"])
    code_b, both_lists, _ = run(capsys, [*common, "--nprobe", "2"])
    code_c, one_list, err = run(capsys, [*common, "--nprobe", "1"])
    assert code_a == code_b == code_c == 0, err
    assert hits(both_lists) == hits(exact_scan)  # every list scanned: the exact hits
    assert all(len(row) == 5 for row in hits(one_list))  # one list of ~50 rows: still 5 hits, exactly scored
    for hit in (h for row in hits(one_list) for h in row):
        assert hit in [h for row in hits(exact_scan) for h in row] or hit["score"] <= hits(exact_scan)[0][0]["score"]


@pytest.mark.parametrize("extra, message", [
    (["--nprobe", "3"], "has 2 lists; choose 1 to 2"),
    (["--nprobe", "0"], "--nprobe 0: must be an integer >= 1"),
    (["--nprobe", "1", "--faiss", "no"], "--nprobe with --faiss no"),
    (["--nprobe", "1", "--quantize", "int8"], "--nprobe with --quantize int8"),
])
def test_search_nprobe_refusals_are_one_line(capsys, tiny_bert, two_list_index, extra, message):
    code, out, err = run(capsys, ["search", "--index", two_list_index, "--model", tiny_bert, "--query", "x",
                                  "--no-progress", *extra])
    assert code == 2 and out == "" and err.count("mirrorbert: error:") == 1 and message in err, err


def test_search_nprobe_needs_an_approximate_index(capsys, tiny_bert, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(CORPUS)
    index = tmp_path / "exact"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", index, "--index-type",
                        "exact", "--no-progress"])[0] == 0
    from mirrorbert.encoder.model import Encoder

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --nprobe was checked")

    monkeypatch.setattr(Encoder, "load", no_model)
    code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x", "--nprobe", "4"])
    assert code == 2 and err.count("mirrorbert: error:") == 1 and f"--index {index} is exact" in err, err
    code, _, err = run(capsys, ["search", "--corpus", corpus, "--model", tiny_bert, "--query", "x", "--nprobe", "4"])
    assert code == 2 and "--nprobe applies to an approximate --index" in err, err


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _edit(index, name=None, content=None, rehash=True, **manifest_changes):
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    if name is not None:
        (index / name).write_bytes(content)
        if rehash:
            manifest["files"][name] = hashlib.sha256(content).hexdigest()
    manifest.update(manifest_changes)
    (index / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def test_tampered_ivf_parts_are_refused_in_one_line_naming_the_file(capsys, tiny_bert, ivf_index, tmp_path):
    built, _ = ivf_index
    centroids = np.load(built / "ivf_centroids.npy")
    sq = np.load(built / "ivf_sq.npy")
    lists = np.load(built / "ivf_lists.npy")
    ivf = json.loads((built / "manifest.json").read_text(encoding="utf-8"))["ivf"]
    cases = [  # (file or manifest field, edit, what the error line says)
        ("ivf_lists.npy", dict(name="ivf_lists.npy", content=_npy(lists + 5)), "not a list number"),
        ("ivf_lists.npy", dict(name="ivf_lists.npy", content=_npy(lists.astype(np.int64))), "dtype int64"),
        ("ivf_centroids.npy", dict(name="ivf_centroids.npy", content=_npy(centroids * np.nan)), "not finite"),
        ("ivf_centroids.npy", dict(name="ivf_centroids.npy", content=_npy(np.vstack([centroids] * 2))), "shape"),
        ("ivf_sq.npy", dict(name="ivf_sq.npy", content=_npy(sq[:-1])), "shape"),
        ("ivf_sq.npy", dict(name="ivf_sq.npy", content=_npy(sq + 1), rehash=False), "SHA-256"),
        ("manifest.json", dict(index_type="hnsw"), "index_type"),
        ("manifest.json", dict(ivf={**ivf, "nprobe": 2}), "ivf"),
        ("manifest.json", dict(ivf={**ivf, "metric": "l2"}), "ivf"),
        ("manifest.json", dict(ivf={**ivf, "nlist": 10**6}), "nlist"),
        ("manifest.json", dict(ivf=None), "ivf"),
        ("manifest.json", dict(format="mirrorbert-index/1"), "format"),
    ]
    for name, edit, message in cases:
        index = tmp_path / "index"
        shutil.rmtree(index, ignore_errors=True)
        shutil.copytree(built, index)
        _edit(index, **edit)
        code, out, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x",
                                      "--no-progress"])
        assert code == 2 and out == "" and err.count("mirrorbert: error:") == 1, (name, message, err)
        assert name in err and message in err, (name, message, err)
    index = tmp_path / "dropped"
    shutil.copytree(built, index)
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    del manifest["files"]["ivf_lists.npy"]
    (index / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x", "--no-progress"])
    assert code == 2 and "no checksum for ivf_lists.npy" in err
