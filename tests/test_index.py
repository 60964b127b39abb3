"""`mirrorbert index` + `search --index`: the same hits as `search --corpus`, refused for another model or a
changed corpus, written under the write policy."""

from __future__ import annotations

import json
import shutil

import pytest

from mirrorbert.cli import main

CORPUS = (b"the cat sat on the mat\n\na dog ran in the park\n\xff\xfe broken line\n"
          b"the bank raised interest rates again\nheart attack and myocardial infarction\n"
          b"the stock market fell sharply today\nrain is expected tomorrow in the north\n")
QUERIES = ["the bank", "a cat on a mat", "weather tomorrow"]


def run(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def hits(out: str):
    return [json.loads(line)["hits"] for line in out.splitlines()]


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
