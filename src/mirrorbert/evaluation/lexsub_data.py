"""Lexical substitution data: the LS07 and LS14 (CoInCo) test sets and the official answer-file format.

Data (``<data_dir>/lexsub``, the LexSubCon preprocessing):

* ``*.preprocessed``: ``lemma.pos TAB id TAB target-token-index TAB sentence`` (sentence
  tokens separated by single spaces, lower-cased);
* ``*.gold``: ``lemma.pos id :: sub count;sub count;...``.

System answers are written in the official format (``lemma.pos id :: a;b`` for best, ``:::`` for oot), so
the original SemEval-2007 ``score.pl`` can be run on them.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation.datasets import resolve_data_dir

logger = logging.getLogger(__name__)

DATASETS: dict[str, tuple[str, str]] = {
    "LS07": ("LS07/test/lst_test.preprocessed", "LS07/test/lst_test.gold"),
    "LS14": ("LS14/test/coinco_test.preprocessed", "LS14/test/coinco_test.gold"),
}
ALIASES = {"ls07": "LS07", "semeval2007": "LS07", "ls14": "LS14", "coinco": "LS14"}


@dataclass(frozen=True)
class LexSubItem:
    """One target occurrence: ``key`` is (``lemma.pos``, id), the scorer's item identity."""

    lemma_pos: str
    id: str
    tokens: tuple[str, ...]
    index: int
    gold: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.lemma_pos, self.id)

    @property
    def lemma(self) -> str:
        return self.lemma_pos.rsplit(".", 1)[0].lower()

    @property
    def pos(self) -> str:
        """The target's POS as n/v/a/r (CoInCo's J is an adjective)."""
        from mirrorbert.data.wordnet import normalize_pos

        return normalize_pos(self.lemma_pos.rsplit(".", 1)[1])

    @property
    def target(self) -> str:
        return self.tokens[self.index]


def word_span(tokens: Sequence[str], index: int) -> tuple[int, int]:
    """Character span of ``tokens[index]`` in ``" ".join(tokens)``."""
    start = sum(len(t) + 1 for t in tokens[:index])
    return start, start + len(tokens[index])


def _read_lines(path: Path) -> list[str]:
    # One LS07 sentence has a stray Latin-1 byte; replacing it is harmless for scoring.
    from mirrorbert.safeguards.readback import read_regular_bytes

    return read_regular_bytes(path, "lexical substitution file", 1 << 30).decode("utf-8", errors="replace").splitlines()


def read_preprocessed(path: str | os.PathLike) -> list[LexSubItem]:
    """Parse a ``.preprocessed`` file; malformed lines raise a UserError naming file and line."""
    path = Path(path)
    items: list[LexSubItem] = []
    for lineno, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise UserError(f"{path}:{lineno}: expected 4 TAB-separated fields (lemma.pos, id, index, sentence)")
        lemma_pos, item_id, idx, sentence = fields
        tokens = tuple(sentence.strip().split(" "))
        try:
            index = int(idx)
        except ValueError:
            raise UserError(f"{path}:{lineno}: target index {idx!r} is not an integer") from None
        if not 0 <= index < len(tokens) or "." not in lemma_pos:
            raise UserError(f"{path}:{lineno}: target index {index} outside the sentence or bad lemma.pos {lemma_pos!r}")
        items.append(LexSubItem(lemma_pos.strip(), item_id.strip(), tokens, index))
    return items


_GOLD_ENTRY = re.compile(r"^\s*(.*\S)\s+(\d+)\s*$")


def parse_answer_line(line: str) -> tuple[str, str, str, list[str]] | None:
    """(lemma.pos, id, separator, entries) of ``lemma.pos id :: a;b`` (best) or ``lemma.pos id ::: a;b`` (oot), or
    None for a line in neither format."""
    m = re.match(r"^(.*\S)\s+(\S+)\s+(:::?)\s?(.*)$", line.rstrip("\r\n"))
    if not m:
        return None
    entries = [e for e in m.group(4).split(";") if e.strip()]
    return m.group(1).strip(), m.group(2), m.group(3), entries


def read_gold(path: str | os.PathLike) -> dict[tuple[str, str], dict[str, int]]:
    """``{(lemma.pos, id): {substitute: count}}`` from a ``.gold`` file (file order kept)."""
    path = Path(path)
    gold: dict[tuple[str, str], dict[str, int]] = {}
    for lineno, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        parsed = parse_answer_line(line)
        if parsed is None or parsed[2] != "::":
            raise UserError(f"{path}:{lineno}: expected 'lemma.pos id :: substitute count;...'")
        lemma_pos, item_id, _, entries = parsed
        subs: dict[str, int] = {}
        for entry in entries:
            m = _GOLD_ENTRY.match(entry)
            if not m and re.fullmatch(r"\s*\d+\s*", entry):
                # CoInCo has one response that was ";" itself ("...;; 1;"): skipped, as score.pl does.
                logger.debug("%s:%d: gold entry without a substitute skipped", path, lineno)
                continue
            if not m:
                raise UserError(f"{path}:{lineno}: gold entry {entry.strip()!r} is not 'substitute count'")
            subs[m.group(1)] = subs.get(m.group(1), 0) + int(m.group(2))
        key = (lemma_pos, item_id)
        if key in gold:
            logger.warning("%s:%d: duplicate gold item %s %s ignored", path, lineno, *key)
            continue
        gold[key] = subs
    return gold


def resolve_dataset(name: str) -> str:
    key = ALIASES.get(name.lower(), name)
    if key not in DATASETS:
        raise UserError(f"--dataset: unknown lexical substitution set {name!r}; choose LS07 or LS14 (CoInCo)")
    return key


def load_lexsub(name: str, data_dir: str | os.PathLike | None = None) -> list[LexSubItem]:
    """Test items of LS07 or LS14 (CoInCo), from ``<data_dir>/lexsub`` (or ``data_dir`` itself when it holds the
    sets), with their gold substitutes attached (empty for an item without a gold line: the scorer ignores it)."""
    key = resolve_dataset(name)
    base = resolve_data_dir(data_dir)
    root = base / "lexsub" if (base / "lexsub").is_dir() else base
    pre, gold_path = (root / p for p in DATASETS[key])
    for p in (pre, gold_path):
        if not p.is_file():
            raise DatasetMissing(f"{key}: {p} not found (expected the LexSubCon layout under <data_dir>/lexsub)")
    gold = read_gold(gold_path)
    first: dict[tuple[str, str], LexSubItem] = {}
    for item in read_preprocessed(pre):
        first.setdefault(item.key, item)
    out = [replace(item, gold=tuple(gold.get(item_key, {}).items())) for item_key, item in first.items()]
    logger.info("%s: %d items, %d with gold", key, len(out), sum(bool(i.gold) for i in out))
    return out


def write_system_file(path: str | os.PathLike, answers: Mapping[tuple[str, str], Sequence[str]], oot: bool = False) -> None:
    """Write answers in the official format (usable with the original ``score.pl``)."""
    sep = ":::" if oot else "::"
    with open(path, "w", encoding="utf-8") as fh:
        for (lemma_pos, item_id), subs in answers.items():
            fh.write(f"{lemma_pos} {item_id} {sep} {';'.join(subs)}\n")
