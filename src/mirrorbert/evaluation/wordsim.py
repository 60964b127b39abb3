"""Word similarity: Spearman x100 of the cosine between the two words' embeddings against gold scores.

Each word is embedded alone (the encoder sees the bare word string, as in the Mirror-BERT paper).
A pair is *covered* when both words get a non-zero vector; static-vector encoders return zeros for
out-of-vocabulary words, so uncovered pairs are dropped and ``<set>_coverage`` = covered / total is
reported (contextual encoders always cover everything).

Sets: SimLex-999, WS-353 (all), MEN (3k), RW (Stanford), SimVerb-3500 and Multi-SimLex in every
language of ``wordsim/multisimlex.tsv``. Multi-SimLex cells sometimes carry a translator's alternative
in parentheses (``"käsi (käsivars)"``); only the main form before the parenthesis is used.

Cross-lingual Multi-SimLex (``xmsimlex_<l1>-<l2>``): Multi-SimLex aligns the same concept pairs across
languages (one row per pair ID), so for languages L1, L2 and pair ID i with words (a1, b1) in L1 and
(a2, b2) in L2 we build the two cross-lingual pairs (a1, b2) and (a2, b1). Their gold score is the mean
of the two monolingual gold scores of pair i, the construction of Camacho-Collados et al. (2015) used by
Vulić et al. (2020) for the cross-lingual Multi-SimLex sets (both languages share the 0-6 scale).
Pairs missing a word or a score in either language are left out. ``max_score_diff`` optionally drops
IDs whose two monolingual scores differ by more than that amount (off by default).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import datasets
from mirrorbert.evaluation.sts import TaskMetrics, TextEncoder, encode_unique, spearman, unit_rows

logger = logging.getLogger(__name__)

#: English sets: registry name -> loader kind.
ENGLISH_SETS: dict[str, str] = {
    "simlex999": "simlex",
    "ws353": "plain",
    "men": "plain",
    "rw": "plain",
    "simverb": "plain",
}

#: Multi-SimLex column prefixes and ISO codes.
MSIMLEX_LANGUAGES: dict[str, str] = {
    "en": "ENGLISH",
    "ar": "ARABIC",
    "zh": "CHINESE",
    "cy": "WELSH",
    "et": "ESTONIAN",
    "fi": "FINNISH",
    "fr": "FRENCH",
    "he": "HEBREW",
    "pl": "POLISH",
    "ru": "RUSSIAN",
    "es": "SPANISH",
    "yue": "CANTONESE",
}
#: The eight Multi-SimLex languages of the Mirror-BERT paper's word-similarity table.
PAPER_LANGUAGES: tuple[str, ...] = ("en", "fr", "et", "ar", "zh", "ru", "es", "pl")

_PAREN = re.compile(r"\s*\(.*?\)\s*")


@dataclass
class WordPairs:
    """Word pairs with gold scores."""

    w1: list[str]
    w2: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.w1)


def clean_word(cell: str) -> str:
    """Main form of a Multi-SimLex cell: drop parenthesised alternatives, normalise spaces."""
    return " ".join(_PAREN.sub(" ", cell).split())


def _read_rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in read_text_lines(path)]


#: Published scales: SimLex-999, WS-353, RW and SimVerb 0-10, MEN 0-50, Multi-SimLex 0-6.
SCORE_RANGES = {"simlex999": (0.0, 10.0), "ws353": (0.0, 10.0), "rw": (0.0, 10.0), "simverb": (0.0, 10.0),
                "men": (0.0, 50.0), "multisimlex": (0.0, 6.0)}


def _float(value: str, path: Path, lineno: int, score_range: tuple[float, float] | None = None) -> float:
    return datasets.gold_score(value, path, lineno, score_range)


def load_word_pairs(path: str | Path, score_range: tuple[float, float] | None = None) -> WordPairs:
    """``w1 w2 score`` per line (TAB or spaces; eval-word-vectors layout), no header; scores finite (and in
    ``score_range`` when given)."""
    path = Path(path)
    w1: list[str] = []
    w2: list[str] = []
    scores: list[float] = []
    for lineno, line in enumerate(read_text_lines(path), start=1):
        fields = line.split("\t") if "\t" in line else line.split()
        fields = [x.strip() for x in fields]
        if not any(fields):
            continue
        if len(fields) < 3:
            raise UserError(f"{path}:{lineno}: expected 'w1 w2 score', got {len(fields)} field(s)")
        w1.append(fields[0])
        w2.append(fields[1])
        scores.append(_float(fields[2], path, lineno, score_range))
    return WordPairs(w1, w2, np.asarray(scores, dtype=np.float64))


def load_simlex(path: str | Path) -> WordPairs:
    """Original SimLex-999.txt: header word1, word2, POS, SimLex999, ...; score from the SimLex999 column."""
    path = Path(path)
    rows = _read_rows(path)
    if not rows or "SimLex999" not in rows[0]:
        raise UserError(f"{path}:1: expected a header with a 'SimLex999' column")
    header = rows[0]
    i1, i2, iscore = header.index("word1"), header.index("word2"), header.index("SimLex999")
    w1: list[str] = []
    w2: list[str] = []
    scores: list[float] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) <= max(i1, i2, iscore):
            raise UserError(f"{path}:{lineno}: too few fields ({len(row)})")
        w1.append(row[i1].strip())
        w2.append(row[i2].strip())
        scores.append(_float(row[iscore], path, lineno, SCORE_RANGES["simlex999"]))
    return WordPairs(w1, w2, np.asarray(scores, dtype=np.float64))


def _lang_code(language: str) -> str:
    lang = language.strip().lower()
    if lang in MSIMLEX_LANGUAGES:
        return lang
    for code, name in MSIMLEX_LANGUAGES.items():
        if name.lower() == lang:
            return code
    raise UserError(f"unknown Multi-SimLex language {language!r}; known: {', '.join(MSIMLEX_LANGUAGES)}")


def load_multisimlex(path: str | Path) -> dict[str, list[tuple[str, str, float] | None]]:
    """Multi-SimLex table -> {iso code: [(w1, w2, score) or None per pair ID]} for languages present.

    Rows stay aligned by pair ID across languages (needed for the cross-lingual variant); a cell that
    is empty in some language gives None there.
    """
    path = Path(path)
    rows = _read_rows(path)
    if not rows:
        raise UserError(f"{path}: empty file")
    header = [h.strip() for h in rows[0]]
    out: dict[str, list[tuple[str, str, float] | None]] = {}
    for code, name in MSIMLEX_LANGUAGES.items():
        cols = (f"{name}_1", f"{name}_2", f"{name}_score")
        if not all(c in header for c in cols):
            continue
        i1, i2, i3 = (header.index(c) for c in cols)
        entries: list[tuple[str, str, float] | None] = []
        for lineno, row in enumerate(rows[1:], start=2):
            if not any(c.strip() for c in row):
                continue
            if len(row) <= max(i1, i2, i3) or not row[i3].strip():
                entries.append(None)
                continue
            a, b = clean_word(row[i1]), clean_word(row[i2])
            entries.append((a, b, _float(row[i3], path, lineno, SCORE_RANGES["multisimlex"])) if a and b else None)
        out[code] = entries
    if not out:
        raise UserError(f"{path}:1: no '<LANGUAGE>_1, <LANGUAGE>_2, <LANGUAGE>_score' columns found")
    return out


def monolingual_pairs(table: dict[str, list[tuple[str, str, float] | None]], lang: str) -> WordPairs:
    """Multi-SimLex pairs of one language."""
    entries = [e for e in table[lang] if e is not None]
    return WordPairs([e[0] for e in entries], [e[1] for e in entries], np.array([e[2] for e in entries]))


def cross_lingual_pairs(
    table: dict[str, list[tuple[str, str, float] | None]],
    lang1: str,
    lang2: str,
    max_score_diff: float | None = None,
) -> WordPairs:
    """Cross-lingual pairs (a1, b2) and (a2, b1) per pair ID, gold = mean of the two languages' scores."""
    w1: list[str] = []
    w2: list[str] = []
    scores: list[float] = []
    for e1, e2 in zip(table[lang1], table[lang2]):
        if e1 is None or e2 is None:
            continue
        if max_score_diff is not None and abs(e1[2] - e2[2]) > max_score_diff:
            continue
        gold = (e1[2] + e2[2]) / 2.0
        w1 += [e1[0], e2[0]]
        w2 += [e2[1], e1[1]]
        scores += [gold, gold]
    return WordPairs(w1, w2, np.asarray(scores, dtype=np.float64))


def score_word_pairs(
    encoder: TextEncoder, pairs: WordPairs, batch_size: int = 64, show_progress: bool = False
) -> tuple[float, float]:
    """(Spearman of cosine over covered pairs, coverage); each distinct word is encoded once."""
    if len(pairs) == 0:
        return float("nan"), 0.0
    emb = encode_unique(encoder, pairs.w1 + pairs.w2, batch_size=batch_size, show_progress=show_progress)
    norms = np.linalg.norm(emb, axis=1)
    a, b = emb[: len(pairs)], emb[len(pairs) :]
    covered = (norms[: len(pairs)] > 0) & (norms[len(pairs) :] > 0)
    coverage = float(covered.mean())
    if covered.sum() < 2:
        return float("nan"), coverage
    sims = np.einsum("ij,ij->i", unit_rows(a[covered]), unit_rows(b[covered]))
    return spearman(sims, pairs.scores[covered]), coverage


def _load_english(name: str, path: Path) -> WordPairs:
    if ENGLISH_SETS[name] == "simlex":
        return load_simlex(path)
    return load_word_pairs(path, SCORE_RANGES.get(name))


def check_gold_files(data_dir: str | Path) -> None:
    """Every present word-similarity file read as the task reads it (gold scores checked), before any model
    loads."""
    root = Path(data_dir)
    for name in ENGLISH_SETS:
        path = root / datasets.REGISTRY[name].folder / datasets.REGISTRY[name].files[0]
        if path.is_file():
            _load_english(name, path)
    path = root / datasets.REGISTRY["multisimlex"].folder / "multisimlex.tsv"
    if path.is_file():
        load_multisimlex(path)


def _parse_pair(spec: str) -> tuple[str, str]:
    parts = re.split(r"[-_:]", spec.strip())
    if len(parts) != 2:
        raise UserError(f"cross-lingual pair {spec!r}: expected 'L1-L2', e.g. 'en-fr'")
    return _lang_code(parts[0]), _lang_code(parts[1])


def check_options(sets: Iterable[str] | None = None, languages: Iterable[str] | None = None,
                  cross_lingual: Iterable[str] | str | None = None, **_: Any) -> None:
    """The option values checked before any model loads (the runner calls this for `--option`,
    `--wordsim-languages` and `--xling-pairs`)."""
    for name in sets or []:
        if name not in ENGLISH_SETS and name != "multisimlex":
            raise UserError(f"--option wordsim.sets: unknown word-similarity set {name!r}; known: "
                            f"{', '.join([*ENGLISH_SETS, 'multisimlex'])}")
    try:
        for language in languages or []:
            _lang_code(language)
    except UserError as exc:
        raise UserError(f"--wordsim-languages: {exc}") from None
    if isinstance(cross_lingual, str):
        cross_lingual = [p for p in cross_lingual.split(",") if p.strip()]
    try:
        for pair in cross_lingual or []:
            _parse_pair(pair)
    except UserError as exc:
        raise UserError(f"--xling-pairs: {exc}") from None


def evaluate_wordsim(
    encoder: TextEncoder,
    data_dir: str | Path | None = None,
    *,
    sets: Iterable[str] | None = None,
    languages: Iterable[str] | None = None,
    cross_lingual: Iterable[str] | str | None = None,
    max_score_diff: float | None = None,
    batch_size: int = 256,
    show_progress: bool = False,
    **_: Any,
) -> TaskMetrics:
    """Word similarity task; ``primary`` = SimLex-999 (else Multi-SimLex English, else the first set run).

    ``sets`` chooses among the English sets and ``multisimlex`` (default: all); ``languages`` the
    Multi-SimLex languages (ISO codes or column names; default: every language in the file);
    ``cross_lingual`` a list (or comma string) of pairs like ``en-fr``.
    """
    wanted = list(sets) if sets is not None else [*ENGLISH_SETS, "multisimlex"]
    for name in wanted:
        if name not in ENGLISH_SETS and name != "multisimlex":
            raise UserError(f"unknown word-similarity set {name!r}; known: {', '.join([*ENGLISH_SETS, 'multisimlex'])}")
    if isinstance(cross_lingual, str):
        cross_lingual = [p for p in cross_lingual.split(",") if p.strip()]
    xpairs = [_parse_pair(p) for p in (cross_lingual or [])]
    scoring = _Scoring(encoder, batch_size, show_progress)
    for name in wanted:
        if name != "multisimlex":
            _score_english(scoring, data_dir, name)
    if "multisimlex" in wanted or xpairs:
        monolingual = None if "multisimlex" in wanted else []  # None: every language of the file
        if monolingual is None and languages is not None:
            monolingual = [_lang_code(x) for x in languages]
        _score_multisimlex(scoring, data_dir, monolingual, xpairs, max_score_diff)
    return scoring.with_primary()


@dataclass
class _Scoring:
    """The task's scores as its sets are scored (each with its coverage), and why the others were skipped."""

    encoder: TextEncoder
    batch_size: int
    show_progress: bool
    out: TaskMetrics = field(default_factory=TaskMetrics)
    messages: list[str] = field(default_factory=list)

    def record(self, key: str, pairs: WordPairs) -> None:
        rho, cov = score_word_pairs(self.encoder, pairs, batch_size=self.batch_size, show_progress=self.show_progress)
        self.out[key] = rho
        self.out[f"{key}_coverage"] = cov
        if cov < 1.0:
            logger.info("%s: coverage %.4f (%d pairs)", key, cov, len(pairs))

    def missing(self, name: str, exc: DatasetMissing) -> None:
        self.out.skipped[name] = str(exc)
        self.messages.append(str(exc))

    def with_primary(self) -> TaskMetrics:
        """The scores with ``primary``: SimLex-999, else Multi-SimLex English, else the first set scored."""
        out = self.out
        scored = [k for k in out if not k.endswith("_coverage")]
        if not scored:
            raise DatasetMissing("no word-similarity set found: " +
                                 " | ".join(self.messages or list(out.skipped.values())))
        out["primary"] = next((out[key] for key in ("simlex999", "msimlex_en") if key in out), out[scored[0]])
        return out


def _score_english(scoring: _Scoring, data_dir: str | Path | None, name: str) -> None:
    try:
        folder = datasets.require(data_dir, name)
    except DatasetMissing as exc:
        scoring.missing(name, exc)
        return
    scoring.record(name, _load_english(name, folder / datasets.REGISTRY[name].files[0]))


def _score_multisimlex(scoring: _Scoring, data_dir: str | Path | None, monolingual: list[str] | None,
                       xpairs: list[tuple[str, str]], max_score_diff: float | None) -> None:
    """Multi-SimLex: the ``monolingual`` languages (None: every language of the file) and the cross-lingual
    pairs ``xpairs``."""
    try:
        folder = datasets.require(data_dir, "multisimlex")
    except DatasetMissing as exc:
        scoring.missing("multisimlex", exc)
        return
    table = load_multisimlex(folder / "multisimlex.tsv")
    for lang in list(table) if monolingual is None else monolingual:
        if lang not in table:
            scoring.out.skipped[f"msimlex_{lang}"] = f"language {lang} not in {folder / 'multisimlex.tsv'}"
            continue
        scoring.record(f"msimlex_{lang}", monolingual_pairs(table, lang))
    for l1, l2 in xpairs:
        absent = [x for x in (l1, l2) if x not in table]
        if absent:
            scoring.out.skipped[f"xmsimlex_{l1}-{l2}"] = f"language(s) {', '.join(absent)} not in Multi-SimLex file"
            continue
        scoring.record(f"xmsimlex_{l1}-{l2}", cross_lingual_pairs(table, l1, l2, max_score_diff))
