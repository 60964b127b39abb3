"""Strings from Hugging Face / Arrow data: Parquet and Arrow files, folders written by `Dataset.save_to_disk`,
Hub datasets (`hf:OWNER/NAME[/CONFIG][:SPLIT]`) and in-memory `datasets.Dataset` objects (Python API); a row's id
is its place in the table. pyarrow never gets a path, only a memory map of a descriptor opened here; a saved
dataset folder is read through `ConfinedFolder`, every shard `state.json` names a regular file inside it.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import re
import stat
import struct
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mirrorbert.data.readers import MAX_COLUMNS, chunked, shown
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import describe_kind, open_regular

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
    """"table" (Parquet/Arrow file, saved dataset folder) or "text", from a stat: a missing path, a folder that
    is no dataset, a FIFO, device or socket is refused before anything opens it."""
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
    """A checked descriptor's bytes as a pyarrow buffer over a read-only memory map (the fd is closed)."""
    pa = _pyarrow()
    try:
        if os.fstat(fd).st_size == 0:
            raise UserError(f"{where}: the file is empty")
        return pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _arrow_table(pa, buffer):
    """Arrow IPC data in either layout: the stream format `datasets` writes, or the random-access file format."""
    try:
        return pa.ipc.RecordBatchStreamReader(buffer).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.RecordBatchFileReader(buffer).read_all()


def _parquet_file(pa, buffer, where: str):
    """A ParquetFile over the buffer, its footer's length checked before pyarrow parses the footer."""
    if buffer.size < 12 or buffer[-4:].to_pybytes() != b"PAR1":
        raise UserError(f"{where}: cannot read it as .parquet data (no Parquet footer)")
    (footer,) = struct.unpack("<I", buffer[-8:-4].to_pybytes())
    if footer > min(buffer.size - 12, PARQUET_FOOTER_LIMIT):
        raise UserError(f"{where}: cannot read it as .parquet data (a footer of {footer} bytes)")
    return pa.parquet.ParquetFile(pa.BufferReader(buffer))


def _dataset_folder(pa, path: Path, option: str):
    """The table of a saved dataset folder: its shards, in `state.json`'s order, each a regular file inside it."""
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
    names, where = [f["filename"] for f in files], f"{option} {folder.given / 'state.json'} names"
    buffers = [_mapped(folder.open(name, named_in="state.json"), f"{where} {name[:200]!r}") for name in names]
    tables = []
    for name, buffer in zip(names, buffers):
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


def _open_table(path: Path, option: str):
    """(table, Arrow schema): a Parquet file's ParquetFile (its footer read, not its data), or an Arrow file's or
    dataset folder's memory-mapped Table; at most MAX_COLUMNS columns."""
    pa = _pyarrow()
    if path.is_dir():
        table = _dataset_folder(pa, path, option)
    else:
        where = f"{option} {path}"
        buffer = _mapped(open_regular(path, option), where)
        try:
            parquet = path.suffix.lower() == ".parquet"
            table = _parquet_file(pa, buffer, where) if parquet else _arrow_table(pa, buffer)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001  pyarrow raises many types for a damaged file: one line
            raise UserError(f"{where}: cannot read it as {path.suffix} data ({_reason(exc)})") from None
    schema = table.schema_arrow if hasattr(table, "schema_arrow") else table.schema
    if len(schema) > MAX_COLUMNS:
        raise UserError(f"{path}: {len(schema)} columns, more than the {MAX_COLUMNS} a table may have here")
    return table, schema


def count_rows(path: str | Path, option: str = "--corpus") -> int:
    """Rows of a Parquet file (from its footer), an Arrow file or a dataset folder (memory-mapped)."""
    table, _ = _open_table(Path(path), option)
    return int(table.metadata.num_rows if hasattr(table, "schema_arrow") else table.num_rows)


def column_strings(values: list[Any], column: str, where: str, first_row: int = 0) -> list[str]:
    """The text of one column, None read as blank; anything else that is not a string is an error naming its row."""
    out = []
    for row, value in enumerate(values, first_row):
        if value is None:
            out.append("")
        elif isinstance(value, str):
            out.append(value)
        else:
            raise UserError(f"{where}: row {row}: column {column!r} holds {type(value).__name__}, not text")
    return out


def iter_table_column(path: str | Path, column: str | None, option: str = "--data",
                      chunk_rows: int = 65536) -> Iterator[list[str]]:
    """The strings of `column`, `chunk_rows` rows at a time, never the whole table in memory (Parquet: a record
    batch of that column at a time; Arrow files and dataset folders: memory-mapped)."""
    path = Path(path)
    table, schema = _open_table(path, option)
    names, where = list(schema.names), str(path)
    column = _check_column(path, names, default_column(names, _string_fields(schema), column, where))
    if hasattr(table, "schema_arrow"):
        arrays = (batch.column(0) for batch in table.iter_batches(batch_size=chunk_rows, columns=[column]))
    else:
        values = table.column(column)
        arrays = (values.slice(start, chunk_rows) for start in range(0, table.num_rows, chunk_rows))
    row = 0
    for array in arrays:
        yield column_strings(_values(array, column, where, row), column, where, first_row=row)
        row += len(array)


def table_records(path: str | Path, column: str | None, option: str = "--data") -> Iterator[tuple[int, str]]:
    """(row, string) of `column`: a row's id is its place in the table."""
    return enumerate(itertools.chain.from_iterable(iter_table_column(path, column, option)))


def _values(array, column: str, where: str, first_row: int) -> list:
    """An Arrow array's values as Python objects; a string that is not UTF-8 (Arrow does not check what a file
    holds) is an error naming its row."""
    try:
        return array.to_pylist()
    except UnicodeDecodeError as exc:
        row = next(i for i in range(len(array)) if not _decodes(array[i]))
        raise UserError(f"{where}: row {first_row + row}: column {column!r} is not UTF-8 text ({exc.reason} at "
                        f"byte {exc.start}: a lone surrogate, or bytes that are no text); fix the file") from None


def _decodes(scalar) -> bool:
    try:
        scalar.as_py()
    except UnicodeDecodeError:
        return False
    return True


class TableRows:
    """A table's text column in the shape of `readers.TextRows` (`count`, `records()`, `skipped`), read a record
    batch at a time; tables skip nothing."""

    def __init__(self, path: str | Path, column: str | None, option: str = "--data"):
        self.path, self.column, self.option = Path(path), column, option
        self.skipped: list[int] = []
        self.count = count_rows(path, option)
        next(iter_table_column(path, column, option, chunk_rows=1), None)  # the column checked before long work

    def records(self) -> Iterator[tuple[int, str]]:
        position = -1
        for position, text in table_records(self.path, self.column, self.option):
            yield position, text
        if position + 1 != self.count:
            raise UserError(f"{self.option} {self.path}: the data changed while it was read ({position + 1} rows, "
                            f"{self.count} expected)")


def default_column(names: list[str], string_names: list[str], column: str | None, where: str) -> str | None:
    """`column`, else the one named `text`, else the only string column (said in one info line); None when
    neither settles it."""
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


def _check_column(where: Any, names: list[str], column: str | None) -> str:
    """`column`, when it names exactly one of the columns `names`."""
    found = shown(", ".join(map(str, names)), 400)
    if not column:
        raise UserError(f"{where}: tabular data needs --column NAME to say which column holds the text "
                        f"(columns: {found})")
    if column not in names:
        raise UserError(f"{where}: --column {column!r} not in the data (columns: {found})")
    if names.count(column) > 1:
        raise UserError(f"{where}: the data has {names.count(column)} columns named {column!r}; which one "
                        "holds the text is ambiguous: rename the others")
    return column


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
    datasets' local-file readers (`csv`, `json`, ...) is refused."""
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
    registry = getattr(sys.modules.get("datasets.packaged_modules"), "_PACKAGED_DATASETS_MODULES", None) or {}
    return PACKAGED_READERS | {str(name).lower() for name in registry}


@contextmanager
def _neutral_folder():
    """An empty temporary working folder while `load_dataset` resolves a name (it prefers a local path)."""
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
    mode (nothing but the current chunk is held). Needs a network."""
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
        row = 0
        for chunk in chunked(rows, chunk_rows):
            if row == 0:
                _check_column(f"{option} {spec}", list(chunk[0]), column)
            yield column_strings([record[column] for record in chunk], column, spec, first_row=row)
            row += len(chunk)
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
        column = _check_column("dataset", names, names[0] if len(names) == 1 else
                               default_column(names, strings, None, "dataset"))
    elif column not in names:
        raise UserError(f"column: {column!r} not in the dataset (columns: {', '.join(names)})")
    return column_strings(list(dataset[column]), column, "dataset")


__all__ = ["TABLE_SUFFIXES", "count_rows", "dataset_strings", "is_dataset_folder", "is_hub_dataset", "is_table",
           "iter_hub_column", "iter_table_column", "table_records"]
