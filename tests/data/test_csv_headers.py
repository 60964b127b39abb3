"""CSV/TSV headers (data/readers.py): a tab-separated file named .csv is said to be one, and a file without a
header is read with its column given by number."""

from __future__ import annotations

import pytest

from mirrorbert.data.readers import TextRows, iter_records
from mirrorbert.errors import UserError


def test_a_tab_separated_file_named_csv_is_said_to_look_tab_separated(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("id\ttext\n1\ta cat\n2\ta dog\n", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        TextRows(path, column="text")
    message = str(caught.value)
    assert "looks tab-separated" in message and "id, text" in message and "name it .tsv" in message
    assert "id\ttext" not in message  # not one tab-joined "column"
    (tmp_path / "pairs.tsv").write_bytes(path.read_bytes())
    assert [t for chunk in TextRows(tmp_path / "pairs.tsv", column="text").chunks() for t in chunk] == \
        ["a cat", "a dog"]
    comma = tmp_path / "pairs2.tsv"
    comma.write_text("id,text\n1,a cat\n", encoding="utf-8")
    with pytest.raises(UserError, match="looks comma-separated .*name it .csv"):
        TextRows(comma, column="text")
    plain = tmp_path / "plain.csv"
    plain.write_text("id,body\n1,a cat\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"'text' not in the header \(columns: id, body\)$"):
        TextRows(plain, column="text")


def test_a_file_without_a_header_is_all_data_its_column_by_number(tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_bytes(b"1\ta cat\n2\t\xff bad\n3\ta dog\n\n4\t\"quoted\nacross lines\"\n")
    rows = TextRows(path, column="2", header=False, skip_bad_lines=True)
    texts = [t for chunk in rows.chunks() for t in chunk]
    assert texts == ["a cat", "a dog", "quoted\nacross lines"]  # the first line is data, not a header
    assert rows.ids == [0, 2, 3]  # each row's place in the file, the skipped line counted
    assert [t for _, t in iter_records(path, "1", header=False, skip_bad_lines=True)] == ["1", "3", "4"]
    with pytest.raises(UserError, match="names its column by number .*not 'text'"):
        TextRows(path, column="text", header=False)
    with pytest.raises(UserError, match="names its column by number"):
        TextRows(path, column="0", header=False)
    txt = tmp_path / "lines.txt"
    txt.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(UserError, match="--no-header applies to .csv/.tsv"):
        TextRows(txt, header=False)
