"""`--no-header`: a headerless CSV/TSV through `encode`, `train`, `index` and `search`; its first line is data and
`--column` is the column's number."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import run_cli as run

ROWS = [("a1", "the cat sat on the mat"), ("b2", "a dog ran in the park"),
        ("c3", "the stock market fell sharply today"), ("d4", "heart attack and myocardial infarction")]


@pytest.fixture
def headerless(tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_text("".join(f"{key}\t{text}\n" for key, text in ROWS), encoding="utf-8")
    return path


def _texts():
    return [text for _, text in ROWS]


def test_encode_reads_every_line_of_a_headerless_tsv(capsys, tiny_bert, headerless, tmp_path):
    code, out, err = run(capsys, ["encode", "--model", tiny_bert, "--input", headerless, "--no-header", "--column",
                                  "2", "--output", tmp_path / "v.npy", "--no-progress"])
    assert code == 0, err
    assert json.loads(out)["rows"] == len(ROWS)  # the first line is a row, not a header
    plain = tmp_path / "texts.txt"
    plain.write_text("\n".join(_texts()) + "\n", encoding="utf-8")
    assert run(capsys, ["encode", "--model", tiny_bert, "--input", plain, "--output", tmp_path / "p.npy",
                        "--no-progress"])[0] == 0
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), np.load(tmp_path / "p.npy"))


def test_train_reads_every_line_of_a_headerless_tsv(capsys, tiny_bert, headerless, tmp_path):
    from mirrorbert.data.strings import fingerprint

    code, _, err = run(capsys, ["train", "--model", tiny_bert, "--data", headerless, "--no-header", "--column", "2",
                                "--output", tmp_path / "m", "--steps", "1", "--batch-size", "2", "--no-progress"])
    assert code == 0, err
    training = json.loads((tmp_path / "m" / "mirrorbert.json").read_text(encoding="utf-8"))["training"]
    assert training["config"]["header"] is False
    assert training["data"]["read"] == len(ROWS) and training["data"]["sha256"] == fingerprint(_texts())


def test_an_index_records_it_and_search_reads_the_corpus_so(capsys, tiny_bert, headerless, tmp_path):
    folder = tmp_path / "index"
    assert run(capsys, ["index", "--model", tiny_bert, "--corpus", headerless, "--no-header", "--column", "2",
                        "--output", folder, "--no-progress"])[0] == 0
    assert json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["header"] is False
    code, out, err = run(capsys, ["search", "--index", folder, "--corpus", headerless, "--query", "a cat",
                                  "--top-k", str(len(ROWS)), "--no-progress"])
    assert code == 0, err
    assert {(h["id"], h["text"]) for h in json.loads(out)["hits"]} == set(enumerate(_texts()))


def test_no_header_is_for_csv_and_tsv_and_a_headerless_column_is_a_number(capsys, tiny_bert, headerless, tmp_path):
    plain = tmp_path / "texts.txt"
    plain.write_text("one\ntwo\n", encoding="utf-8")
    for argv, fragment in (
            (["encode", "--input", plain, "--output", tmp_path / "v.npy"], "--no-header applies to .csv/.tsv"),
            (["train", "--data", plain, "--output", tmp_path / "m"], "--no-header applies to .csv/.tsv"),
            (["encode", "--input", headerless, "--column", "text", "--output", tmp_path / "v.npy"],
             "names its column by number")):
        code, _, err = run(capsys, [*argv, "--model", tiny_bert, "--no-header", "--no-progress"])
        errors = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
        assert code == 2 and len(errors) == 1 and fragment in errors[0], err


def test_the_python_api_takes_it_as_header_false(headerless):
    from mirrorbert import TrainConfig
    from mirrorbert.data.strings import strings_for_config

    cfg = TrainConfig(data=str(headerless), column="2", header=False)
    assert list(strings_for_config(cfg, stream=True).strings) == _texts()
    assert list(strings_for_config(cfg).strings) == _texts()
