"""Strings from Hugging Face / Arrow data: Parquet and Arrow files, folders written by `Dataset.save_to_disk`,
Hub datasets and in-memory `datasets.Dataset` objects (Python API).

Parsing is pyarrow's, but pyarrow is never handed a path: it would open a FIFO blocking, deep in C++ where
SIGTERM is not heard. Each file is opened here first (non-blocking, checked on the descriptor: a regular file)
and pyarrow reads a read-only memory map of that descriptor. A saved dataset folder is read without
`datasets.load_from_disk`, which joins whatever `state.json` names to the folder: through
`safeguards.confined.ConfinedFolder`, `state.json` and `dataset_info.json` are bounded, shallow JSON, and every
shard `state.json` names must be a regular file inside the folder. A Hub dataset (`hf:OWNER/NAME`) is only ever
the Hub's: its name cannot be a path, and `load_dataset`, which would prefer a local folder of that name, is
called from an empty folder. What is ours beyond that is the one-line errors (a missing column names the
columns there are, a non-text column its type) and the row ids every command keeps (a row's place in the
table, as a line's place in a text file).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mirrorbert.data.readers import MAX_COLUMNS, shown
from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

TABLE_SUFFIXES = (".parquet", ".arrow")
DEFAULT_COLUMN = "text"
DATASET_FOLDER_MARKERS = ("state.json", "dataset_info.json")
DATASET_JSON_LIMIT = 16 << 20  # state.json and dataset_info.json: kilobytes in a real folder
MAX_SHARDS = 10_000  # each shard is a memory map (Linux allows 65,530 maps a process)
PARQUET_FOOTER_LIMIT = 256 << 20  # a footer is kilobytes to megabytes; pyarrow parses all of it


def is_dataset_folder(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` (or `DatasetDict.save_to_disk`)."""
    return path.is_dir() and (any((path / name).is_file() for name in DATASET_FOLDER_MARKERS)
                              or (path / "dataset_dict.json").is_file())


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES or is_dataset_folder(path)


def input_kind(path: Path, option: str) -> str:
    """"table" (Parquet/Arrow file, saved dataset folder) or "text" for a path given as data, after what a
    stat can say: it exists, and is a regular file or a dataset folder (a FIFO, device or socket is refused
    here, before anything opens it)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{option} {path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot open it ({exc.strerror or type(exc).__name__})") from None
    if stat.S_ISDIR(mode):
        if is_dataset_folder(path):
            return "table"
        raise UserError(f"{option} {path}: is a folder, expected a file (or a folder written by save_to_disk)")
    if not stat.S_ISREG(mode):
        from mirrorbert.safeguards.confined import describe_kind

        raise UserError(f"{option} {path}: is {describe_kind(mode)}, expected a regular file")
    return "table" if path.suffix.lower() in TABLE_SUFFIXES else "text"


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (registers the submodule)
    except ImportError:
        raise UserError('reading Parquet/Arrow data needs pyarrow: pip install "mirrorbert[eval]"') from None
    return pyarrow


def _mapped(fd: int, where: str):
    """The bytes of an opened, checked descriptor as a pyarrow buffer over a read-only memory map (the fd is
    closed; the map lives as long as the buffer): pyarrow reads exactly the file that was checked."""
    import mmap

    pa = _pyarrow()
    try:
        if os.fstat(fd).st_size == 0:
            raise UserError(f"{where}: the file is empty")
        return pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _open_file(path: Path, option: str):
    """A Parquet/Arrow file given as a path: opened non-blocking, a regular file, memory-mapped."""
    from mirrorbert.safeguards.readback import open_regular

    return _mapped(open_regular(path, option), f"{option} {path}")


def _arrow_table(pa, buffer):
    """Arrow IPC data in either layout: the stream format `datasets` writes, or the random-access file format."""
    try:
        return pa.ipc.RecordBatchStreamReader(buffer).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.RecordBatchFileReader(buffer).read_all()


def _parquet_file(pa, buffer, where: str):
    """A ParquetFile over the buffer, its footer's length checked before pyarrow parses the footer."""
    import struct

    if buffer.size < 12 or buffer[-4:].to_pybytes() != b"PAR1":
        raise UserError(f"{where}: cannot read it as .parquet data (no Parquet footer)")
    (footer,) = struct.unpack("<I", buffer[-8:-4].to_pybytes())
    if footer > min(buffer.size - 12, PARQUET_FOOTER_LIMIT):
        raise UserError(f"{where}: cannot read it as .parquet data (a footer of {footer} bytes)")
    return pa.parquet.ParquetFile(pa.BufferReader(buffer))


def dataset_folder_shards(path: Path, option: str) -> list[tuple[str, Any]]:
    """(name, mapped buffer) of each shard of a saved dataset folder, in `state.json`'s order: every name
    resolved inside the folder, a regular file; state.json and dataset_info.json bounded, shallow JSON."""
    from mirrorbert.safeguards.confined import ConfinedFolder

    folder = ConfinedFolder(path, option, "dataset folder")
    if folder.exists("dataset_dict.json"):
        splits = sorted(name for name, st in folder.entries() if stat.S_ISDIR(st.st_mode))
        raise UserError(f"{option} {path}: a DatasetDict folder; give one split's folder "
                        f"({', '.join(str(path / shown(s)) for s in splits) or 'none found'})")
    state = folder.read_json("state.json", dict, DATASET_JSON_LIMIT)
    if folder.exists("dataset_info.json"):  # load_from_disk would parse it: a hostile one is refused, not skipped
        folder.read_json("dataset_info.json", dict, DATASET_JSON_LIMIT)
    files = state.get("_data_files")
    if (not isinstance(files, list) or not files or len(files) > MAX_SHARDS
            or not all(isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files)):
        raise folder.refuse("state.json", f"damaged ('_data_files' is not a list of 1 to {MAX_SHARDS} "
                                          "{\"filename\": ...} entries)")
    shards = []
    for entry in files:
        name = entry["filename"]
        fd = folder.open(name, named_in="state.json")
        shards.append((name, _mapped(fd, f"{option} {folder.given / 'state.json'} names {name[:200]!r}")))
    return shards


def _read_dataset_folder(pa, path: Path, option: str):
    tables = []
    for name, buffer in dataset_folder_shards(path, option):
        try:
            tables.append(_arrow_table(pa, buffer))
        except Exception as exc:  # noqa: BLE001  a damaged shard: say which, in one line
            raise UserError(f"{option} {path / shown(name)}: cannot read it as .arrow data "
                            f"({_reason(exc)})") from None
    try:
        return pa.concat_tables(tables)
    except Exception as exc:  # noqa: BLE001  shards of different schemas
        raise UserError(f"{option} {path}: its shards do not make one table ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    return shown(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _read_table(path: Path, option: str):
    pa = _pyarrow()
    if path.is_dir():
        return _check_width(path, _read_dataset_folder(pa, path, option))
    buffer = _open_file(path, option)
    try:
        if path.suffix.lower() == ".parquet":
            table = _parquet_file(pa, buffer, f"{option} {path}").read()
        else:
            table = _arrow_table(pa, buffer)
    except UserError:
        raise
    except Exception as exc:  # pyarrow raises many types for a damaged file; say which file, in one line
        raise UserError(f"{option} {path}: cannot read it as {path.suffix or 'a dataset folder'} data "
                        f"({_reason(exc)})") from None
    return _check_width(path, table)


def _check_width(path: Path, table):
    """The table (or schema), when it has at most MAX_COLUMNS columns."""
    columns = len(table.schema) if hasattr(table, "num_rows") else len(table)
    if columns > MAX_COLUMNS:
        raise UserError(f"{path}: {columns} columns, more than the {MAX_COLUMNS} a table may have here")
    return table


def _parquet(path: Path, option: str):
    """A Parquet file given as a path, opened as `_read_table` opens it, its footer read (not its data)."""
    pa = _pyarrow()
    buffer = _open_file(path, option)
    try:
        return _parquet_file(pa, buffer, f"{option} {path}")
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  a damaged file: say which, in one line
        raise UserError(f"{option} {path}: cannot read it as .parquet data ({_reason(exc)})") from None


def column_strings(table_columns: list[str], values: list[Any], column: str | None, where: str,
                   first_row: int = 0) -> list[str]:
    """The text of one column, None read as blank; anything else that is not a string is an error naming its row."""
    if not column:
        raise UserError(f"{where}: tabular data needs --column NAME to say which column holds the text "
                        f"(columns: {shown(', '.join(map(str, table_columns)), 400)})")
    out = []
    for row, value in enumerate(values, first_row):
        if value is None:
            out.append("")
        elif isinstance(value, str):
            out.append(value)
        else:
            raise UserError(f"{where}: row {row}: column {column!r} holds {type(value).__name__}, not text")
    return out


def read_table_column(path: str | Path, column: str | None, option: str = "--data") -> list[str]:
    """The strings of `column` of a Parquet/Arrow file or a saved dataset folder, in row order."""
    return [text for chunk in iter_table_column(path, column, option) for text in chunk]


def iter_table_column(path: str | Path, column: str | None, option: str = "--data",
                      chunk_rows: int = 65536) -> Iterator[list[str]]:
    """The strings of `column`, `chunk_rows` rows at a time, without holding the table in memory: Parquet is
    read one record batch of that column at a time; Arrow files and dataset folders are memory-mapped."""
    path = Path(path)
    if not path.is_dir() and path.suffix.lower() == ".parquet":
        parquet = _parquet(path, option)
        names = list(parquet.schema_arrow.names)
        _check_width(path, parquet.schema_arrow)
        column = default_column(names, _string_fields(parquet.schema_arrow), column, str(path))
        _check_column(path, names, column)
        row = 0
        for batch in parquet.iter_batches(batch_size=chunk_rows, columns=[column]):
            yield column_strings(names, batch.column(0).to_pylist(), column, str(path), first_row=row)
            row += batch.num_rows
        return
    table = _read_table(path, option)
    names = list(table.column_names)
    column = default_column(names, _string_fields(table.schema), column, str(path))
    _check_column(path, names, column)
    values = table.column(column)
    for start in range(0, table.num_rows, chunk_rows):
        yield column_strings(names, values.slice(start, chunk_rows).to_pylist(), column, str(path), first_row=start)


class TableRows:
    """A Parquet/Arrow file's or saved dataset folder's text column in the shape of `readers.TextRows` (`count`,
    `records()`, `skipped`): read a record batch at a time, so training streams a table as it streams a text
    file. Tables skip nothing: a row's id is its place."""

    def __init__(self, path: str | Path, column: str | None, option: str = "--data"):
        self.path, self.column, self.option = Path(path), column, option
        self.skipped: list[int] = []
        self.count = count_rows(path, option)
        next(iter_table_column(path, column, option, chunk_rows=1), None)  # the column checked before long work

    def records(self) -> Iterator[tuple[int, str]]:
        position = 0
        for chunk in iter_table_column(self.path, self.column, self.option):
            for text in chunk:
                yield position, text
                position += 1
        if position != self.count:
            raise UserError(f"{self.option} {self.path}: the data changed while it was read ({position} rows, "
                            f"{self.count} expected)")


def default_column(names: list[str], string_names: list[str], column: str | None, where: str) -> str | None:
    """The column to read when --column is not given: one named `text`, else the only string column; None
    (and the caller's "needs --column" error) when neither settles it. One info line says which was taken."""
    if column:
        return column
    if DEFAULT_COLUMN in names:
        chosen, why = DEFAULT_COLUMN, "the column named text"
    elif len(string_names) == 1:
        chosen, why = string_names[0], "its only text column"
    else:
        return None
    logger.info("%s: no --column given; reading %r (%s)", where, chosen, why)
    return chosen


def _string_fields(schema) -> list[str]:
    import pyarrow as pa

    text_types = (pa.types.is_string, pa.types.is_large_string, getattr(pa.types, "is_string_view", None))
    return [field.name for field in schema if any(check and check(field.type) for check in text_types)]


def _check_column(path: Path, names: list[str], column: str | None) -> None:
    found = shown(", ".join(map(str, names)), 400)
    if not column:
        raise UserError(f"{path}: tabular data needs --column NAME to say which column holds the text "
                        f"(columns: {found})")
    if column not in names:
        raise UserError(f"{path}: --column {column!r} not in the data (columns: {found})")
    if names.count(column) > 1:
        raise UserError(f"{path}: the data has {names.count(column)} columns named {column!r}; which one "
                        "holds the text is ambiguous: rename the others")


def count_rows(path: str | Path, option: str = "--corpus") -> int:
    """Rows of a Parquet file (from its footer), an Arrow file or a dataset folder (memory-mapped)."""
    path = Path(path)
    if not path.is_dir() and path.suffix.lower() == ".parquet":
        return int(_parquet(path, option).metadata.num_rows)
    return int(_read_table(path, option).num_rows)




HUB_PREFIX = "hf:"


def is_hub_dataset(value: Any) -> bool:
    """`hf:OWNER/NAME[/CONFIG][:SPLIT]`: a dataset on the Hugging Face Hub, read with `datasets.load_dataset`."""
    return isinstance(value, str) and value.startswith(HUB_PREFIX)


_HUB_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")  # the Hub's repo id rules
_HUB_CONFIG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")
_HUB_SPLIT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+%:\[\]-]{0,127}$")  # train, validation[:10%]
# datasets' own readers of local files (`load_dataset("csv")` reads the working folder's files), never Hub ids
PACKAGED_READERS = frozenset({"arrow", "audiofolder", "cache", "csv", "eval", "generator", "hdf5", "iceberg",
                              "imagefolder", "json", "lance", "niftifolder", "pandas", "parquet", "pdffolder",
                              "spark", "sql", "text", "videofolder", "webdataset", "xml"})


def parse_hub_dataset(spec: str, option: str = "--data") -> tuple[str, str | None, str]:
    """(name, config, split) of `hf:OWNER/NAME[/CONFIG][:SPLIT]` (split default `train`). The name is a Hub
    dataset id and nothing else: one that reads as a path (`..`, a leading `/`, `.` or `~`) or names one of
    datasets' local-file readers (`csv`, `json`, ...) is refused; a local folder is given as a path."""
    body, _, split = spec[len(HUB_PREFIX):].partition(":")
    if body.startswith(("/", ".", "~")) or ".." in body or "\\" in body:
        raise UserError(f"{option} {shown(spec)}: a Hub dataset id cannot be a path; give a local folder or file "
                        "as a path, without hf:")
    parts = body.split("/")
    if (not body or len(parts) > 3 or not all(_HUB_PART.match(p) for p in parts[:2])
            or (len(parts) == 3 and not _HUB_CONFIG.match(parts[2]))
            or (":" in spec[len(HUB_PREFIX):] and not _HUB_SPLIT.match(split))):
        raise UserError(f"{option} {shown(spec)}: expected hf:OWNER/NAME[/CONFIG][:SPLIT], e.g. "
                        "hf:sentence-transformers/stsb:train or hf:glue/qnli:validation")
    name = "/".join(parts[:2]) if len(parts) >= 2 else parts[0]
    if name.lower() in _packaged_readers():
        raise UserError(f"{option} {spec}: {name!r} is datasets' reader of local files, not a Hub dataset; "
                        "give the files as a path, without hf:")
    return name, (parts[2] if len(parts) == 3 else None), split or "train"


def _packaged_readers() -> frozenset[str]:
    """PACKAGED_READERS and those of the installed datasets (its registry is private, so read if present)."""
    import sys

    registry = getattr(sys.modules.get("datasets.packaged_modules"), "_PACKAGED_DATASETS_MODULES", None) or {}
    return PACKAGED_READERS | {str(name).lower() for name in registry}


@contextmanager
def _neutral_folder():
    """The working folder is an empty temporary one while `load_dataset` resolves a name: it looks for a local
    folder or file of that name before the Hub, so no local path of the same name can answer for the Hub."""
    import tempfile

    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="mirrorbert-hub-") as empty:
        os.chdir(empty)
        try:
            yield
        finally:
            os.chdir(previous)


def iter_hub_column(spec: str, column: str | None, option: str = "--data",
                    chunk_rows: int = 65536) -> Iterator[list[str]]:
    """The strings of `column` of a Hub dataset split, `chunk_rows` at a time, through `datasets` in streaming
    mode (rows arrive as they download; nothing but the current chunk is held). Needs a network."""
    name, config, split = parse_hub_dataset(spec, option)
    if not column:
        raise UserError(f"{option} {spec}: a Hub dataset needs --column NAME to say which column holds the text")
    try:
        import datasets.packaged_modules  # noqa: F401  (its registry of local readers, for parse_hub_dataset)
        from datasets import load_dataset
    except ImportError:
        raise UserError(f'{option} {spec}: reading a Hub dataset needs datasets: pip install "mirrorbert[st]"') from None
    parse_hub_dataset(spec, option)  # again, against the installed datasets' own readers
    try:
        with _neutral_folder():
            rows = iter(load_dataset(name, config, split=split, streaming=True))
        chunk: list[Any] = []
        row = 0
        for record in rows:
            if column not in record:
                raise UserError(f"{option} {spec}: --column {column!r} not in the data "
                                f"(columns: {shown(', '.join(map(str, record)), 400)})")
            chunk.append(record[column])
            if len(chunk) == chunk_rows:
                yield column_strings(list(record), chunk, column, spec, first_row=row)
                row, chunk = row + len(chunk), []
        if chunk:
            yield column_strings(list(record), chunk, column, spec, first_row=row)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  offline, no such dataset/config/split, a gated repo: one line
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"{option} {spec}: cannot read the dataset from the Hugging Face Hub "
                        f"({type(exc).__name__}: {shown(reason)})") from None


def dataset_strings(dataset, column: str | None = None) -> list[str]:
    """The strings of a `datasets.Dataset` column (Python API); without `column`: the only column, else one
    named `text`, else the only string column."""
    names = list(getattr(dataset, "column_names", None) or [])
    if not names:
        raise UserError(f"dataset: expected a datasets.Dataset with a text column, got {type(dataset).__name__}")
    if column is None:
        features = getattr(dataset, "features", None) or {}
        strings = [name for name in names if getattr(features.get(name), "dtype", None) in ("string", "large_string")]
        column = names[0] if len(names) == 1 else default_column(names, strings, None, "dataset")
    if column is not None and column not in names:
        raise UserError(f"column: {column!r} not in the dataset (columns: {', '.join(names)})")
    values = list(dataset[column]) if column else []
    return column_strings(names, values, column, "dataset")


__all__ = ["TABLE_SUFFIXES", "count_rows", "dataset_strings", "is_dataset_folder", "is_hub_dataset", "is_table",
           "iter_hub_column", "iter_table_column", "read_table_column"]
