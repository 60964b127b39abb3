"""`mirrorbert index` + `search --index`: the same hits as `search --corpus`, refused for another model or a
changed corpus, written under the write policy."""

from __future__ import annotations

import json
import shutil

import pytest

from support import cli_hits as hits
from support import index_as_format_1
from support import run_cli as run

CORPUS = (b"the cat sat on the mat\n\na dog ran in the park\n\xff\xfe broken line\n"
          b"the bank raised interest rates again\nheart attack and myocardial infarction\n"
          b"the stock market fell sharply today\nrain is expected tomorrow in the north\n")
QUERIES = ["the bank", "a cat on a mat", "weather tomorrow"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(CORPUS)
    return path


@pytest.mark.parametrize("faiss", ["yes", "no"])
def test_search_from_an_index_gives_the_hits_of_search_over_the_corpus(capsys, tiny_bert, corpus, tmp_path, faiss):
    if faiss == "yes":
        pytest.importorskip("faiss")
    index = tmp_path / "index"
    code, out, _ = run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", index,
                                "--skip-bad-lines", "--no-progress"])
    assert code == 0 and json.loads(out)["rows"] == 6
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["corpus_lines"] == 8 and manifest["pooling"] == "mean" and len(manifest["model_sha256"]) == 64
    queries = [a for q in QUERIES for a in ("--query", q)]
    common = ["--model", tiny_bert, "--top-k", "4", "--faiss", faiss, "--no-progress", *queries]
    code_a, from_index, _ = run(capsys, ["search", "--index", index, *common])
    code_b, from_corpus, _ = run(capsys, ["search", "--corpus", corpus, "--skip-bad-lines", *common])
    assert code_a == code_b == 0
    assert hits(from_index) == hits(from_corpus)
    ids = {h["id"] for row in hits(from_index) for h in row}
    assert ids <= {0, 2, 4, 5, 6, 7}  # line numbers: the blank line 1 and the bad line 3 are never hits


def test_an_index_of_another_model_or_a_changed_corpus_is_refused_in_one_line(capsys, tiny_bert, tiny_roberta, corpus,
                                                                               tmp_path):
    index = tmp_path / "index"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", index, "--skip-bad-lines",
                        "--no-progress"])[0] == 0
    code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_roberta, "--query", "x"])
    assert code == 2 and "built by another model" in err and err.count("mirrorbert: error:") == 1
    copy = tmp_path / "same-model-copy"  # the same files elsewhere are the same model
    shutil.copytree(tiny_bert, copy)
    assert run(capsys, ["search", "--index", index, "--model", copy, "--query", "x", "--no-progress"])[0] == 0
    corpus.write_bytes(CORPUS + b"one more line\n")
    code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x"])
    assert code == 2 and "changed since the index was built" in err and str(corpus) in err
    other = tmp_path / "other.txt"
    other.write_text("something else\nand more\n", encoding="utf-8")
    code, _, err = run(capsys, ["search", "--index", index, "--corpus", other, "--model", tiny_bert, "--query", "x"])
    assert code == 2 and "changed since the index was built" in err
    code, _, err = run(capsys, ["search", "--index", tmp_path, "--model", tiny_bert, "--query", "x"])
    assert code == 2 and "not a mirrorbert index" in err
    (index / "manifest.json").write_text("{oops", encoding="utf-8")
    code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x"])
    assert code == 2 and "manifest.json: damaged" in err


def test_index_output_follows_the_write_policy(capsys, tiny_bert, corpus, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me\n", encoding="utf-8")
    argv = ["index", "--model", tiny_bert, "--corpus", corpus, "--skip-bad-lines", "--no-progress"]
    code, _, err = run(capsys, argv + ["--output", theirs, "--overwrite"])
    assert code == 2 and (theirs / "notes.txt").read_text(encoding="utf-8") == "keep me\n"
    ours = tmp_path / "ours"
    assert run(capsys, argv + ["--output", ours])[0] == 0
    code, _, err = run(capsys, argv + ["--output", ours])
    assert code == 2 and "--overwrite" in err
    assert run(capsys, argv + ["--output", ours, "--overwrite"])[0] == 0


def _rehash(index, name):
    import hashlib

    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"][name] = hashlib.sha256((index / name).read_bytes()).hexdigest()
    (index / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return manifest


def test_every_index_file_is_checked_against_the_manifest_before_use(capsys, tiny_bert, corpus, tmp_path):
    import io
    import os

    import numpy as np

    built = tmp_path / "built"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", built, "--skip-bad-lines",
                        "--no-progress"])[0] == 0
    manifest = json.loads((built / "manifest.json").read_text(encoding="utf-8"))
    assert set(manifest["files"]) >= {"vectors.npy", "texts.jsonl", "ids.npy"}
    assert manifest["format"] == "mirrorbert-index/2" and manifest["index_type"] == "exact"
    assert manifest["corpus_bytes"] == corpus.stat().st_size
    rows, dim = manifest["rows"], manifest["dim"]
    vectors = np.load(built / "vectors.npy", allow_pickle=False)

    def npy(array):
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=True)
        return buffer.getvalue()

    ids = np.load(built / "ids.npy", allow_pickle=False)
    tampered = [  # (file, new bytes, re-hash in the manifest, what the one error line says); ids.json: a /1 index
        ("ids.npy", npy(ids[::-1].copy()), True, "not after the one before it"),
        ("ids.npy", npy(ids + 1000), True, "not a line number"),
        ("ids.npy", npy(ids[:-1]), True, "shape"),
        ("ids.npy", npy(ids.astype(np.float64)), True, "dtype float64"),
        ("ids.npy", npy(np.array([object()] * rows, dtype=object)), True, "dtype object"),
        ("ids.npy", npy(ids)[:-8], True, "bytes of data"),
        ("ids.npy", npy(ids) + b" ", False, "SHA-256"),
        ("ids.json", json.dumps(["../../etc/passwd"] * rows).encode(), True, "not a line number"),
        ("ids.json", json.dumps([[1]] * rows).encode(), True, "not a line number"),
        ("ids.json", json.dumps(list(range(rows - 1))).encode(), True, f"{rows - 1} ids"),
        ("ids.json", b"[" * 100000 + b"]" * 100000, True, "ids.json"),
        ("ids.json", json.dumps(list(range(rows))).encode() + b" ", False, "SHA-256"),
        ("vectors.npy", npy(vectors[:, :-1]), True, "shape"),
        ("vectors.npy", npy(vectors.astype(np.float64)), True, "dtype float64"),
        ("vectors.npy", npy(np.array([object()] * rows, dtype=object)), True, "dtype object"),
        ("vectors.npy", npy(np.full_like(vectors, np.nan)), True, "not finite"),
        ("vectors.npy", npy(vectors)[:-8], True, "bytes of data"),
        ("texts.jsonl", b"[1]\n" * rows, True, "expected a JSON string"),
    ]
    for name, content, rehash, message in tampered:
        index = tmp_path / "index"
        shutil.rmtree(index, ignore_errors=True)
        shutil.copytree(built, index)
        if name == "ids.json":
            index_as_format_1(index)
        (index / name).write_bytes(content)
        if rehash:
            _rehash(index, name)
        code, out, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x",
                                      "--no-progress"])
        assert code == 2 and out == "" and err.count("mirrorbert: error:") == 1, (name, message, err)
        assert name in err and message in err, (name, message, err)
    assert dim == vectors.shape[1]

    for corpus_path in ("/dev/zero", str(tmp_path / "fifo")):  # would be read forever: refused at once
        index = tmp_path / "index"
        shutil.rmtree(index, ignore_errors=True)
        shutil.copytree(built, index)
        if corpus_path.endswith("fifo"):
            os.mkfifo(corpus_path)
        data = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
        data["corpus"] = corpus_path
        (index / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
        code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x"])
        assert code == 2 and corpus_path in err and "expected a regular file" in err

    data = json.loads((built / "manifest.json").read_text(encoding="utf-8"))
    data["rows"] = str(rows)
    (index / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    code, _, err = run(capsys, ["search", "--index", index, "--model", tiny_bert, "--query", "x"])
    assert code == 2 and "field 'rows'" in err


def test_query_vectors_must_be_finite_and_of_the_index_dimension():
    import numpy as np

    from mirrorbert.errors import UserError
    from mirrorbert.search.exact import SearchIndex

    index = SearchIndex.from_vectors(np.eye(3, 4, dtype=np.float32), ["a", "b", "c"], use_faiss=False)
    assert [h.corpus_id for h in index.search_vectors(np.eye(1, 4), 1)[0]] == [0]
    for bad, fragment in ((np.full((1, 4), np.nan), "not finite"), ([[1.0, 2.0]], "dimension 2"),
                          ("text", "a string"), ([["a", "b", "c", "d"]], "numbers")):
        with pytest.raises(UserError, match=fragment):
            index.search_vectors(bad, 1)


def test_an_index_s_texts_are_read_when_a_hit_needs_them_not_held(capsys, tiny_bert, tmp_path):
    from pathlib import Path

    from mirrorbert.search.index_store import StoredTexts, check_index, load_index

    lines = ["plain", 'quotes " and \\ back', "naïve café — ünïcode", "tab\there", "last"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folder = tmp_path / "index"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", folder, "--no-progress"])[0] == 0
    index, ids = load_index(folder, check_index(Path(folder), str(tiny_bert)), use_faiss=False)
    assert isinstance(index.texts, StoredTexts) and len(index.texts) == len(lines)
    assert list(index.texts) == lines and index.texts[-1] == "last" and index.texts[1:3] == lines[1:3]
    with pytest.raises(IndexError):
        index.texts[len(lines)]
    hit = index.search_vectors(index.vectors[2:3], 1)[0][0]
    assert (hit.corpus_id, hit.text) == (2, lines[2])
    index.texts.close()
