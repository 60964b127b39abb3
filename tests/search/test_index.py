"""`mirrorbert index` + `search --index`: the same hits as `search --corpus`, refused for another model or a
changed corpus, written under the write policy."""

from __future__ import annotations

import json
import shutil

import pytest

from support import cli_hits as hits
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
    assert code == 2 and err.count("mirrorbert: error:") == 1
    assert f"--corpus {other}: not the corpus --index {index} was built from, which is {corpus}" in err  # both named
    assert "changed since" not in err
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
    tampered = [  # (file, new bytes, re-hash in the manifest, what the one error line says)
        ("ids.npy", npy(ids[::-1].copy()), True, "not after the one before it"),
        ("ids.npy", npy(ids + 1000), True, "not a line number"),
        ("ids.npy", npy(ids[:-1]), True, "shape"),
        ("ids.npy", npy(ids.astype(np.float64)), True, "dtype float64"),
        ("ids.npy", npy(np.array([object()] * rows, dtype=object)), True, "dtype object"),
        ("ids.npy", npy(ids)[:-8], True, "bytes of data"),
        ("ids.npy", npy(ids) + b" ", False, "SHA-256"),
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

    from mirrorbert.search.exact import SearchIndex
    from mirrorbert.search.index_claims import check_index
    from mirrorbert.search.index_store import read_index
    from mirrorbert.search.index_files import StoredTexts

    lines = ["plain", 'quotes " and \\ back', "naïve café — ünïcode", "tab\there", "last"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folder = tmp_path / "index"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", folder, "--no-progress"])[0] == 0
    index = SearchIndex(**read_index(folder, check_index(Path(folder), str(tiny_bert)), use_faiss=False))
    assert isinstance(index.texts, StoredTexts) and len(index.texts) == len(lines)
    assert list(index.texts) == lines and index.texts[-1] == "last" and index.texts[1:3] == lines[1:3]
    with pytest.raises(IndexError):
        index.texts[len(lines)]
    hit = index.search_vectors(index.vectors[2:3], 1)[0][0]
    assert (hit.corpus_id, hit.text) == (2, lines[2])
    index.texts.close()


def test_search_index_without_model_uses_the_model_its_manifest_names(capsys, tiny_bert, tiny_roberta, corpus,
                                                                     tmp_path, monkeypatch):
    """--model may be left out: the manifest names the model (a local folder by its absolute path, so a search
    from another folder finds it), checked against the manifest's fingerprint as a --model is."""
    (tmp_path / "work").mkdir()
    shutil.copytree(tiny_bert, tmp_path / "work" / "models" / "tiny")
    monkeypatch.chdir(tmp_path / "work")
    assert run(capsys, ["index", "--model", "models/tiny", "--corpus", corpus, "--output", tmp_path / "index",
                        "--skip-bad-lines", "--no-progress"])[0] == 0
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["model"] == str((tmp_path / "work" / "models" / "tiny").resolve())
    monkeypatch.chdir(tmp_path)  # elsewhere: models/tiny is not here, the manifest's absolute path is
    queries = [a for q in QUERIES for a in ("--query", q)]
    search = ["search", "--index", tmp_path / "index", "--top-k", "3", "--no-progress", *queries]
    code, without, err = run(capsys, search)
    assert code == 0, err
    code, named, _ = run(capsys, search + ["--model", tiny_bert])
    assert code == 0 and hits(without) == hits(named) and len(hits(without)) == 3
    code, _, err = run(capsys, search + ["--model", tiny_roberta])  # --model stays checked
    assert code == 2 and "built by another model" in err and err.count("mirrorbert: error:") == 1
    # trust to run code is given to a model the user names, never to the one a folder names
    code, _, err = run(capsys, search + ["--trust-remote-code"])
    assert code == 2 and "--trust-remote-code with --index needs --model" in err
    # the named folder now holds another model: refused before any weight loads
    shutil.rmtree(tmp_path / "work" / "models" / "tiny")
    shutil.copytree(tiny_roberta, tmp_path / "work" / "models" / "tiny")
    code, _, err = run(capsys, search)
    assert code == 2 and "the model it names" in err and "changed since the index was built" in err
    # ... or nothing: one line saying so, and --model answers
    shutil.rmtree(tmp_path / "work" / "models")
    code, _, err = run(capsys, search)
    assert code == 2 and err.count("mirrorbert: error:") == 1
    assert "manifest.json names the model" in err and "no such folder" in err and "--model" in err
    assert run(capsys, search + ["--model", tiny_bert])[0] == 0
    code, _, err = run(capsys, ["search", "--corpus", corpus, "--query", "x"])  # without --index it is needed
    assert code == 2 and "--model is required to encode --corpus" in err


@pytest.mark.parametrize("name", ["runs/minilm-mirorr", "./minilm", "runs/a/b", "~/models/minilm", "minilm/",
                                  "my model"])
def test_a_path_like_model_that_is_not_there_is_no_such_folder(capsys, tiny_bert, tmp_path, monkeypatch, name):
    """Only `name` and `org/name` are Hub ids; a mistyped folder gets "no such folder", in every command and
    with or without --index (not "another model" or "the hub is unreachable")."""
    (tmp_path / "runs").mkdir()  # `runs/minilm-mirorr`: its first part is a local folder
    monkeypatch.chdir(tmp_path)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\na dog ran\nrain tomorrow\n", encoding="utf-8")
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", texts, "--output", "index", "--no-progress"])[0] == 0
    for argv in (["search", "--index", "index", "--query", "x"], ["search", "--corpus", texts, "--query", "x"],
                 ["encode", "--input", texts, "--output", "v.npy"],
                 ["train", "--data", texts, "--output", "out", "--no-progress"]):
        code, _, err = run(capsys, argv + ["--model", name])
        assert code == 2 and err.strip().splitlines()[-1] == f"mirrorbert: error: --model {name}: no such folder", \
            (argv, err)


@pytest.mark.parametrize("name", ["minilm-mirorr", "someone/minilm-mirorr"])
def test_a_hub_like_model_name_is_looked_up_on_the_hub(capsys, corpus, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # no folder `someone` here: `someone/x` reads as a Hub id
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, ["encode", "--model", name, "--input", corpus, "--output", "v.npy", "--skip-bad-lines"])
    assert code == 2 and f"--model {name}: not a local folder and the Hugging Face hub is unreachable" in err


def test_which_model_names_are_paths(tmp_path, monkeypatch):
    from mirrorbert.safeguards.preflight import looks_like_path

    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    for name in ("./m", "../m", "/abs/m", "~/m", ".m", "m/", "a/b/c", "runs/m", "a\\b", "my model", "m:1"):
        assert looks_like_path(name), name
    for name in ("bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2", "org/name", "m.v2_x"):
        assert not looks_like_path(name), name


@pytest.mark.parametrize("named", ["/dev/zero", "fifo", "file", "dangling-link"])
def test_a_manifest_naming_a_model_that_is_no_folder_is_refused_unopened(capsys, tiny_bert, tmp_path, monkeypatch,
                                                                          named):
    """Without --model the manifest names the model and its fingerprint alike; a stranger's manifest naming a
    device, a FIFO or a file (fingerprint `hub:<name>`, which it can also write) must not get it opened."""
    import os

    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\na dog ran\nrain tomorrow\n", encoding="utf-8")
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", texts, "--output", tmp_path / "index",
                        "--no-progress"])[0] == 0
    target = {"/dev/zero": "/dev/zero"}.get(named, str(tmp_path / named))
    if named == "fifo":
        os.mkfifo(target)
    elif named == "file":
        (tmp_path / "file").write_text("{}", encoding="utf-8")
    elif named == "dangling-link":
        os.symlink(tmp_path / "nowhere", target)
    manifest_path = tmp_path / "index" / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest.update(model=target, model_sha256=f"hub:{target}")
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    code, _, err = run(capsys, ["search", "--index", tmp_path / "index", "--query", "x"])
    assert code == 2 and err.count("mirrorbert: error:") == 1 and "manifest.json names the model" in err, err
    assert "not a folder" in err or "no such folder" in err
    assert target not in opened


@pytest.mark.parametrize("kind", ["fifo", "file"])
def test_a_model_that_is_a_file_is_refused_unread(capsys, tmp_path, monkeypatch, kind):
    """A model is a folder or a Hub id: a file (read as a config) or a FIFO (which would block) gets one line."""
    import os

    monkeypatch.chdir(tmp_path)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\na dog ran\n", encoding="utf-8")
    if kind == "fifo":
        os.mkfifo("model")
    else:
        (tmp_path / "model").write_text("{}", encoding="utf-8")
    for argv in (["encode", "--input", texts, "--output", "v.npy"], ["search", "--corpus", texts, "--query", "x"]):
        code, _, err = run(capsys, argv + ["--model", "model"])
        assert code == 2 and err.strip().splitlines()[-1] == ("mirrorbert: error: --model model: not a folder (a model "
                                                              "is a folder of config, tokenizer and weight files, or a "
                                                              "Hugging Face hub id)"), err
