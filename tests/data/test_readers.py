"""Streaming readers (data/readers.py): the same strings and record ids as a whole read, in chunks of any size."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorbert.data.readers import TextRows
from mirrorbert.data.strings import read_rows
from mirrorbert.errors import UserError

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


def _streamed(path, chunk_rows, **options):
    rows = TextRows(path, **options)
    texts = [text for chunk in rows.chunks(chunk_rows) for text in chunk]
    return rows, texts


@settings(max_examples=60, deadline=None)
@given(cells=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=40), chunk_rows=st.integers(1, 7))
def test_csv_rows_come_back_as_csv_wrote_them(tmp_path_factory, cells, chunk_rows):
    """Quotes, delimiters and line breaks inside fields: the stream equals what Python's csv module wrote."""
    path = tmp_path_factory.mktemp("csv") / "data.csv"
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)  # "\r\n" lines: every field holding a CR or LF gets quoted
    writer.writerow(["id", "text"])
    writer.writerows(cells)
    path.write_bytes(buffer.getvalue().encode("utf-8"))
    rows, texts = _streamed(path, chunk_rows, column="text")
    expected = [text for _, text in cells]
    # lines end at \n (CRLF) only, as in every reader of this project: a lone CR inside a field stays a CR
    expected = [text.replace("\r\n", "\n") for text in expected]
    assert texts == expected and rows.count == len(cells) and rows.ids == list(range(len(cells)))
    assert read_rows(path, column="text").texts == texts


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 100])
def test_text_lines_and_ids_count_skipped_lines(tmp_path, chunk_rows):
    path = tmp_path / "data.txt"
    path.write_bytes(b"\xef\xbb\xbfalpha\r\nbeta\rgamma\n\xff bad\n\ndelta\n\xfe\n")
    rows, texts = _streamed(path, chunk_rows, skip_bad_lines=True)
    assert texts == ["alpha", "beta\rgamma", "", "delta"]  # a lone CR is part of its line
    assert rows.ids == [0, 1, 3, 4] and rows.skipped == [3, 6]
    whole = read_rows(path, skip_bad_lines=True)
    assert (whole.texts, whole.ids, whole.skipped) == (texts, rows.ids, rows.skipped)


def test_csv_ids_name_the_data_rows_around_skipped_and_multiline_rows(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(b'n,text\n1,one\n\xff,bad\n2,"two\nlines"\n3,three\n')
    rows, texts = _streamed(path, 2, column="text", skip_bad_lines=True)
    assert texts == ["one", "two\nlines", "three"]
    assert rows.ids == [0, 2, 3] and rows.skipped == [3]


def test_jsonl_records(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [json.dumps({"t": "a"}), "", json.dumps({"t": "b", "x": 1})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows, texts = _streamed(path, 1, field_name="t")
    assert texts == ["a", "", "b"] and rows.ids == [0, 1, 2]


@pytest.mark.parametrize("content, options, message", [
    (b'text\n"open quote\nmore\n', {"column": "text"}, "a quoted field opens here and is never closed"),
    (b"a,a\n1,2\n", {"column": "a"}, "names column 'a' 2 times"),
    (b"x,y\n1,2\n", {"column": "text"}, "not in the header"),
    (b'{"t": 1}\n', {"field_name": "t"}, "is not a string"),
    (b"ok\n\xff\n", {}, ":2: not valid UTF-8"),
])
def test_bad_files_fail_on_the_first_pass_naming_the_line(tmp_path, content, options, message):
    suffix = ".jsonl" if "field_name" in options else ".csv" if "column" in options else ".txt"
    path = tmp_path / f"data{suffix}"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        TextRows(path, **options)


def test_a_file_that_changes_between_passes_is_an_error(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a\nb\n", encoding="utf-8")
    rows = TextRows(path)
    path.write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(UserError, match="grew while it was read"):
        list(rows.chunks())
    path.write_text("a\n", encoding="utf-8")
    with pytest.raises(UserError, match="changed while it was read"):
        list(rows.chunks())


def test_empty_missing_and_folder_inputs_are_one_line(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    for path, message in ((tmp_path / "empty.txt", "the file is empty"), (tmp_path / "none.txt", "no such file"),
                          (tmp_path, "is a folder")):
        with pytest.raises(UserError, match=message):
            TextRows(path, option="--input")
