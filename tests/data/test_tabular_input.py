"""Hugging Face / Arrow data as input: Parquet and Arrow files, saved dataset folders and
in-memory datasets give the same strings, ids and results as the same text in a .txt file."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")

from mirrorbert.cli.app import main  # noqa: E402
from mirrorbert.data.strings import read_rows, strings_from_dataset  # noqa: E402
from mirrorbert.errors import UserError  # noqa: E402


@pytest.fixture
def tables(tmp_path, corpus):
    """The corpus (with one missing value) as .txt, .parquet, .arrow (stream and file layouts) and a saved folder."""
    import pyarrow as pa

    texts = corpus[:6] + [None] + corpus[6:]
    ds = datasets.Dataset.from_dict({"text": texts, "n": list(range(len(texts)))})
    (tmp_path / "c.txt").write_text("\n".join(t or "" for t in texts) + "\n", encoding="utf-8")
    ds.to_parquet(str(tmp_path / "c.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink:
        writer = pa.ipc.new_file(sink, ds.data.table.schema)
        writer.write_table(ds.data.table)
        writer.close()
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    return tmp_path


@pytest.mark.parametrize("name", ["c.parquet", "c.arrow", "saved", "saved/data-00000-of-00001.arrow"])
def test_each_form_reads_the_column_as_a_text_file_would(tables, name):
    plain = read_rows(tables / "c.txt")
    rows = read_rows(tables / name, column="text")
    assert rows.texts == plain.texts and rows.ids == plain.ids and rows.skipped == []


@pytest.mark.parametrize("argv, fragment", [
    (["--column", "nope"], "--column 'nope' not in the data (columns: text, n)"),
    (["--column", "n"], "row 0: column 'n' holds int, not text"),
    (["--column", "text", "--field", "text"], "--column and --field: give one of them, not both"),
])
def test_bad_columns_are_one_line(tables, capsys, argv, fragment):
    assert main(["encode", "--model", "unused", "--input", str(tables / "c.parquet"), "--output",
                 str(tables / "x.npy"), *argv]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tables / "x.npy").exists()


def test_without_column_a_text_column_or_the_only_string_column_is_read(tables, tmp_path, caplog):
    import logging

    plain = read_rows(tables / "c.txt").texts
    with caplog.at_level(logging.INFO, logger="mirrorbert.data.hf_datasets"):
        for name in ("c.parquet", "c.arrow", "saved"):  # columns text (string) and n (int): text
            assert read_rows(tables / name).texts == plain
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("no --column given; reading 'text' (the column named text)" in x for x in lines)
    one = datasets.Dataset.from_dict({"id": [1, 2], "body": ["a cat", "a dog"]})
    one.to_parquet(str(tmp_path / "one.parquet"))
    assert read_rows(tmp_path / "one.parquet").texts == ["a cat", "a dog"]  # the only string column
    assert strings_from_dataset(one).strings == ["a cat", "a dog"]
    two = datasets.Dataset.from_dict({"title": ["x"], "body": ["y"]})
    two.to_parquet(str(tmp_path / "two.parquet"))
    with pytest.raises(UserError, match=r"needs --column NAME .*\(columns: title, body\)"):
        read_rows(tmp_path / "two.parquet")  # two string columns, none named text: still asked
    with pytest.raises(UserError, match="needs --column"):
        strings_from_dataset(two)


def test_damaged_tables_and_dataset_dicts_are_refused(tables):
    (tables / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(UserError, match=r"bad\.parquet: cannot read it as \.parquet data"):
        read_rows(tables / "bad.parquet", column="text")
    with pytest.raises(UserError, match="a DatasetDict folder; give one split's folder"):
        read_rows(tables / "dict", column="text")
    assert read_rows(tables / "dict" / "train", column="text").texts == read_rows(tables / "c.txt").texts


def test_encode_and_train_from_parquet_equal_the_text_file(tables, tiny_bert, capsys):
    for source, extra in (("c.txt", []), ("c.parquet", [])):  # the column named text: no --column needed
        assert main(["encode", "--model", str(tiny_bert), "--input", str(tables / source), *extra,
                     "--output", str(tables / f"{source}.npy")]) == 0
        assert main(["train", "--model", str(tiny_bert), "--data", str(tables / source), *extra, "--steps", "1",
                     "--batch-size", "4", "--no-progress", "--device", "cpu", "--output", str(tables / f"m-{source}")]) == 0
    np.testing.assert_array_equal(np.load(tables / "c.txt.npy"), np.load(tables / "c.parquet.npy"))
    records = [json.loads((tables / f"m-{s}" / "mirrorbert.json").read_text())["training"]["data"]
               for s in ("c.txt", "c.parquet")]
    assert records[0]["sha256"] == records[1]["sha256"] and records[1]["blank"] == 1


def test_index_and_search_over_a_saved_dataset(tables, tiny_bert, capsys):
    base = ["--model", str(tiny_bert), "--column", "text"]
    assert main(["index", *base, "--corpus", str(tables / "saved"), "--output", str(tables / "idx")]) == 0
    capsys.readouterr()
    assert main(["search", "--model", str(tiny_bert), "--index", str(tables / "idx"), "--query", "a cat", "--top-k", "3"]) == 0
    from_index = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["search", *base, "--corpus", str(tables / "c.parquet"), "--query", "a cat", "--top-k", "3"]) == 0
    from_table = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [h["id"] for h in from_index["hits"]] == [h["id"] for h in from_table["hits"]]
    manifest = json.loads((tables / "idx" / "manifest.json").read_text())
    assert manifest["corpus_lines"] == 13 and manifest["rows"] == 12
    (tables / "saved" / "extra.txt").write_text("changed", encoding="utf-8")  # the folder changed: refused
    assert main(["search", "--model", str(tiny_bert), "--index", str(tables / "idx"), "--query", "a cat"]) == 2
    assert "changed" in capsys.readouterr().err


def test_python_api_takes_a_dataset(tiny_bert, tmp_path):
    from mirrorbert import Encoder, TrainConfig, train

    ds = datasets.Dataset.from_dict({"text": ["a cat sat", "a dog ran", "the fox", "a cat sat", None]})
    strings = strings_from_dataset(ds)
    assert strings.strings == ["a cat sat", "a dog ran", "the fox"] and strings.n_duplicates == 1
    result = train(TrainConfig(model=str(tiny_bert), output=str(tmp_path / "m"), steps=1, batch_size=2,
                               show_progress=False, device="cpu"), strings)
    assert result.steps == 1
    vectors = Encoder.load(tmp_path / "m").encode(ds.select(range(3))["text"])
    assert vectors.shape[0] == 3
    with pytest.raises(UserError, match="column: 'body' not in the dataset"):
        strings_from_dataset(ds, "body")
    with pytest.raises(UserError, match="needs --column"):
        strings_from_dataset(datasets.Dataset.from_dict({"a": ["x"], "b": ["y"]}))


def test_a_parquet_query_file_takes_the_corpus_column(tables, tiny_bert, capsys):
    assert main(["search", "--model", str(tiny_bert), "--corpus", str(tables / "c.parquet"), "--column", "text",
                 "--queries", str(tables / "c.parquet"), "--top-k", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [line["query"] for line in lines] == read_rows(tables / "c.txt").texts


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_two_columns_of_the_same_name_are_refused(tmp_path, suffix):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table([pa.array(["a", "b"]), pa.array(["c", "d"])], names=["text", "text"])
    path = tmp_path / f"dup{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, path)
    else:
        with pa.ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table)
    with pytest.raises(UserError, match=r"dup\.\w+: the data has 2 columns named 'text'"):
        read_rows(path, column="text")


def test_csv_quotes_long_fields_and_duplicate_headers(tmp_path):
    import csv

    limit = csv.field_size_limit()
    bad = tmp_path / "bad.csv"
    bad.write_text('text,n\n"ok",1\n"never closed,2\nthird,3\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.csv:3: a quoted field opens here and is never closed"):
        read_rows(bad, column="text")
    closed = tmp_path / "closed.csv"  # a quoted field over several lines, closed: one row, read as before
    closed.write_text('text,n\n"ok",1\n"two\nlines",2\n', encoding="utf-8")
    assert read_rows(closed, column="text").texts == ["ok", "two\nlines"]
    long = tmp_path / "long.csv"
    field = "x" * 200_000  # over csv's default limit of 131,072 characters
    long.write_text(f'text,n\n"{field}",1\nshort,2\n', encoding="utf-8")
    assert read_rows(long, column="text").texts == [field, "short"]
    assert csv.field_size_limit() == limit  # the module-wide limit is put back
    dup = tmp_path / "dup.tsv"
    dup.write_text("text\ttext\na\tb\n", encoding="utf-8")
    with pytest.raises(UserError, match="names column 'text' 2 times"):
        read_rows(dup, column="text")


def test_jsonl_lone_surrogates_and_deep_nesting_name_the_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"t": "fine"}\n{"t": "\\ud800"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"s\.jsonl:2: field 't' holds a lone surrogate"):
        read_rows(path, field="t")
    path.write_text('{"t": "fine"}\n' + "[" * 100000 + "]" * 100000 + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"s\.jsonl:2: invalid JSON"):
        read_rows(path, field="t")
