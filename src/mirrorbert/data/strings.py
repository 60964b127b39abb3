"""Training strings: read from files or built-in sources, cleaned, deduplicated, fingerprinted.

Mirror-BERT needs nothing but raw strings, so this module's job is to get them right: every line a user
gave is either used, reported as a duplicate/blank, or rejected with the file and line named.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import logging
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mirrorbert.errors import UserError
from mirrorbert.data.readers import bounded_lines, check_text_file, iter_records, open_input, read_errors, split_lines
from mirrorbert.data.hf_datasets import input_kind, is_hub_dataset, iter_hub_column, read_table_column

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = {".txt", ".text", ""}


@dataclass
class TrainingStrings:
    # the strings; once a run has built its token store, a read-only sequence over the store's copy
    # (`data.token_files.StoreStrings`), so a run does not keep a Python list of every string alive
    strings: Sequence[str]
    source: str
    n_read: int
    n_blank: int
    n_duplicates: int
    n_bad_lines: int
    fingerprint: str

    def summary(self) -> dict:
        return {
            "source": self.source,
            "strings": len(self.strings),
            "read": self.n_read,
            "blank": self.n_blank,
            "duplicates_removed": self.n_duplicates,
            "bad_lines_skipped": self.n_bad_lines,
            "sha256": self.fingerprint,
        }


def fingerprint(strings: Sequence[str]) -> str:
    """SHA-256 of the strings, each followed by a newline (the lines of a text file hash as the file does).

    A string holding a newline (possible only from a Dataset or a Python caller) hashes like the two strings
    around it. Checkpoints record this hash as `data_sha256` and a resume whose hash differs is refused as other
    data, so another encoding would refuse every checkpoint written with this one. `data.token_checks`
    recomputes it from a store's files, `data.token_writing` while it writes them.
    """
    digest = hashlib.sha256()
    for s in strings:
        digest.update(s.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def check_utf8_file(path: str | Path, option: str, hint: str = "fix the file") -> None:
    """The one UTF-8 rule of every reader (training data, MLM corpus, triplets): a line that is not UTF-8
    is an error naming the file and line. Scans in large chunks (C speed); on a failure finds the line."""
    path = Path(path)
    try:
        with open_input(path, option) as fh:
            decoder = codecs.getincrementaldecoder("utf-8")()
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        return
    except UnicodeDecodeError:
        pass
    with open_input(path, option) as fh:
        for lineno, raw in enumerate(bounded_lines(fh, path), start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid UTF-8 (byte {exc.start}); {hint}") from None
    raise UserError(f"{path}: not valid UTF-8 (the file ends inside a character); {hint}")


def read_text_lines(path: str | Path, hint: str = "fix the file") -> list[str]:
    """Every line of a UTF-8 text file without its line ending (LF, CRLF or CR), a leading BOM dropped; a line
    that is not UTF-8 is one error naming the file and line. The reader of every evaluation set."""
    path = Path(path)
    lines: list[str] = []
    with open_input(path, "") as fh:
        for raw in bounded_lines(fh, path):
            for piece in split_lines(raw):
                try:
                    lines.append(piece.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise UserError(f"{path}:{len(lines) + 1}: not valid UTF-8 (byte {exc.start}); {hint}") from None
    if lines:
        lines[0] = lines[0].lstrip("\ufeff")
    return lines


@dataclass
class Rows:
    """The strings of a file with where each came from: `ids[i]` is the 0-based position of `texts[i]` among
    the file's records (lines of .txt/.jsonl, data rows of .csv/.tsv), counting skipped lines, so ids and
    output rows can always be traced back to the input; `skipped` lists the skipped lines' numbers (1-based)."""
    texts: list[str]
    ids: list[int]
    skipped: list[int]


def read_rows(path: str | Path, column: str | None = None, field: str | None = None,
              skip_bad_lines: bool = False, option: str = "--data") -> Rows:
    """The strings of a .txt/.csv/.tsv/.jsonl file (one per line or row), each with its record id; also of a
    Parquet/Arrow file, a saved dataset folder or a Hub dataset (`hf:OWNER/NAME[/CONFIG][:SPLIT]`)."""
    if is_hub_dataset(path):
        if field:
            raise UserError(f"{option} {path}: --field applies to .jsonl files; a Hub dataset takes --column")
        texts = [text for chunk in iter_hub_column(str(path), column, option) for text in chunk]
        return Rows(texts, list(range(len(texts))), [])
    path = Path(path)
    if input_kind(path, option) == "table":  # Parquet/Arrow files, saved dataset folders: a row's id is its place
        if field:
            raise UserError(f"{path}: --field applies to .jsonl files; tabular data takes --column")
        texts = read_table_column(path, column, option)
        return Rows(texts, list(range(len(texts))), [])
    check_text_file(path, option)
    skipped: list[int] = []
    with read_errors(path, option):
        records = list(iter_records(path, column, field, skip_bad_lines, skipped, option))
    return Rows([text for _, text in records], [record_id for record_id, _ in records], skipped)


def read_file(path: str | Path, column: str | None = None, field: str | None = None,
              skip_bad_lines: bool = False, option: str = "--data") -> tuple[list[str], int]:
    """Raw strings of a .txt/.csv/.tsv/.jsonl file (one string per line or row) and the bad-line count."""
    rows = read_rows(path, column=column, field=field, skip_bad_lines=skip_bad_lines, option=option)
    return rows.texts, len(rows.skipped)


def top_words(n: int, lang: str) -> list[str]:
    """The paper's word-level training data: the N most frequent words of a language."""
    import wordfreq

    if not isinstance(lang, str) or not lang.strip():
        raise UserError(f"--lang {lang!r}: expected a language tag such as en, fr or zh")
    try:
        words = wordfreq.top_n_list(lang, n)
    except LookupError:
        raise UserError(f"--lang {lang!r}: wordfreq has no word list for this language") from None
    except ValueError as exc:  # langcodes' LanguageTagError: not a language tag at all
        raise UserError(f"--lang {lang!r}: not a language tag ({exc}); use e.g. en, fr or zh") from None
    if not words:
        raise UserError(f"--lang {lang!r}: wordfreq has no word list for this language")
    return words


def random_strings(n: int, seed: int, min_len: int = 3, max_len: int = 12) -> list[str]:
    """The paper's zero-semantics control: strings of random lowercase letters and digits."""
    rng = random.Random(seed)
    alphabet = string.ascii_lowercase + string.digits
    return ["".join(rng.choices(alphabet, k=rng.randint(min_len, max_len))) for _ in range(n)]


def strings_for_config(cfg, stream: bool = False) -> "TrainingStrings":
    """The training strings a TrainConfig asks for (read before any model is loaded). With `stream`, a text,
    CSV or JSONL file is not held: its strings are read again from the file when walked (`FileStrings`)."""
    if stream and cfg.data is not None and streamable(cfg.data):
        return stream_training_strings(cfg.data, cfg.column, cfg.field, cfg.skip_bad_lines, cfg.limit, cfg.seed)
    return load_training_strings(
        data=cfg.data, column=cfg.column, field=cfg.field, words_top=cfg.words_top, lang=cfg.lang,
        random_count=cfg.random_strings, limit=cfg.limit, seed=cfg.seed, skip_bad_lines=cfg.skip_bad_lines,
    )


def load_training_strings(
    data: str | None = None,
    column: str | None = None,
    field: str | None = None,
    words_top: int | None = None,
    lang: str = "en",
    random_count: int | None = None,
    limit: int | None = None,
    seed: int = 42,
    skip_bad_lines: bool = False,
) -> TrainingStrings:
    bad = 0
    if data is not None:
        raw, bad = read_file(data, column=column, field=field, skip_bad_lines=skip_bad_lines)
        source = str(data)
    elif words_top is not None:
        raw, source = top_words(words_top, lang), f"wordfreq:{lang}:top{words_top}"
    elif random_count is not None:
        raw, source = random_strings(random_count, seed), f"random-strings:{random_count}:seed{seed}"
    else:
        raise UserError("no training data: give --data FILE, --words-top N or --random-strings N")

    return training_strings(raw, source, bad, limit, seed)


def strings_from_dataset(dataset, column: str | None = None, limit: int | None = None,
                         seed: int = 42) -> TrainingStrings:
    """Training strings from a `datasets.Dataset` column (the only column when it has one), for
    `train(cfg, strings_from_dataset(ds, "text"))`: blanks and duplicates dropped as for a file."""
    from mirrorbert.data.hf_datasets import dataset_strings

    raw = dataset_strings(dataset, column)
    fingerprint_of_source = getattr(dataset, "_fingerprint", None)
    source = f"datasets.Dataset:{column or 'only column'}" + (f":{fingerprint_of_source}" if fingerprint_of_source else "")
    return training_strings(raw, source, 0, limit, seed)


def streamable(data: str | Path) -> bool:
    """A file or dataset folder (text, CSV/TSV, JSONL, Parquet, Arrow), not a Hub dataset: what training streams."""
    return not is_hub_dataset(data)


def training_strings(raw: list[str], source: str, bad: int, limit: int | None, seed: int) -> TrainingStrings:
    """Strip, drop blanks and duplicates (first occurrence kept), then sample `limit` in file order."""
    stripped = [s.strip() for s in raw]
    n_blank = sum(1 for s in stripped if not s)
    seen: set[str] = set()
    unique = []
    for s in stripped:
        if s and s not in seen:
            seen.add(s)
            unique.append(s)
    n_dup = len(stripped) - n_blank - len(unique)
    if limit is not None and limit < len(unique):
        keep = sorted(random.Random(seed).sample(range(len(unique)), limit))
        unique = [unique[i] for i in keep]
    if len(unique) < 2:
        raise UserError(f"{source}: needs at least 2 distinct non-blank strings, found {len(unique)}")
    logger.info(
        "training strings from %s: %d used (%d read, %d blank, %d duplicates removed, %d bad lines skipped)",
        source, len(unique), len(raw), n_blank, n_dup, bad,
    )
    return TrainingStrings(unique, source, len(raw), n_blank, n_dup, bad, fingerprint(unique))


class FileStrings:
    """The kept strings of a training file (stripped, first occurrences, the sample), read again from the file
    each time they are walked: the run holds their record positions (8 bytes a string), never the strings."""

    def __init__(self, rows, positions):
        self.rows, self.positions = rows, positions

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self):
        block = 65536  # positions turned into Python ints a block at a time: 8 bytes each in the array, 36 in a list
        wanted = itertools.chain.from_iterable(self.positions[i:i + block].tolist()
                                               for i in range(0, len(self.positions), block))
        target = next(wanted, None)
        for position, (_, text) in enumerate(self.rows.records()):
            if position == target:
                yield text.strip()
                target = next(wanted, None)
                if target is None:
                    return

    def __getitem__(self, index):
        """Random access reads the file up to the string: for a few strings (a message's example), not a loop."""
        if isinstance(index, slice):
            return list(itertools.islice(iter(self), *index.indices(len(self))))
        index = range(len(self))[index]
        return next(itertools.islice(iter(self), index, None))


def _kept_positions(rows):
    """Record positions of the first occurrence of each distinct non-blank stripped string, in file order, and
    the number of blank records. Strings are compared by their 128-bit BLAKE2b digests (16 bytes a string held,
    a collision needs about 2**64 strings), so the pass holds no string beyond the one being read."""
    import numpy as np  # here: reading a file's strings needs no numpy otherwise

    digests = np.zeros((rows.count, 2), dtype=np.uint64)
    blank = np.zeros(rows.count, dtype=bool)
    for position, (_, text) in enumerate(rows.records()):
        stripped = text.strip()
        if stripped:
            digests[position] = np.frombuffer(hashlib.blake2b(stripped.encode("utf-8"), digest_size=16).digest(),
                                              dtype=np.uint64)
        else:
            blank[position] = True
    nonblank = np.flatnonzero(~blank)
    keys = np.ascontiguousarray(digests[nonblank]).view(np.dtype((np.void, 16))).ravel()
    _, first = np.unique(keys, return_index=True)
    return np.sort(nonblank[first]), int(blank.sum())


def stream_training_strings(data: str | Path, column: str | None, field: str | None, skip_bad_lines: bool,
                            limit: int | None, seed: int) -> TrainingStrings:
    """`training_strings` over a text, CSV, JSONL, Parquet or Arrow file or a dataset folder without holding it:
    the same strings, counts, sample and fingerprint as a whole read (`load_training_strings`), in passes."""
    from mirrorbert.data.hf_datasets import TableRows
    from mirrorbert.data.readers import text_rows

    if input_kind(Path(data), "--data") == "table":
        if field:
            raise UserError(f"{data}: --field applies to .jsonl files; tabular data takes --column")
        rows = TableRows(data, column, "--data")
    else:
        rows = text_rows(data, column, field, skip_bad_lines, option="--data")
    positions, n_blank = _kept_positions(rows)
    n_dup = rows.count - n_blank - len(positions)
    if limit is not None and limit < len(positions):
        positions = positions[sorted(random.Random(seed).sample(range(len(positions)), limit))]
    if len(positions) < 2:
        raise UserError(f"{data}: needs at least 2 distinct non-blank strings, found {len(positions)}")
    strings = FileStrings(rows, positions)
    logger.info("training strings from %s: %d used (%d read, %d blank, %d duplicates removed, %d bad lines skipped)",
                data, len(strings), rows.count, n_blank, n_dup, len(rows.skipped))
    return TrainingStrings(strings, str(data), rows.count, n_blank, n_dup, len(rows.skipped), fingerprint(strings))
