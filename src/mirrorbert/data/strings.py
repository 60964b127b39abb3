"""Training strings, read from files or built-in sources: stripped, blanks and duplicates dropped (the first
occurrence kept), sampled, fingerprinted. Every record given is used, counted (blank, duplicate, a skipped line)
or refused naming the file and line.
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
from mirrorbert.data.readers import (TextRows, bounded_lines, check_header_applies, check_text_file, iter_records,
                                    open_input, read_errors)
from mirrorbert.data.hf_datasets import (TableRows, dataset_strings, input_kind, is_hub_dataset, iter_hub_column,
                                        iter_table_column)

logger = logging.getLogger(__name__)


@dataclass
class TrainingStrings:
    """The kept strings (once a run has built its token store, `data.token_store.StoreStrings` over its copy)
    and the counts of what was read."""

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
    """SHA-256 of the strings, each followed by a newline (a text file's lines hash as the file does; a string
    holding a newline, as the two around it): a checkpoint's `data_sha256`, recomputed by `data.token_store`."""
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
            raw = raw[:-1] if raw.endswith(b"\n") else raw
            for piece in (raw[:-1] if raw.endswith(b"\r") else raw).split(b"\r"):  # a lone CR ends a line too
                try:
                    lines.append(piece.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise UserError(f"{path}:{len(lines) + 1}: not valid UTF-8 (byte {exc.start}); {hint}") from None
    if lines:
        lines[0] = lines[0].lstrip("\ufeff")
    return lines


@dataclass
class Rows:
    """A file's strings with their record ids (`ids[i]`: the 0-based place of `texts[i]` among the file's records,
    skipped lines counted) and the 1-based numbers of the lines skipped."""
    texts: list[str]
    ids: list[int]
    skipped: list[int]


def _is_table(path: str | Path, field: str | None, header: bool, option: str) -> bool:
    """Whether `path` is read as a table (a Hub dataset, a Parquet/Arrow file, a saved dataset folder), where
    --field has no place (nor has --no-header, anywhere but in a .csv/.tsv file)."""
    check_header_applies(path, header, option)
    hub = is_hub_dataset(path)
    if not hub and input_kind(Path(path), option) != "table":
        return False
    if field:
        where, kind = (f"{option} {path}", "a Hub dataset") if hub else (str(path), "tabular data")
        raise UserError(f"{where}: --field applies to .jsonl files; {kind} takes --column")
    return True


def read_rows(path: str | Path, column: str | None = None, field: str | None = None,
              skip_bad_lines: bool = False, option: str = "--data", *, header: bool = True) -> Rows:
    """The strings of a .txt/.csv/.tsv/.jsonl file (one per line or row; a .csv/.tsv without a `header`: every
    line data), a Parquet/Arrow file, a saved dataset folder or a Hub dataset (`hf:OWNER/NAME[/CONFIG][:SPLIT]`),
    each with its record id."""
    if _is_table(path, field, header, option):
        read = iter_hub_column if is_hub_dataset(path) else iter_table_column
        texts = list(itertools.chain.from_iterable(read(path, column, option)))
        return Rows(texts, list(range(len(texts))), [])
    path = Path(path)
    check_text_file(path, option)
    skipped: list[int] = []
    with read_errors(path, option):
        records = list(iter_records(path, column, field, skip_bad_lines, skipped, option, header))
    return Rows([text for _, text in records], [record_id for record_id, _ in records], skipped)


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


def strings_for_config(cfg, stream: bool = False) -> TrainingStrings:
    """The training strings a TrainConfig asks for (read before any model is loaded). With `stream`, a file is
    not held: its strings are read again from it when walked (`stream_training_strings`)."""
    if cfg.data is None:
        return builtin_strings(words_top=cfg.words_top, lang=cfg.lang, random_count=cfg.random_strings,
                               limit=cfg.limit, seed=cfg.seed)
    reading = {"column": cfg.column, "field": cfg.field, "skip_bad_lines": cfg.skip_bad_lines, "header": cfg.header,
               "limit": cfg.limit, "seed": cfg.seed}
    if stream and not is_hub_dataset(cfg.data):
        return stream_training_strings(cfg.data, **reading)
    return load_training_strings(cfg.data, **reading)


def load_training_strings(data: str | Path, *, column: str | None = None, field: str | None = None,
                          skip_bad_lines: bool = False, header: bool = True, limit: int | None = None,
                          seed: int = 42) -> TrainingStrings:
    """The training strings of a file, dataset folder or Hub dataset (`read_rows`), read whole."""
    rows = read_rows(data, column, field, skip_bad_lines, header=header)
    return training_strings(rows.texts, str(data), len(rows.skipped), limit, seed)


def builtin_strings(*, words_top: int | None = None, lang: str = "en", random_count: int | None = None,
                    limit: int | None = None, seed: int = 42) -> TrainingStrings:
    """The paper's built-in training strings: the `words_top` most frequent words of `lang`, or `random_count`
    random strings."""
    if words_top is not None:
        raw, source = top_words(words_top, lang), f"wordfreq:{lang}:top{words_top}"
    elif random_count is not None:
        raw, source = random_strings(random_count, seed), f"random-strings:{random_count}:seed{seed}"
    else:
        raise UserError("no training data: give --data FILE, --words-top N or --random-strings N")
    return training_strings(raw, source, 0, limit, seed)


def strings_from_dataset(dataset, column: str | None = None, limit: int | None = None,
                         seed: int = 42) -> TrainingStrings:
    """Training strings from a `datasets.Dataset` column (the only column when it has one), for
    `train(cfg, strings_from_dataset(ds, "text"))`: blanks and duplicates dropped as for a file."""
    raw = dataset_strings(dataset, column)
    fingerprint_of_source = getattr(dataset, "_fingerprint", None)
    source = f"datasets.Dataset:{column or 'only column'}" + (f":{fingerprint_of_source}" if fingerprint_of_source else "")
    return training_strings(raw, source, 0, limit, seed)


def training_strings(raw: list[str], source: str, bad: int, limit: int | None, seed: int) -> TrainingStrings:
    """Strip, drop blanks and duplicates (first occurrence kept), then sample `limit` in file order."""
    stripped = [s.strip() for s in raw]
    unique = list(dict.fromkeys(s for s in stripped if s))
    n_blank = stripped.count("")
    return _chosen(_sample(unique, limit, seed), source, len(raw), n_blank, len(raw) - n_blank - len(unique), bad)


def _sample(kept, limit: int | None, seed: int):
    """`limit` of the kept items (a list or an array), drawn by `seed`, in their order; all without a limit."""
    if limit is None or limit >= len(kept):
        return kept
    chosen = sorted(random.Random(seed).sample(range(len(kept)), limit))
    return kept[chosen] if hasattr(kept, "shape") else [kept[i] for i in chosen]


def _chosen(strings: Sequence[str], source: str, n_read: int, n_blank: int, n_dup: int, bad: int) -> TrainingStrings:
    if len(strings) < 2:
        raise UserError(f"{source}: needs at least 2 distinct non-blank strings, found {len(strings)}")
    logger.info("training strings from %s: %d used (%d read, %d blank, %d duplicates removed, %d bad lines skipped)",
                source, len(strings), n_read, n_blank, n_dup, bad)
    return TrainingStrings(strings, source, n_read, n_blank, n_dup, bad, fingerprint(strings))


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
    the number of blank records; strings are compared by their 128-bit BLAKE2b digests, never held."""
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


def stream_training_strings(data: str | Path, *, column: str | None = None, field: str | None = None,
                            skip_bad_lines: bool = False, header: bool = True, limit: int | None = None,
                            seed: int = 42) -> TrainingStrings:
    """`load_training_strings` of a file or dataset folder without holding it: the same strings, counts, sample
    and fingerprint, read in passes (`FileStrings`)."""
    if _is_table(data, field, header, "--data"):
        rows = TableRows(data, column, "--data")
    else:
        rows = TextRows(data, column, field, skip_bad_lines, option="--data", header=header)
    positions, n_blank = _kept_positions(rows)
    n_dup = rows.count - n_blank - len(positions)
    strings = FileStrings(rows, _sample(positions, limit, seed))
    return _chosen(strings, str(data), rows.count, n_blank, n_dup, len(rows.skipped))
