"""Reading an index folder's texts and line ids back as untrusted: `texts.jsonl` (one JSON string a line) and
the `ids.json` of format /1 indexes, and checking both against the corpus they claim to come from.

Why the texts are not read into memory: a 10M-row index holds gigabytes of strings. `texts.jsonl` is hashed
in one streaming pass, then every line parsed (a line read at most `MAX_TEXT_LINE` bytes at a time) from the
same open file, keeping only where each line starts; a hit's text is read again (and checked again) when it is
shown (`StoredTexts`). With `--corpus` the rows are walked beside the corpus's records (`CorpusRecords`): a
hit's text and id are then the corpus's, not the folder's word. Every refusal is one `UserError` naming the file.
"""

from __future__ import annotations

import collections.abc
import json
from pathlib import Path

from mirrorbert.data.readers import MAX_LINE_BYTES
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import PositionedReader, parse_json, stream_sha256
from mirrorbert.search.index_claims import Manifest
from mirrorbert.search.index_files import damaged, open_member, read_checked

MAX_TEXT_LINE = 6 * MAX_LINE_BYTES + 3  # a line of texts.jsonl: a corpus line, every byte a \u escape at worst


class StoredTexts(collections.abc.Sequence):
    """The index's texts, read from texts.jsonl when a hit needs one: a 10M-row index holds 80 MB of line
    starts instead of gigabytes of strings. The file stays open (the one that was checked); each line is
    parsed and checked again as it is read."""

    def __init__(self, folder: ConfinedFolder, reader: PositionedReader, starts):
        self.folder, self._reader, self._starts = folder, reader, starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    def lengths(self):
        """Each row's stored line length in bytes (an array), without reading the texts."""
        import numpy as np

        return np.diff(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]
        start, end = int(self._starts[index]), int(self._starts[index + 1])
        line = self._reader.read(start, end - start)
        return _parse_text(self.folder, f"texts.jsonl:{index + 1}", line[:-1] if line.endswith(b"\n") else line)

    def close(self) -> None:
        self._reader.close()


def read_texts(folder: ConfinedFolder, manifest: Manifest, corpus: "CorpusRecords | None" = None) -> StoredTexts:
    """texts.jsonl, checked whole (its SHA-256, `rows` lines, each a JSON string; with `corpus` each the text of
    the corpus's record), then kept open for `StoredTexts`."""
    import numpy as np

    name = "texts.jsonl"
    fh = open_member(folder, name, 1 << 34)
    try:
        expected = (manifest.files or {}).get(name)
        if expected is not None and stream_sha256(fh) != expected:
            raise damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
        fh.seek(0)
        starts = np.zeros(manifest.rows + 1, dtype=np.int64)
        position = lineno = 0
        while line := fh.readline(MAX_TEXT_LINE + 1):
            lineno += 1
            if lineno > manifest.rows:
                raise damaged(folder, name, f"{lineno + _newlines(fh)} lines, manifest.json says "
                                            f"{manifest.rows} rows")
            if len(line) > MAX_TEXT_LINE:
                raise damaged(folder, f"{name}:{lineno}", f"a line longer than {MAX_TEXT_LINE} bytes")
            text = _parse_text(folder, f"{name}:{lineno}", line[:-1] if line.endswith(b"\n") else line)
            if corpus is not None:
                corpus.check(lineno - 1, text)
            position += len(line)
            starts[lineno] = position
        if lineno != manifest.rows:
            raise damaged(folder, name, f"{lineno} lines, manifest.json says {manifest.rows} rows")
        if corpus is not None:
            corpus.finish()
    except BaseException:
        fh.close()
        raise
    return StoredTexts(folder, PositionedReader(fh), starts)


def _newlines(fh) -> int:
    """Line ends left in an open file, counted a block at a time."""
    return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 22), b""))


def _parse_text(folder: ConfinedFolder, where: str, line: bytes) -> str:
    """One line of texts.jsonl: a JSON string (nothing nested), valid UTF-8, no lone surrogate."""
    if not line.startswith(b'"'):
        raise damaged(folder, where, "expected a JSON string")
    try:
        text = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise damaged(folder, where, f"not a JSON string: {str(exc)[:80]}") from None
    if not isinstance(text, str):
        raise damaged(folder, where, "expected a JSON string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape: not text, and unprintable as a hit
        raise damaged(folder, where, "a lone surrogate escape, not text") from None
    return text


class CorpusRecords:
    """The corpus's non-blank records (a file given with --corpus, already matched against the manifest's
    SHA-256), walked beside texts.jsonl: row i of the index must be the i-th of them, its id that record's id
    and its stored text that record's text. So the hits' texts and ids are the corpus's, not the folder's word."""

    def __init__(self, corpus: str | Path, manifest: Manifest, ids, skip_bad_lines: bool, folder: ConfinedFolder):
        self.path, self.manifest, self.ids, self.folder = Path(corpus), manifest, ids, folder
        self.records = _non_blank_records(self.path, manifest, skip_bad_lines)

    def check(self, row: int, text: str) -> None:
        record = next(self.records, None)
        if record is None:
            raise UserError(f"--corpus {self.path}: {row} entries, but the index {self.folder.given} has "
                            f"{self.manifest.rows} rows: not the corpus it was built from; rebuild it with "
                            "`mirrorbert index`")
        record_id, expected = record
        if int(self.ids[row]) != record_id:
            raise damaged(self.folder, self.manifest.ids_file, f"entry {row} is {int(self.ids[row])}, but the "
                                                               f"corpus's entry {row} is its record {record_id}")
        if text != expected:
            raise damaged(self.folder, f"texts.jsonl:{row + 1}", f"not the text of record {record_id} of "
                                                                 f"--corpus {self.path}")

    def finish(self) -> None:
        if next(self.records, None) is not None:
            raise UserError(f"--corpus {self.path}: more entries than the {self.manifest.rows} rows of the index "
                            f"{self.folder.given}: not the corpus it was built from; rebuild it with "
                            "`mirrorbert index`")


def _non_blank_records(path: Path, manifest: Manifest, skip_bad_lines: bool):
    """(record id, text) of the corpus's non-blank records, read as `mirrorbert index` read them (the manifest's
    --column/--field; a table row's id is its place)."""
    from mirrorbert.data.hf_datasets import input_kind, iter_table_column
    from mirrorbert.data.readers import iter_records, read_errors

    if input_kind(path, "--corpus") == "table":
        position = 0
        for chunk in iter_table_column(path, manifest.column, "--corpus"):
            for text in chunk:
                if text.strip():
                    yield position, text
                position += 1
        return
    with read_errors(path, "--corpus"):
        for record_id, text in iter_records(path, manifest.column, manifest.field, skip_bad_lines, [], "--corpus"):
            if text.strip():
                yield record_id, text


def read_ids_json(folder: ConfinedFolder, manifest: Manifest) -> list[int]:
    """ids.json (format /1): a flat list of `rows` increasing line numbers below the corpus's line count; its
    size bounded (21 bytes an id) and its nesting checked before parsing."""
    name = "ids.json"
    raw = read_checked(folder, name, (manifest.files or {}).get(name), 64 + 24 * manifest.rows)
    ids = parse_json(raw, folder.option, folder.given / name)
    if not isinstance(ids, list):
        raise damaged(folder, name, f"expected a list of line numbers, found {type(ids).__name__}")
    if len(ids) != manifest.rows:
        raise damaged(folder, name, f"{len(ids)} ids, manifest.json says {manifest.rows} rows")
    previous = -1
    for position, value in enumerate(ids):
        if not (isinstance(value, int) and not isinstance(value, bool)) or not 0 <= value < manifest.corpus_lines:
            raise damaged(folder, name, f"entry {position} is {str(value)[:40]!r}, not a line number of the "
                                        f"corpus (0 to {manifest.corpus_lines - 1})")
        if value <= previous:
            raise damaged(folder, name, f"entry {position} ({value}) is not after the one before it")
        previous = value
    return ids


__all__ = ["CorpusRecords", "MAX_TEXT_LINE", "StoredTexts", "read_ids_json", "read_texts"]
