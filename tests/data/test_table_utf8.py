"""A Parquet or Arrow string column holds whatever bytes its writer put there (Arrow does not check them): a
string that is not UTF-8, such as a lone surrogate's bytes, is one error naming the file and the row."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from support import run_cli as run  # noqa: E402

LONE_SURROGATE = b"a lone \xed\xa0\x80 surrogate"  # U+D800 written as UTF-8 would write it, which UTF-8 forbids


def _column(*values: bytes):
    """A string column holding these bytes unchecked, as a writer that does not validate them leaves it."""
    return pa.array(list(values), pa.binary()).view(pa.string())


@pytest.fixture(params=["parquet", "arrow"])
def table(request, tmp_path):
    import pyarrow.parquet as pq

    data = pa.table({"text": _column(b"plain text", LONE_SURROGATE, b"after it")})
    path = tmp_path / f"data.{request.param}"
    if request.param == "parquet":
        pq.write_table(data, path)
    else:
        with pa.ipc.new_stream(str(path), data.schema) as writer:
            writer.write_table(data)
    return path


def test_the_row_of_a_string_that_is_not_utf8_is_named(table):
    from mirrorbert.data.hf_datasets import iter_table_column
    from mirrorbert.errors import UserError

    with pytest.raises(UserError, match=rf"^{table}: row 1: column 'text' is not UTF-8 text \(.*lone surrogate"):
        list(iter_table_column(table, "text", chunk_rows=2))
    with pytest.raises(UserError, match=rf"^{table}: row 1: "):
        list(iter_table_column(table, "text", chunk_rows=1))


@pytest.mark.parametrize("command", ["encode", "train", "index"])
def test_each_command_refuses_it_in_one_line(capsys, tiny_bert, table, command):
    out = table.parent / "out"
    argv = {"encode": ["encode", "--input", table, "--output", table.parent / "v.npy"],
            "train": ["train", "--data", table, "--output", out, "--steps", "1", "--batch-size", "2"],
            "index": ["index", "--corpus", table, "--output", out]}[command]
    code, _, err = run(capsys, [*argv, "--model", tiny_bert, "--column", "text", "--no-progress"])
    errors = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert f"{table}: row 1: column 'text' is not UTF-8 text" in errors[0]
