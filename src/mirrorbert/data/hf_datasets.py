"""Strings from Hugging Face / Arrow data: Parquet and Arrow files, folders written by `Dataset.save_to_disk`,
and in-memory `datasets.Dataset` objects (Python API).

Reading goes through pyarrow and `datasets` (both lazy imports) rather than our own parser; what is ours is
the one-line errors (a missing column names the columns there are, a non-text column its type) and the row ids
every command keeps (a row's place in the table, as a line's place in a text file).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

TABLE_SUFFIXES = (".parquet", ".arrow")
DEFAULT_COLUMN = "text"
DATASET_FOLDER_MARKERS = ("state.json", "dataset_info.json")


def is_dataset_folder(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` (or `DatasetDict.save_to_disk`)."""
    return path.is_dir() and (any((path / name).is_file() for name in DATASET_FOLDER_MARKERS)
                              or (path / "dataset_dict.json").is_file())


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES or is_dataset_folder(path)


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (registers the submodule)
    except ImportError:
        raise UserError('reading Parquet/Arrow data needs pyarrow: pip install "mirrorbert[eval]"') from None
    return pyarrow


def _read_arrow_file(pa, path: Path):
    """Arrow IPC data in either layout: the stream format `datasets` writes, or the random-access file format."""
    try:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()


def _read_table(path: Path, option: str):
    pa = _pyarrow()
    try:
        if path.is_dir():
            if (path / "dataset_dict.json").is_file():
                splits = sorted(p.name for p in path.iterdir() if p.is_dir())
                raise UserError(f"{option} {path}: a DatasetDict folder; give one split's folder "
                                f"({', '.join(str(path / s) for s in splits) or 'none found'})")
            from datasets import load_from_disk  # the folder's own layout (state.json, shards) is datasets' business

            return load_from_disk(str(path)).data.table
        if path.suffix.lower() == ".parquet":
            return pa.parquet.read_table(str(path))
        return _read_arrow_file(pa, path)
    except UserError:
        raise
    except ImportError:
        raise UserError(f'{option} {path}: reading a saved dataset folder needs datasets: pip install "mirrorbert[st]"') from None
    except Exception as exc:  # pyarrow and datasets raise many types for a damaged file; say which file, in one line
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{option} {path}: cannot read it as {path.suffix or 'a dataset folder'} data ({reason[:200]})") from None


def column_strings(table_columns: list[str], values: list[Any], column: str | None, where: str,
                   first_row: int = 0) -> list[str]:
    """The text of one column, None read as blank; anything else that is not a string is an error naming its row."""
    if not column:
        raise UserError(f"{where}: tabular data needs --column NAME to say which column holds the text "
                        f"(columns: {', '.join(table_columns)})")
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
    if path.is_file() and path.suffix.lower() == ".parquet":
        pa = _pyarrow()
        try:
            parquet = pa.parquet.ParquetFile(str(path))
            names = list(parquet.schema_arrow.names)
        except Exception as exc:  # noqa: BLE001  a damaged file: say which, in one line
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"{option} {path}: cannot read it as .parquet data ({reason[:200]})") from None
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
    if not column:
        raise UserError(f"{path}: tabular data needs --column NAME to say which column holds the text "
                        f"(columns: {', '.join(names)})")
    if column not in names:
        raise UserError(f"{path}: --column {column!r} not in the data (columns: {', '.join(names)})")
    if names.count(column) > 1:
        raise UserError(f"{path}: the data has {names.count(column)} columns named {column!r}; which one holds "
                        "the text is ambiguous: rename the others")


def count_rows(path: str | Path, option: str = "--corpus") -> int:
    """Rows of a Parquet file (from its footer), an Arrow file or a dataset folder (memory-mapped)."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".parquet":
        try:
            return int(_pyarrow().parquet.ParquetFile(str(path)).metadata.num_rows)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UserError(f"{option} {path}: cannot read it as .parquet data ({str(exc)[:200]})") from None
    return int(_read_table(path, option).num_rows)




HUB_PREFIX = "hf:"


def is_hub_dataset(value: Any) -> bool:
    """`hf:OWNER/NAME[/CONFIG][:SPLIT]`: a dataset on the Hugging Face Hub, read with `datasets.load_dataset`."""
    return isinstance(value, str) and value.startswith(HUB_PREFIX)


def parse_hub_dataset(spec: str, option: str = "--data") -> tuple[str, str | None, str]:
    """(name, config, split) of `hf:OWNER/NAME[/CONFIG][:SPLIT]` (split default `train`)."""
    body, _, split = spec[len(HUB_PREFIX):].partition(":")
    parts = body.split("/")
    if not body or not all(parts) or len(parts) > 3 or any(c.isspace() for c in body) or (":" in spec[len(HUB_PREFIX):]
                                                                                           and not split):
        raise UserError(f"{option} {spec}: expected hf:OWNER/NAME[/CONFIG][:SPLIT], e.g. hf:sentence-transformers/"
                        f"stsb:train or hf:glue/qnli:validation")
    name = "/".join(parts[:2]) if len(parts) >= 2 else parts[0]
    return name, (parts[2] if len(parts) == 3 else None), split or "train"


def iter_hub_column(spec: str, column: str | None, option: str = "--data",
                    chunk_rows: int = 65536) -> Iterator[list[str]]:
    """The strings of `column` of a Hub dataset split, `chunk_rows` at a time, through `datasets` in streaming
    mode (rows arrive as they download; nothing but the current chunk is held). Needs a network."""
    name, config, split = parse_hub_dataset(spec, option)
    if not column:
        raise UserError(f"{option} {spec}: a Hub dataset needs --column NAME to say which column holds the text")
    try:
        from datasets import load_dataset
    except ImportError:
        raise UserError(f'{option} {spec}: reading a Hub dataset needs datasets: pip install "mirrorbert[st]"') from None
    try:
        rows = iter(load_dataset(name, config, split=split, streaming=True))
        chunk: list[Any] = []
        row = 0
        for record in rows:
            if column not in record:
                raise UserError(f"{option} {spec}: --column {column!r} not in the data "
                                f"(columns: {', '.join(map(str, record))})")
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
                        f"({type(exc).__name__}: {reason[:200]})") from None


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
