"""An index folder from a stranger (issue 34): read only inside itself, checked against what it claims (the
corpus given, the loaded model), and nothing it holds reaches the terminal as control characters."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from support import run_cli as run

LINES = ["the cat sat on the mat", "", "a dog ran in the park", "the bank raised interest rates again",
         "heart attack and myocardial infarction", "the stock market fell sharply today",
         "rain is expected tomorrow in the north and the south and the east and the west of the country"]


@pytest.fixture(scope="module")
def built(tiny_bert, tmp_path_factory):
    """One index of the tiny model, copied by each test that damages it."""
    from mirrorbert.cli.app import main

    root = tmp_path_factory.mktemp("claims")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert main(["index", "--model", str(tiny_bert), "--corpus", str(corpus), "--output", str(root / "index"),
                 "--no-progress"]) == 0
    return root


@pytest.fixture
def index(built, tmp_path):
    shutil.copytree(built / "index", tmp_path / "index")
    shutil.copy(built / "corpus.txt", tmp_path / "corpus.txt")
    return tmp_path / "index"


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))


def _edit(folder: Path, **changes) -> None:
    data = {**_manifest(folder), **changes}
    (folder / "manifest.json").write_text(json.dumps(data), encoding="utf-8")


def _replace(folder: Path, name: str, content: bytes) -> None:
    """Replace a file of the index and its checksum in the manifest, as a tamperer who knows the format would."""
    (folder / name).write_bytes(content)
    files = _manifest(folder)["files"]
    _edit(folder, files={**files, name: hashlib.sha256(content).hexdigest()})


def _search(capsys, tiny_bert, folder, *extra):
    return run(capsys, ["search", "--index", folder, "--model", tiny_bert, "--query", "a cat", "--no-progress",
                        "--top-k", "3", *extra])


def _refused(result, *fragments):
    code, out, err = result
    errors = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert code == 2 and out == "" and len(errors) == 1, err
    assert all(f in errors[0] for f in fragments), errors[0]
    return errors[0]


# ----------------------------------------------------------------------------- confined reads
@pytest.mark.parametrize("name", ["vectors.npy", "texts.jsonl", "ids.npy", "faiss.index", "manifest.json"])
def test_a_file_of_the_index_linked_out_of_it_is_refused_though_its_bytes_match(capsys, tiny_bert, index, name):
    if name == "faiss.index" and not (index / name).exists():
        pytest.skip("faiss is not installed")
    outside = index.parent / f"outside-{name}"
    shutil.move(index / name, outside)
    os.symlink(outside, index / name)  # the same bytes: every checksum still matches
    _refused(_search(capsys, tiny_bert, index), f"{index / name}: leads out of the index folder (a link to")


@pytest.mark.parametrize("name", ["vectors.npy", "texts.jsonl", "ids.npy", "manifest.json"])
def test_a_fifo_in_the_index_is_refused_at_once(capsys, tiny_bert, index, name):
    (index / name).unlink()
    os.mkfifo(index / name)
    started = time.monotonic()
    _refused(_search(capsys, tiny_bert, index), f"{index / name}: is a FIFO")
    assert time.monotonic() - started < 20


def test_a_link_inside_the_index_is_followed(capsys, tiny_bert, index):
    shutil.move(index / "texts.jsonl", index / "texts-copy.jsonl")
    os.symlink("texts-copy.jsonl", index / "texts.jsonl")
    assert _search(capsys, tiny_bert, index)[0] == 0


def test_the_python_api_load_is_confined_too(tmp_path):
    from mirrorbert.errors import UserError
    from mirrorbert.search.exact import SearchIndex

    folder = tmp_path / "saved"
    SearchIndex.from_vectors(np.eye(3, 4, dtype=np.float32), ["a", "b", "c"], use_faiss=False).save(folder)
    shutil.move(folder / "vectors.npy", tmp_path / "vectors.npy")
    os.symlink(tmp_path / "vectors.npy", folder / "vectors.npy")
    with pytest.raises(UserError, match="leads out of the index folder"):
        SearchIndex.load(folder, use_faiss=False)


def test_a_model_folder_with_a_link_leading_out_is_refused_before_hashing(capsys, tiny_bert, index, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    (tmp_path / "secret.json").write_text("{}", encoding="utf-8")
    os.symlink(tmp_path / "secret.json", model / "extra.json")
    _refused(_search(capsys, model, index), "--model", "extra.json", "leads out of the model folder")


def test_the_model_fingerprint_is_the_one_earlier_versions_recorded(tiny_bert, tmp_path):
    """The confined walk hashes what `sorted(rglob)` hashed: indexes built before still match their model."""
    from mirrorbert.safeguards.readback import file_sha256
    from mirrorbert.search.fingerprints import IGNORED_MODEL_FILES, MODEL_FILE_SUFFIXES, model_fingerprint

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    (model / "sub").mkdir()
    (model / "sub" / "a.json").write_text("{}", encoding="utf-8")
    (model / "sub.json").write_text("[]", encoding="utf-8")
    os.symlink("config.json", model / "linked.json")
    digest = hashlib.sha256()
    for path in sorted(p for p in model.rglob("*") if p.is_file()):
        rel = path.relative_to(model).as_posix()
        if path.name in IGNORED_MODEL_FILES or path.suffix not in MODEL_FILE_SUFFIXES or rel.startswith("."):
            continue
        digest.update(rel.encode("utf-8") + b"\0" + file_sha256(path).encode("ascii") + b"\n")
    assert model_fingerprint(str(model)) == digest.hexdigest()


# ----------------------------------------------------------------------------- checked against what it claims
@pytest.mark.parametrize("changes, fragments", [
    ({"pooling": "cls"}, ("vectors.npy row", "not what --model makes of its text", "pooling 'cls'")),
    ({"max_length": 4}, ("vectors.npy row", "max_length 4")),
    ({"max_length": 3}, ("vectors.npy row", "max_length 3")),
    ({"max_length": 100000}, ("manifest.json: max_length 100000", "takes at most")),
    ({"pooling": "max"}, ("manifest.json: damaged", "'pooling'")),
    ({"normalized": False}, ("manifest.json: damaged", "'normalized'")),
    ({"model_sha256": "0" * 64}, ("built by another model",)),
    ({"model": "evil\x1b]0;owned\x07"}, ("manifest.json: damaged", "'model'")),
])
def test_manifest_fields_that_change_results_are_checked_against_the_model(capsys, tiny_bert, index, changes,
                                                                            fragments):
    _edit(index, **changes)
    line = _refused(_search(capsys, tiny_bert, index), *fragments)
    assert "\x1b" not in line


def test_pooling_or_max_length_given_with_an_index_must_be_its_own(capsys, tiny_bert, index):
    _refused(_search(capsys, tiny_bert, index, "--pooling", "cls"), "--pooling cls", "pooling 'mean'")
    _refused(_search(capsys, tiny_bert, index, "--max-length", "8"), "--max-length 8", "max_length 64")
    assert _search(capsys, tiny_bert, index, "--pooling", "mean", "--max-length", "64")[0] == 0


def test_vectors_not_of_unit_length_are_refused(capsys, tiny_bert, index):
    _replace(index, "vectors.npy", _npy(np.load(index / "vectors.npy") * np.float32(3)))
    _refused(_search(capsys, tiny_bert, index), "vectors.npy: damaged", "not 1")


def _npy(array) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_with_the_corpus_the_texts_are_the_corpus_s(capsys, tiny_bert, index):
    corpus = index.parent / "corpus.txt"
    texts = (index / "texts.jsonl").read_bytes().splitlines(keepends=True)
    _replace(index, "texts.jsonl", texts[1] + texts[0] + b"".join(texts[2:]))
    _refused(_search(capsys, tiny_bert, index, "--corpus", corpus), "texts.jsonl:1", "not the text of record 0")
    # without it, the spot check finds the stored vectors are not the model's for the swapped texts
    _refused(_search(capsys, tiny_bert, index), "vectors.npy row 0", "not what --model makes of its text")


def test_with_the_corpus_the_ids_are_the_corpus_s(capsys, tiny_bert, index):
    ids = np.load(index / "ids.npy")
    _replace(index, "ids.npy", _npy(np.where(ids == 2, 1, ids)))  # row 1 claims the blank line: in range, increasing
    assert _search(capsys, tiny_bert, index)[0] == 0
    _refused(_search(capsys, tiny_bert, index, "--corpus", index.parent / "corpus.txt"), "ids.npy",
             "entry 1 is 1", "its record 2")


def test_with_the_corpus_an_index_of_fewer_rows_is_refused(capsys, tiny_bert, index):
    rows = _manifest(index)["rows"]
    _replace(index, "vectors.npy", _npy(np.load(index / "vectors.npy")[:-1]))
    _replace(index, "ids.npy", _npy(np.load(index / "ids.npy")[:-1]))
    _replace(index, "texts.jsonl", b"".join((index / "texts.jsonl").read_bytes().splitlines(keepends=True)[:-1]))
    (index / "faiss.index").unlink(missing_ok=True)
    _edit(index, rows=rows - 1, faiss=False)
    assert _search(capsys, tiny_bert, index)[0] == 0
    _refused(_search(capsys, tiny_bert, index, "--corpus", index.parent / "corpus.txt"), "--corpus",
             f"more entries than the {rows - 1} rows")


def test_with_the_corpus_hits_match_a_corpus_search(capsys, tiny_bert, index):
    corpus = index.parent / "corpus.txt"
    code, from_index, _ = _search(capsys, tiny_bert, index, "--corpus", corpus)
    code_b, from_corpus, _ = run(capsys, ["search", "--corpus", corpus, "--model", tiny_bert, "--query", "a cat",
                                          "--no-progress", "--top-k", "3"])
    assert code == code_b == 0 and json.loads(from_index) == json.loads(from_corpus)


# ----------------------------------------------------------------------------- nothing reaches the terminal raw
def test_hit_texts_with_control_characters_are_printed_escaped(capsys, tiny_bert, tmp_path):
    lines = ["plain words here", "red \x1b[31m alert \x1b]0;title\x07", "carriage\rreturn",
             "csi \x9b2J clear", "right\u202eto left", "line\u2028separator"]
    corpus = tmp_path / "evil.txt"
    corpus.write_bytes("\n".join(lines).encode("utf-8") + b"\n")
    folder = tmp_path / "index"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", folder,
                        "--no-progress"])[0] == 0
    for argv in (["--index", folder], ["--index", folder, "--corpus", corpus], ["--corpus", corpus]):
        code, out, _ = run(capsys, ["search", *argv, "--model", tiny_bert, "--query", "alert \x1b[2J",
                                    "--top-k", "6", "--no-progress"])
        assert code == 0
        assert not any(c in out for c in "\x1b\x07\r\x9b\u202e\u2028"), repr(out)
        found = json.loads(out)
        assert found["query"] == "alert \x1b[2J"
        # "carriage\rreturn" is one line of a text file (lines end at \n), as every reader reads it
        assert {h["text"] for h in found["hits"]} <= set(lines)
        assert any("\x1b" in h["text"] for h in found["hits"])


def test_a_dataset_folder_corpus_is_hashed_inside_itself(capsys, tiny_bert, tmp_path):
    """The digest of an honest folder is the one `file_sha256` gave it (indexes built before still match); a
    link leading out of it, added since, is refused, not hashed."""
    datasets = pytest.importorskip("datasets")
    from mirrorbert.safeguards.readback import file_sha256
    from mirrorbert.search.fingerprints import corpus_sha256

    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": ["a cat", "a dog", "the fox"]}).save_to_disk(str(folder), num_shards=2)
    assert corpus_sha256(folder) == file_sha256(folder)
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", folder, "--output", tmp_path / "index",
                        "--no-progress"])[0] == 0
    assert _search(capsys, tiny_bert, tmp_path / "index", "--corpus", folder)[0] == 0
    (tmp_path / "elsewhere.txt").write_text("not the dataset's\n", encoding="utf-8")
    os.symlink(tmp_path / "elsewhere.txt", folder / "notes.txt")
    _refused(_search(capsys, tiny_bert, tmp_path / "index"), f"{folder / 'notes.txt'}: leads out of the dataset folder")


# ----------------------------------------------------------------------------- every claim against what proves it
def test_an_index_of_mirrorbert_index_without_its_texts_is_refused(capsys, tiny_bert, index):
    """Its texts are what its vectors are checked against, and what --corpus is compared with: a manifest that
    drops them (to hide an edited pooling or max_length, or to show no text for the corpus's) is not ours."""
    (index / "texts.jsonl").unlink()
    _edit(index, texts=False, max_length=3)
    for extra in ((), ("--corpus", index.parent / "corpus.txt")):
        _refused(_search(capsys, tiny_bert, index, *extra), f"{index / 'manifest.json'}: damaged", "'texts' false")


def test_a_stored_text_rewritten_in_place_after_the_check_is_refused_not_shown(tiny_bert, index):
    from mirrorbert.errors import UserError
    from mirrorbert.search.index_claims import Manifest
    from mirrorbert.search.index_store import read_index

    texts = read_index(index, Manifest.read(index), use_faiss=False, corpus=index.parent / "corpus.txt")["texts"]
    assert texts[0] == LINES[0]
    raw = (index / "texts.jsonl").read_bytes()
    first = raw.index(b"\n")
    with open(index / "texts.jsonl", "r+b") as fh:  # the same file, the same length: only the text differs
        fh.write(b'"' + b"x" * (first - 2) + b'"')
    with pytest.raises(UserError, match=r"texts.jsonl:1: damaged \(changed since it was checked\)"):
        texts[0]
    assert texts[1] == LINES[2]
    texts.close()


def test_corpus_lines_must_be_the_corpus_s_so_no_id_is_past_its_end(capsys, tiny_bert, index, caplog):
    ids = np.load(index / "ids.npy")
    _replace(index, "ids.npy", _npy(np.concatenate([ids[:-1], [40]]).astype(np.int64)))
    _edit(index, corpus_lines=50, corpus=str(index.parent / "corpus.txt"))  # the test's own copy
    for extra in ((), ("--corpus", index.parent / "corpus.txt")):
        _refused(_search(capsys, tiny_bert, index, *extra), f"{index / 'manifest.json'}: damaged",
                 f"corpus_lines 50, but the corpus {index.parent / 'corpus.txt'} has {len(LINES)}")
    (index.parent / "corpus.txt").unlink()  # gone: the stored texts answer, their ids said to be unchecked
    code, out, _ = _search(capsys, tiny_bert, index)
    assert code == 0 and json.loads(out)["hits"]
    assert "can no longer be checked" in caplog.text


def test_the_encoding_settings_are_proved_by_vectors_drawn_at_random(capsys, tiny_bert, tmp_path):
    """A tamperer who re-makes the vectors of the rows a fixed spot check would pick (the longest, and some
    spread evenly) with max_length 3, and edits the manifest to 3, is found: the other rows re-encoded are drawn
    anew at each search, from all of them."""
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.search.index_store import SPOT_ROWS

    words = "the cat sat on a mat dog ran in park bank raised rates".split()
    lines = [" ".join(words[(i + k) % len(words)] for k in range(2 + i % 9)) + f" {i}" for i in range(300)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folder = tmp_path / "index"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", corpus, "--output", folder, "--no-progress"])[0] == 0
    lengths = np.array([len(json.dumps(t, ensure_ascii=False)) + 1 for t in lines])
    longest = np.argsort(-lengths, kind="stable")[:SPOT_ROWS // 2]
    spread = np.linspace(0, len(lines) - 1, num=SPOT_ROWS - len(longest)).astype(int)
    forged_rows = sorted(set(longest.tolist()) | set(spread.tolist()))
    vectors = np.load(folder / "vectors.npy")
    short = Encoder.load(str(tiny_bert), pooling="mean", max_length=3)
    vectors[forged_rows] = short.encode([lines[r] for r in forged_rows], normalize=True)
    _replace(folder, "vectors.npy", _npy(vectors))
    (folder / "faiss.index").unlink(missing_ok=True)
    _edit(folder, max_length=3, faiss=False)
    _refused(_search(capsys, tiny_bert, folder), "vectors.npy row", "max_length 3")


def test_spot_rows_are_the_longest_and_a_fresh_draw_of_the_rest():
    from mirrorbert.search.index_store import SPOT_ROWS, _spot_rows

    texts = [f"row {i} " + "x" * (i % 97) for i in range(5000)]
    longest = set(np.argsort(-np.array([len(t) for t in texts]), kind="stable")[:SPOT_ROWS // 2].tolist())
    draws = [_spot_rows(texts) for _ in range(3)]
    assert all(len(d) == SPOT_ROWS and longest <= set(d) for d in draws)
    assert len({tuple(d) for d in draws}) > 1  # the same draw three times: about one chance in 10**22
    assert _spot_rows(texts[:3]) == [0, 1, 2]


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc")
def test_a_corpus_that_cannot_be_read_is_said_so_not_blamed_on_a_write(capsys, tiny_bert, index, tmp_path):
    expected = "/proc/self/mem: cannot be read (Input/output error)"
    _refused(_search(capsys, tiny_bert, index, "--corpus", "/proc/self/mem"), f"--corpus {expected}")
    data = {**_manifest(index), "corpus": "/proc/self/mem"}
    del data["corpus_bytes"]  # nothing to compare its size with: it is read
    (index / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    _refused(_search(capsys, tiny_bert, index), "manifest.json names the corpus " + expected)
    _refused(run(capsys, ["index", "--model", tiny_bert, "--corpus", "/proc/self/mem", "--output",
                          tmp_path / "new", "--no-progress"]), f"--corpus {expected}")
    _refused(run(capsys, ["index", "--model", tiny_bert, "--corpus", "/proc/self/status", "--output",
                          tmp_path / "new", "--no-progress"]), "/proc/self/status: reports a size of 0 but has content")
