"""Data files from strangers: every read is bounded in time and size, a saved dataset folder is read
only inside itself, `hf:` means the Hub, and text shown from a file cannot drive the terminal."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorbert.cli.app import main
from mirrorbert.data import hf_datasets
from mirrorbert.data.readers import MAX_LINE_BYTES, TextRows, json_safe_line, shown
from mirrorbert.data.strings import check_utf8_file, read_rows, read_text_lines
from mirrorbert.errors import UserError
from support import one_error_line

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r\n"), max_size=12)


def fifo(path: Path, rescue_after: float = 15.0) -> Path:
    """A FIFO no writer ever opens, and a thread that opens and closes its write end after `rescue_after`
    seconds: a reader blocked on it then gets end-of-file, so a regression fails the test instead of hanging."""
    os.mkfifo(path)

    def rescue():
        time.sleep(rescue_after)
        for _ in range(30):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader blocked on it (ENXIO) or gone: nothing to rescue
                pass
            time.sleep(1)

    threading.Thread(target=rescue, daemon=True).start()
    return path


# ----------------------------------------------------------------------------- FIFOs, endless lines, wide headers
@pytest.mark.parametrize("suffix", [".txt", ".csv", ".jsonl", ".parquet", ".arrow"])
def test_a_fifo_is_refused_at_once_for_every_data_option(tmp_path, capsys, suffix):
    path = fifo(tmp_path / f"data{suffix}")
    extra = ["--column", "text"] if suffix == ".csv" else ["--field", "t"] if suffix == ".jsonl" else []
    (tmp_path / "c.txt").write_text("one\ntwo\n", encoding="utf-8")
    commands = [
        ["encode", "--model", "unused", "--input", path, "--output", tmp_path / "v.npy"],
        ["search", "--model", "unused", "--corpus", path, "--query", "x"],
        ["search", "--model", "unused", "--corpus", tmp_path / "c.txt", "--queries", path],
        ["train", "--model", "unused", "--data", path, "--output", tmp_path / "m", "--steps", "1"],
        ["index", "--model", "unused", "--corpus", path, "--output", tmp_path / "ix"],
    ]
    for argv in commands:
        started = time.monotonic()
        assert main([str(a) for a in argv + extra]) == 2
        assert time.monotonic() - started < 10
        line = one_error_line(capsys)
        assert f"{path}: is a FIFO, expected a regular file" in line, line


def test_a_fifo_parquet_ends_the_process_with_one_line_not_a_deaf_wait(tmp_path):
    """pyarrow opens a FIFO blocking, in C++, where SIGTERM goes unheard: it is never handed one."""
    path = fifo(tmp_path / "data.parquet", rescue_after=60)
    code = "from mirrorbert.cli.app import main; import sys; sys.exit(main(sys.argv[1:]))"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "search", "--model", "unused", "--corpus", str(path),
                           "--query", "x"], capture_output=True, text=True, timeout=50,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and time.monotonic() - started < 45
    assert done.stderr.count("mirrorbert: error:") == 1 and "is a FIFO" in done.stderr


@pytest.mark.parametrize("name, options", [("endless.txt", {}), ("endless.csv", {"column": "text"}),
                                           ("endless.jsonl", {"field_name": "t"})])
def test_an_endless_line_is_refused_after_a_bounded_read(tmp_path, name, options):
    path = tmp_path / name
    header = b"text\n" if name.endswith(".csv") else b""
    path.write_bytes(header)
    with open(path, "r+b") as fh:  # 2 GB without a line end, sparse: nothing is written
        fh.truncate(len(header) + (2 << 30))
    started = time.monotonic()
    with pytest.raises(UserError, match=rf"{name}:\d+: a line longer than {MAX_LINE_BYTES >> 20} MiB"):
        TextRows(path, option="--input", **options)
    with pytest.raises(UserError, match="a line longer than"):
        read_text_lines(path)
    assert time.monotonic() - started < 20


def test_the_utf8_check_of_an_endless_binary_line_is_bounded(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"\xff" + b"x" * (MAX_LINE_BYTES + 10))
    with pytest.raises(UserError, match="a line longer than"):
        check_utf8_file(path, "--corpus")


def test_a_million_column_csv_header_is_refused_before_csv_splits_it(tmp_path, capsys):
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(1_000_000)) + "\n" + "x\n" * 10_000, encoding="utf-8")
    started = time.monotonic()
    assert main(["encode", "--model", "unused", "--input", str(path), "--column", "c0", "--output",
                 str(tmp_path / "v.npy")]) == 2
    assert "a header of 1000000 columns" in one_error_line(capsys) and time.monotonic() - started < 10


def test_a_table_wider_than_the_bound_is_refused(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b"], "x": [1, 2], "y": [3, 4]}), tmp_path / "t.parquet")
    monkeypatch.setattr(hf_datasets, "MAX_COLUMNS", 2)
    with pytest.raises(UserError, match="3 columns, more than the 2"):
        read_rows(tmp_path / "t.parquet", column="text")


def test_a_parquet_footer_longer_than_the_file_is_refused_before_pyarrow_parses_it(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 64 + (10**9).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(UserError, match=r"bad\.parquet: cannot read it as \.parquet data \(a footer of"):
        read_rows(path, column="text")


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.one_of(st.none(), st.lists(TEXT, min_size=0, max_size=4)), min_size=0, max_size=25))
def test_csv_rows_are_those_csv_dictreader_reads(tmp_path_factory, rows):
    """The reader picks one column with csv.reader; what it reads is what csv.DictReader reads (blank records
    skipped, short rows read as blank), so record ids are unchanged."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["a", "text", "b"])
    for row in rows:
        if row is None:
            buffer.write("\n")  # a blank record
        else:
            writer.writerow(row)
    path = tmp_path_factory.mktemp("csv") / "data.csv"
    path.write_text(buffer.getvalue(), encoding="utf-8")
    expected = [r.get("text") or "" for r in csv.DictReader(io.StringIO(buffer.getvalue(), newline=""))]
    got = read_rows(path, column="text")
    assert got.texts == expected and got.ids == list(range(len(expected)))


# ----------------------------------------------------------------------------- saved dataset folders
@pytest.fixture
def saved(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": [f"sentence {i}" for i in range(7)], "n": list(range(7))})
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    (tmp_path / "outside.arrow").write_bytes((tmp_path / "saved" / "data-00000-of-00003.arrow").read_bytes())
    return tmp_path / "saved"


def test_a_saved_folder_reads_as_load_from_disk_reads_it(saved):
    import datasets

    assert read_rows(saved, column="text").texts == list(datasets.load_from_disk(str(saved))["text"])


def _edit_state(folder: Path, filename: str) -> None:
    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    state["_data_files"][0]["filename"] = filename
    (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")


@pytest.mark.parametrize("attack, message", [
    ("dotdot", "names '../outside.arrow': leads out of the dataset folder"),
    ("absolute", "leads out of the dataset folder"),
    ("symlink", "leads out of the dataset folder (a link to"),
    ("fifo", "is a FIFO, expected a regular file"),
    ("dev-zero", "leads out of the dataset folder (a link to /dev/zero)"),
    ("folder", "expected a regular file"),
    ("not-a-list", "damaged ('_data_files' is not a list"),
    ("info-symlink", "dataset_info.json: leads out of the dataset folder"),
    ("info-deep", "dataset_info.json: damaged (JSON nested deeper"),
    ("state-fifo", "state.json: is a FIFO"),
])
def test_what_a_dataset_folder_names_stays_inside_it(saved, attack, message):
    shard = saved / "data-00000-of-00003.arrow"
    if attack == "dotdot":
        _edit_state(saved, "../outside.arrow")
    elif attack == "absolute":
        _edit_state(saved, str(saved.parent / "outside.arrow"))
    elif attack in ("symlink", "fifo", "dev-zero", "folder"):
        shard.unlink()
        {"symlink": lambda: shard.symlink_to(saved.parent / "outside.arrow"), "fifo": lambda: fifo(shard),
         "dev-zero": lambda: shard.symlink_to("/dev/zero"), "folder": shard.mkdir}[attack]()
    elif attack == "not-a-list":
        (saved / "state.json").write_text(json.dumps({"_data_files": "data-00000-of-00003.arrow"}))
    elif attack == "info-symlink":
        (saved / "dataset_info.json").unlink()
        (saved / "dataset_info.json").symlink_to(saved.parent / "outside.arrow")
    elif attack == "info-deep":
        (saved / "dataset_info.json").write_text("[" * 100_000)
    elif attack == "state-fifo":
        (saved / "state.json").unlink()
        fifo(saved / "state.json")
    started = time.monotonic()
    with pytest.raises(UserError) as refused:
        read_rows(saved, column="text", option="--data")
    assert message in str(refused.value)
    assert str(refused.value).startswith(f"--data {saved}") and time.monotonic() - started < 10


# ----------------------------------------------------------------------------- hf: is the Hub
@pytest.mark.parametrize("spec", ["hf:../x", "hf:/etc", "hf:~/data", "hf:./saved", "hf:.hidden/x", "hf:a/../b",
                                  "hf:csv", "hf:json", "hf:parquet"])
def test_hf_names_that_read_as_paths_or_local_readers_are_refused(spec, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("load_dataset called"))
    with pytest.raises(UserError, match="(cannot be a path|reader of local files)"):
        read_rows(spec, column="text", option="--data")


def test_a_local_folder_of_the_same_name_is_never_consulted(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "someone" / "sentences").mkdir(parents=True)
    (tmp_path / "someone" / "sentences" / "data.csv").write_text("text\nlocal secret\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    seen = []

    def load_dataset(name, config=None, split=None, streaming=False, **kwargs):
        seen.append((name, os.getcwd(), os.path.exists(name)))
        return iter([{"text": "from the hub"}])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert read_rows("hf:someone/sentences", column="text").texts == ["from the hub"]
    (name, cwd, local), = seen
    assert name == "someone/sentences" and cwd != str(tmp_path) and not local and os.getcwd() == str(tmp_path)


# ----------------------------------------------------------------------------- text shown from files
def test_text_from_files_is_shown_inert():
    text = "red\x1b[31m\rback\x9b2J\u202eevil\u2028line\x7f"
    assert shown(text) == "red\\x1b[31m\\rback\\x9b2J\\u202eevil\\u2028line\\x7f"
    line = json.dumps({"text": text}, ensure_ascii=False)
    safe = json_safe_line(line)
    assert json.loads(safe) == {"text": text}
    assert not any(c in safe for c in "\x1b\r\x9b\u202e\u2028\x7f")
    assert shown("x" * 300).endswith("...") and len(shown("x" * 300)) == 203


def test_column_names_from_a_file_are_escaped_in_errors(tmp_path):
    path = tmp_path / "evil.csv"
    path.write_text("\x1b]0;owned\x07,other\nx,y\n", encoding="utf-8")
    with pytest.raises(UserError) as refused:
        read_rows(path, column="text")
    assert "\x1b" not in str(refused.value) and "\\x1b]0;owned\\x07" in str(refused.value)
