"""Text, CSV/TSV and JSONL files as a stream of records: (record id, string), one line at a time.

The one parser of these formats. A record's id is its 0-based place among the file's records (lines of
.txt/.jsonl, data rows of .csv/.tsv), lines skipped as not UTF-8 counted. Memory holds at most the lines of
the CSV row being read. Every read is bounded: opened non-blocking and checked on its descriptor (`open_input`),
a line at most `MAX_LINE_BYTES`, a CSV field `MAX_FIELD_CHARS`, a header `MAX_COLUMNS` columns. Text from a
file shown in a message goes through `shown`.
"""

from __future__ import annotations

import bisect
import contextlib
import csv
import io
import itertools
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, TypeVar

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import open_regular, read_errors

logger = logging.getLogger(__name__)

CSV_SUFFIXES = {".csv": ",", ".tsv": "\t"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
CHUNK_ROWS = 65536
# Bounds no real input comes near; each is refused in one line naming the file and line when passed.
MAX_LINE_BYTES = 32 << 20  # one line (a document on one line is kilobytes; an encoder reads 512 tokens of it)
MAX_FIELD_CHARS = 64 << 20  # one CSV field, which may span lines
MAX_COLUMNS = 65536  # columns of a CSV/TSV header or a table
T = TypeVar("T")

# Characters a terminal acts on: C0 and C1 controls (ESC starts a sequence; CSI is U+009B), DEL, the line and
# paragraph separators and the bidirectional overrides (text that displays other than it reads).
UNSAFE_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def shown(text, limit: int = 200) -> str:
    """`text` from a file as a message may print it: cut at `limit` characters, every character a terminal acts
    on escaped as Python writes it (`\\x1b`, `\\r`, `\\u202e`)."""
    text = str(text)
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return UNSAFE_CHARS.sub(lambda m: repr(m.group())[1:-1], cut)


def json_safe_line(line: str) -> str:
    """A JSON line whose strings may hold text from a file, with every character a terminal acts on written as
    a `\\uXXXX` escape: the same JSON to a parser, inert on a terminal (json escapes only C0 controls)."""
    return UNSAFE_CHARS.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def open_input(path: Path, option: str | None) -> BinaryIO:
    """A data file opened through `safeguards.readback.open_regular` (non-blocking, checked on its descriptor:
    a FIFO, device, socket or folder is one error naming it, never a read that blocks)."""
    return os.fdopen(open_regular(Path(path), option or "file"), "rb")


def bounded_lines(fh: BinaryIO, path: Path) -> Iterator[bytes]:
    """The raw lines of an open file (ending with their `\\n`), each at most `MAX_LINE_BYTES`: a longer one is
    one error naming the line, after reading only that much of it."""
    lineno = 0
    while raw := fh.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):  # MAX_LINE_BYTES and its line end pass
            raise UserError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES >> 20} MiB (no line end in it); "
                            "not a text file, or a whole document on one line: split it")
        yield raw


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items (the last may be shorter), from a list or a stream alike."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def decoded_lines(path: Path, skip_bad_lines: bool, skipped: list[int],
                  option: str | None = None) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each line, ended by LF or CRLF only (as `wc -l` counts them: a lone CR is
    text); a line that is not UTF-8 is an error naming it, or skipped on request (its number appended to
    `skipped`). A leading BOM is dropped."""
    with open_input(path, option) as fh:
        for lineno, raw in enumerate(bounded_lines(fh, path), 1):
            piece = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError as exc:
                if skip_bad_lines:
                    skipped.append(lineno)
                    logger.warning("%s:%d: skipped, not valid UTF-8", path, lineno)
                    continue
                raise UserError(
                    f"{path}:{lineno}: not valid UTF-8 (byte {exc.start}); fix the file or pass --skip-bad-lines"
                ) from None
            yield lineno, text.lstrip("\ufeff") if lineno == 1 else text


def encodable(text: str) -> bool:
    """False for a string holding a lone surrogate (JSON's "\\ud800" decodes to one; no UTF-8 can hold it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _jsonl_records(path: Path, lines: Iterator[tuple[int, str]], field_name: str) -> Iterator[tuple[int, str]]:
    for lineno, text in lines:
        if not text.strip():
            yield lineno - 1, ""
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        except RecursionError:
            raise UserError(f"{path}:{lineno}: invalid JSON (nested too deeply)") from None
        if not isinstance(record, dict) or field_name not in record:
            raise UserError(f"{path}:{lineno}: no field {field_name!r}")
        value = record[field_name]
        if not isinstance(value, str):
            raise UserError(f"{path}:{lineno}: field {field_name!r} is not a string")
        if not encodable(value):
            raise UserError(f"{path}:{lineno}: field {field_name!r} holds a lone surrogate escape (e.g. \\ud800), "
                            "which is not text; fix the file")
        yield lineno - 1, value


@dataclass
class _LineWindow:
    """The kept lines (not skipped) from the start of the CSV row being read on: their file line numbers and
    texts by their place among the kept lines, so errors and ids can name file lines without keeping the file."""

    lines: Iterator[tuple[int, str]]
    held: dict[int, tuple[int, str]] = field(default_factory=dict)
    count: int = 0
    last: int = 1

    def feed(self) -> Iterator[str]:
        for lineno, text in self.lines:
            self.held[self.count] = (lineno, text)
            self.count, self.last = self.count + 1, lineno
            yield text + "\n"

    def file_line(self, index: int) -> int:
        """The file line of the `index`-th kept line (0-based), or of the last one read past the end."""
        found = self.held.get(max(index, 0))
        return found[0] if found else self.last

    def forget_before(self, index: int) -> None:
        for key in [k for k in self.held if k < index]:
            del self.held[key]


def _csv_records(path: Path, lines: Iterator[tuple[int, str]], delimiter: str, column: str,
                 skipped: list[int], header: bool = True) -> Iterator[tuple[int, str]]:
    """csv.reader, reading rows as csv.DictReader would (blank rows skipped, a missing cell read as blank) but
    picking the one column: DictReader fills every header column of every row, a million of them for a crafted
    header. Without a `header`, every line is data and `column` is the column's number (1: the first)."""
    window = _LineWindow(_header_bounded(path, lines, delimiter))
    reader = csv.reader(window.feed(), delimiter=delimiter)
    if header:
        try:
            fieldnames = next(reader, None)
        except csv.Error as exc:
            raise UserError(f"{path}:{window.file_line(reader.line_num - 1)}: not valid CSV ({exc})") from None
        position = _check_header(path, fieldnames, column, delimiter)
    else:
        position = _column_number(path, column)
    at = [reader.line_num]
    header_line = (window.file_line(at[0] - 1) if at[0] else 1) if header else 0
    start, last_start, index = at[0], at[0], -1
    try:
        for index, row in enumerate(_rows(reader, at)):
            first_line = window.file_line(start)  # the file line this row starts on
            # a skipped line counts as the data row it was, so ids stay the rows' places in the file
            yield (index + bisect.bisect_left(skipped, first_line) - bisect.bisect_left(skipped, header_line),
                   (row[position] if position < len(row) else "") or "")
            last_start, start = start, at[0]
            window.forget_before(last_start)
    except csv.Error as exc:
        raise UserError(f"{path}:{window.file_line(at[0] - 1)}: not valid CSV ({exc})") from None
    if index >= 0 and start - last_start > 1:
        _check_last_row_closed(path, window, last_start, delimiter)


def _rows(reader, at: list[int]) -> Iterator[list[str]]:
    """csv.DictReader's walk over the records: blank ones skipped; `at[0]` is its line_num (the reader's,
    taken after a row's first record, before blank ones are skipped), which the record ids are counted from."""
    for row in reader:
        at[0] = reader.line_num
        while row == []:
            row = next(reader, None)
            if row is None:
                return
        yield row


def _header_bounded(path: Path, lines: Iterator[tuple[int, str]], delimiter: str) -> Iterator[tuple[int, str]]:
    """The lines, the first refused when it holds MAX_COLUMNS or more delimiters (before csv splits it)."""
    for lineno, text in lines:
        if text.count(delimiter) >= MAX_COLUMNS:
            raise UserError(f"{path}:{lineno}: a header of {text.count(delimiter) + 1} columns, more than the "
                            f"{MAX_COLUMNS} a table may have here")
        yield lineno, text
        break
    yield from lines


def _check_header(path: Path, fieldnames, column: str, delimiter: str) -> int:
    """The place of `column` in the header."""
    if fieldnames is None or column not in fieldnames:
        found = ", ".join(fieldnames or [])
        other = "\t" if delimiter == "," else ","
        if fieldnames and len(fieldnames) == 1 and other in fieldnames[0]:  # one "column" that splits at the other
            kind, suffix = ("tab", ".tsv") if other == "\t" else ("comma", ".csv")
            raise UserError(f"{path}: --column {column!r} not in the header, which looks {kind}-separated (split "
                            f"at {kind}s it names: {shown(', '.join(fieldnames[0].split(other)), 400)}); a "
                            f"{path.suffix} file is read {'comma' if delimiter == ',' else 'tab'}-separated: name "
                            f"it {suffix}")
        raise UserError(f"{path}: --column {column!r} not in the header (columns: {shown(found, 400)})")
    if fieldnames.count(column) > 1:
        raise UserError(f"{path}: the header names column {column!r} {fieldnames.count(column)} times; "
                        "which one holds the text is ambiguous: rename the others")
    return fieldnames.index(column)


def _column_number(path: Path, column: str) -> int:
    """The 0-based place of a headerless file's `column`, given as its number (1: the first)."""
    if not (column.isdigit() and 1 <= int(column) <= MAX_COLUMNS):
        raise UserError(f"{path}: a file without a header names its column by number (--column 1 for the first), "
                        f"not {shown(column, 60)!r}")
    return int(column) - 1


def _check_last_row_closed(path: Path, window: _LineWindow, last_start: int, delimiter: str) -> None:
    """csv (non-strict) ends a quoted field left open at the end of the file without a word, swallowing every
    line after the quote into one row: the last row, when it spans several lines, is read again strictly."""
    tail = "\n".join(window.held[k][1] for k in sorted(window.held) if k >= last_start)
    try:
        for _ in csv.reader(io.StringIO(tail), delimiter=delimiter, strict=True):
            pass
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            raise UserError(f"{path}:{window.file_line(last_start)}: a quoted field opens here and is never "
                            "closed (it would swallow the rest of the file); fix the quotes") from None


@contextlib.contextmanager
def _field_size_limit(path: Path) -> Iterator[None]:
    """A CSV field may be as long as the file, up to MAX_FIELD_CHARS (csv's default stops at 131,072
    characters); the limit is put back afterwards."""
    previous = csv.field_size_limit()
    csv.field_size_limit(max(previous, min(path.stat().st_size + 1, MAX_FIELD_CHARS)))
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def iter_records(path: str | Path, column: str | None = None, field_name: str | None = None,
                 skip_bad_lines: bool = False, skipped: list[int] | None = None,
                 option: str | None = None, header: bool = True) -> Iterator[tuple[int, str]]:
    """(record id, string) of each record of a .txt/.csv/.tsv/.jsonl file, in order; lines skipped as not
    UTF-8 are appended to `skipped` (1-based) as they are met. Format errors are `UserError`s naming the line.
    A .csv/.tsv file without a `header` row is all data, its `column` given by number (1: the first)."""
    path, skipped = Path(path), skipped if skipped is not None else []
    suffix = path.suffix.lower()
    check_header_applies(path, header, option)
    lines = decoded_lines(path, skip_bad_lines, skipped, option)
    if suffix in CSV_SUFFIXES:
        if not column:
            raise UserError(f"{path}: a {path.suffix} file needs --column NAME to say which column holds the text")
        with _field_size_limit(path):
            yield from _csv_records(path, lines, CSV_SUFFIXES[suffix], column, skipped, header)
    elif suffix in JSONL_SUFFIXES:
        if not field_name:
            raise UserError(f"{path}: a JSONL file needs --field NAME to say which field holds the text")
        yield from _jsonl_records(path, lines, field_name)
    else:
        if column or field_name:
            raise UserError(f"{path}: --column/--field only apply to .csv/.tsv/.jsonl/.parquet/.arrow files")
        for lineno, text in lines:
            yield lineno - 1, text


def check_header_applies(path: str | Path, header: bool, option: str | None) -> None:
    """Only a .csv/.tsv file is read without a header row (`--no-header`); any other input is refused."""
    suffix = Path(str(path)).suffix.lower()
    if not header and suffix not in CSV_SUFFIXES:
        where = f"{option} {path}" if option else str(path)
        raise UserError(f"{where}: --no-header applies to .csv/.tsv files only (other inputs have no header row "
                        "to leave out)")


def check_text_file(path: Path, option: str) -> None:
    """A data file, before it is read: it exists, is a regular file (`open_input`) and is not empty."""
    with open_input(path, option) as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise UserError(f"{option} {path}: the file is empty")


class TextRows:
    """A .txt/.csv/.tsv/.jsonl input read as a stream: checked and counted by one pass when made (so a bad
    line fails before any long work), then walked in chunks by `chunks()` as often as needed."""

    def __init__(self, path: str | Path, column: str | None = None, field_name: str | None = None,
                 skip_bad_lines: bool = False, option: str = "--input", *, header: bool = True):
        self.path, self.column, self.field_name = Path(path), column, field_name
        self.skip_bad_lines, self.option, self.header = skip_bad_lines, option, header
        self.skipped: list[int] = []
        self.count, self.any_text = 0, False
        check_text_file(self.path, option)
        with read_errors(self.path, option):
            for _, text in iter_records(self.path, column, field_name, skip_bad_lines, self.skipped, option, header):
                self.count += 1
                self.any_text = self.any_text or bool(text.strip())

    def records(self) -> Iterator[tuple[int, str]]:
        """(record id, string) pairs, read afresh; a file that changed since it was counted is an error."""
        seen = 0
        with read_errors(self.path, self.option):
            for record in iter_records(self.path, self.column, self.field_name, self.skip_bad_lines, [],
                                       self.option, self.header):
                seen += 1
                if seen > self.count:
                    raise UserError(f"{self.option} {self.path}: the file grew while it was read "
                                    f"(more than {self.count} rows)")
                yield record
        if seen != self.count:
            raise UserError(f"{self.option} {self.path}: the file changed while it was read "
                            f"({seen} rows, {self.count} expected)")

    def chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[list[str]]:
        """The strings, `chunk_rows` at a time."""
        return chunked((text for _, text in self.records()), chunk_rows)

    @property
    def ids(self) -> list[int]:
        """Every record's id (only needed where lines were skipped: otherwise they are 0..count-1)."""
        if not self.skipped:
            return list(range(self.count))
        return [record_id for record_id, _ in self.records()]
