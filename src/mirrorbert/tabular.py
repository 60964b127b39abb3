"""Strings from Hugging Face / Arrow data: Parquet and Arrow files, folders written by `Dataset.save_to_disk`,
and in-memory `datasets.Dataset` objects (Python API).

Reading goes through pyarrow and `datasets` (both lazy imports) rather than our own parser; what is ours is
the one-line errors (a missing column names the columns there are, a non-text column its type) and the row ids
every command keeps (a row's place in the table, as a line's place in a text file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError

TABLE_SUFFIXES = (".parquet", ".arrow")
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


def column_strings(table_columns: list[str], values: list[Any], column: str | None, where: str) -> list[str]:
    """The text of one column, None read as blank; anything else that is not a string is an error naming its row."""
    if not column:
        raise UserError(f"{where}: tabular data needs --column NAME to say which column holds the text "
                        f"(columns: {', '.join(table_columns)})")
    out = []
    for row, value in enumerate(values):
        if value is None:
            out.append("")
        elif isinstance(value, str):
            out.append(value)
        else:
            raise UserError(f"{where}: row {row}: column {column!r} holds {type(value).__name__}, not text")
    return out


def read_table_column(path: str | Path, column: str | None, option: str = "--data") -> list[str]:
    """The strings of `column` of a Parquet/Arrow file or a saved dataset folder, in row order."""
    path = Path(path)
    table = _read_table(path, option)
    names = list(table.column_names)
    if column and column not in names:
        raise UserError(f"{path}: --column {column!r} not in the data (columns: {', '.join(names)})")
    values = table.column(column).to_pylist() if column else []
    return column_strings(names, values, column, str(path))


def count_rows(path: str | Path, option: str = "--corpus") -> int:
    return int(_read_table(Path(path), option).num_rows)


def dataset_strings(dataset, column: str | None = None) -> list[str]:
    """The strings of a `datasets.Dataset` column (Python API); the only column when it has one."""
    names = list(getattr(dataset, "column_names", None) or [])
    if not names:
        raise UserError(f"dataset: expected a datasets.Dataset with a text column, got {type(dataset).__name__}")
    if column is None and len(names) == 1:
        column = names[0]
    if column is not None and column not in names:
        raise UserError(f"column: {column!r} not in the dataset (columns: {', '.join(names)})")
    values = list(dataset[column]) if column else []
    return column_strings(names, values, column, "dataset")


__all__ = ["TABLE_SUFFIXES", "count_rows", "dataset_strings", "is_dataset_folder", "is_table", "read_table_column"]
