"""Training strings streamed from a file (data/strings.stream_training_strings) equal a whole read's: the same
strings in the same order, counts, `--limit` sample and fingerprint, with only record positions held."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorbert.data.strings import FileStrings, load_training_strings, stream_training_strings
from mirrorbert.errors import UserError

# few distinct values, with blanks and whitespace variants, so duplicates and blanks are common
WORDS = st.sampled_from(["cat", " cat", "cat  ", "dog", "a dog", "", "   ", "fox jumps", "é café", "猫"])


def _same(path, limit=None, seed=7, **options):
    whole = load_training_strings(data=str(path), limit=limit, seed=seed, **options)
    streamed = stream_training_strings(path, limit=limit, seed=seed, **options)
    assert isinstance(streamed.strings, FileStrings)
    assert list(streamed.strings) == list(whole.strings) and len(streamed.strings) == len(whole.strings)
    assert streamed.summary() == whole.summary()
    return streamed


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(WORDS, min_size=2, max_size=60), limit=st.one_of(st.none(), st.integers(2, 8)))
def test_text_files_stream_to_what_a_whole_read_gives(tmp_path_factory, lines, limit):
    path = tmp_path_factory.mktemp("strings") / "data.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        load_training_strings(data=str(path), limit=limit, seed=7)
    except UserError as whole_error:  # fewer than 2 distinct strings: the same refusal
        with pytest.raises(UserError, match="needs at least 2 distinct"):
            stream_training_strings(path, limit=limit, seed=7)
        assert "needs at least 2 distinct" in str(whole_error)
        return
    _same(path, limit=limit)


def test_csv_jsonl_and_skipped_lines(tmp_path):
    csv_path = tmp_path / "data.csv"
    csv_path.write_bytes(b'id,text\n1,alpha\n2,"multi\nline"\n3,alpha\n\xff,bad\n4, beta \n5,\n')
    streamed = _same(csv_path, column="text", skip_bad_lines=True)
    assert list(streamed.strings) == ["alpha", "multi\nline", "beta"] and streamed.n_bad_lines == 1
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps({"t": t}) + "\n" for t in ["x", "y", "x", " z "]), encoding="utf-8")
    assert list(_same(jsonl, field="t").strings) == ["x", "y", "z"]


def test_random_access_reads_up_to_the_string(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a\nb\n\na\nc\nd\n", encoding="utf-8")
    strings = stream_training_strings(path, seed=0).strings
    assert (strings[0], strings[2], strings[-1], strings[1:3]) == ("a", "c", "d", ["b", "c"])
    with pytest.raises(IndexError):
        strings[4]


@pytest.mark.parametrize("kind", ["parquet", "arrow", "dataset folder"])
def test_tables_stream_to_what_a_whole_read_gives(tmp_path, kind):
    pa = pytest.importorskip("pyarrow")
    texts = ["alpha", None, " beta ", "alpha", "", "gamma", "猫", "beta", "delta"]
    table = pa.table({"id": list(range(len(texts))), "text": texts, "other": ["x"] * len(texts)})
    if kind == "parquet":
        import pyarrow.parquet as pq

        path = tmp_path / "data.parquet"
        pq.write_table(table, path, row_group_size=2)  # several record batches
    elif kind == "arrow":
        path = tmp_path / "data.arrow"
        with pa.ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table, max_chunksize=3)
    else:
        datasets = pytest.importorskip("datasets")
        path = tmp_path / "folder"
        datasets.Dataset(table).save_to_disk(str(path))
    streamed = _same(path, column="text")
    assert list(streamed.strings) == ["alpha", "beta", "gamma", "猫", "delta"]
    assert (streamed.n_read, streamed.n_blank, streamed.n_duplicates) == (9, 2, 2)
    assert list(_same(path, column="text", limit=3, seed=1).strings) == list(
        load_training_strings(data=str(path), column="text", limit=3, seed=1).strings)
    with pytest.raises(UserError, match="--column 'nope' not in the data"):
        stream_training_strings(path, column="nope", seed=0)
