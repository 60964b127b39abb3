"""Word similarity: Spearman of the cosine between the two words' embeddings against gold scores.

Each word is embedded alone. A pair is *covered* when both words get a non-zero vector (a static encoder gives an
unknown word zeros): uncovered pairs are dropped and ``<set>_coverage`` is the share covered. Sets: SimLex-999,
WS-353, MEN, RW, SimVerb-3500, Multi-SimLex per language (a cell's parenthesised alternative dropped) and
cross-lingual Multi-SimLex ``xmsimlex_<l1>-<l2>`` (built as docs/design.md describes).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import datasets
from mirrorbert.evaluation.sts import PairSet, TaskMetrics, TextEncoder, encode_unique, paired_cosine, spearman

logger = logging.getLogger(__name__)

ENGLISH_SETS: tuple[str, ...] = ("simlex999", "ws353", "men", "rw", "simverb")
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
#: Published scales: SimLex-999, WS-353, RW and SimVerb 0-10, MEN 0-50, Multi-SimLex 0-6.
SCORE_RANGES = {"simlex999": (0.0, 10.0), "ws353": (0.0, 10.0), "rw": (0.0, 10.0), "simverb": (0.0, 10.0),
                "men": (0.0, 50.0), "multisimlex": (0.0, 6.0)}

_PAREN = re.compile(r"\s*\(.*?\)\s*")


@dataclass
class WordsimSettings:
    """The task's options, each an `--option wordsim.KEY=VALUE`: ``sets`` among the English sets and ``multisimlex``
    (default: all), Multi-SimLex ``languages`` (ISO codes or column names; default: every language of the file),
    ``cross_lingual`` pairs like ``en-fr`` (a list or a comma string), ``max_score_diff``: leave out the Multi-SimLex
    IDs whose two languages' scores differ by more (cross-lingual pairs only; default: none left out)."""

    sets: Sequence[str] | None = None
    languages: Sequence[str] | None = None
    cross_lingual: Sequence[str] | str | None = None
    max_score_diff: float | None = None


SETTINGS = WordsimSettings


def clean_word(cell: str) -> str:
    """Main form of a Multi-SimLex cell: drop parenthesised alternatives, normalise spaces."""
    return " ".join(_PAREN.sub(" ", cell).split())


def load_word_pairs(path: str | Path, score_range: tuple[float, float] | None = None) -> PairSet:
    """``w1 w2 score`` lines (TAB or spaces, no header); scores finite, and in ``score_range`` when given."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(read_text_lines(path), start=1):
        fields = [x.strip() for x in (line.split("\t") if "\t" in line else line.split())]
        if not any(fields):
            continue
        if len(fields) < 3:
            raise UserError(f"{path}:{lineno}: expected 'w1 w2 score', got {len(fields)} field(s)")
        rows.append((fields[0], fields[1], datasets.gold_score(fields[2], path, lineno, score_range)))
    return PairSet.of(rows)


def load_simlex(path: str | Path) -> PairSet:
    """Original SimLex-999.txt: header word1, word2, POS, SimLex999, ...; score from the SimLex999 column."""
    path = Path(path)
    rows = [line.split("\t") for line in read_text_lines(path)]
    if not rows or "SimLex999" not in rows[0]:
        raise UserError(f"{path}:1: expected a header with a 'SimLex999' column")
    i1, i2, iscore = (rows[0].index(column) for column in ("word1", "word2", "SimLex999"))
    pairs = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) <= max(i1, i2, iscore):
            raise UserError(f"{path}:{lineno}: too few fields ({len(row)})")
        score = datasets.gold_score(row[iscore], path, lineno, SCORE_RANGES["simlex999"])
        pairs.append((row[i1].strip(), row[i2].strip(), score))
    return PairSet.of(pairs)


def _lang_code(language: str, flag: str = "--wordsim-languages") -> str:
    lang = language.strip().lower()
    if lang in MSIMLEX_LANGUAGES:
        return lang
    for code, name in MSIMLEX_LANGUAGES.items():
        if name.lower() == lang:
            return code
    raise UserError(f"{flag}: unknown Multi-SimLex language {language!r}; known: {', '.join(MSIMLEX_LANGUAGES)}")


def load_multisimlex(path: str | Path) -> dict[str, list[tuple[str, str, float] | None]]:
    """Multi-SimLex table -> {iso code: [(w1, w2, score) or None per pair ID]} for the languages present: rows stay
    aligned by pair ID across languages, a cell empty in some language gives None there."""
    path = Path(path)
    rows = [line.split("\t") for line in read_text_lines(path)]
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
            score = datasets.gold_score(row[i3], path, lineno, SCORE_RANGES["multisimlex"])
            entries.append((a, b, score) if a and b else None)
        out[code] = entries
    if not out:
        raise UserError(f"{path}:1: no '<LANGUAGE>_1, <LANGUAGE>_2, <LANGUAGE>_score' columns found")
    return out


def cross_lingual_pairs(table: dict[str, list[tuple[str, str, float] | None]], lang1: str, lang2: str,
                        max_score_diff: float | None = None) -> PairSet:
    """Cross-lingual pairs (a1, b2) and (a2, b1) per pair ID, gold = mean of the two languages' scores."""
    rows = []
    for e1, e2 in zip(table[lang1], table[lang2]):
        if e1 is None or e2 is None or (max_score_diff is not None and abs(e1[2] - e2[2]) > max_score_diff):
            continue
        gold = (e1[2] + e2[2]) / 2.0
        rows += [(e1[0], e2[1], gold), (e2[0], e1[1], gold)]
    return PairSet.of(rows)


def score_word_pairs(
    encoder: TextEncoder, pairs: PairSet, batch_size: int = 64, show_progress: bool = False
) -> tuple[float, float]:
    """(Spearman of cosine over covered pairs, coverage); each distinct word is encoded once."""
    if len(pairs) == 0:
        return float("nan"), 0.0
    emb = encode_unique(encoder, pairs.s1 + pairs.s2, batch_size=batch_size, show_progress=show_progress)
    norms = np.linalg.norm(emb, axis=1)
    a, b = emb[: len(pairs)], emb[len(pairs) :]
    covered = (norms[: len(pairs)] > 0) & (norms[len(pairs) :] > 0)
    coverage = float(covered.mean())
    if covered.sum() < 2:
        return float("nan"), coverage
    return spearman(paired_cosine(a[covered], b[covered]), pairs.scores[covered]), coverage


def _load_english(name: str, path: Path) -> PairSet:
    return load_simlex(path) if name == "simlex999" else load_word_pairs(path, SCORE_RANGES[name])


def check_gold_files(data_dir: str | Path) -> None:
    """Every present word-similarity file read as the task reads it (gold scores checked), before any model loads."""
    for name in (*ENGLISH_SETS, "multisimlex"):
        path = Path(data_dir) / datasets.REGISTRY[name].folder / datasets.REGISTRY[name].files[0]
        if path.is_file() and name == "multisimlex":
            load_multisimlex(path)
        elif path.is_file():
            _load_english(name, path)


def _parse_pairs(cross_lingual: Iterable[str] | str | None) -> list[tuple[str, str]]:
    """The cross-lingual pairs asked for (a list or a comma string), as pairs of language codes."""
    specs = cross_lingual.split(",") if isinstance(cross_lingual, str) else list(cross_lingual or [])
    pairs = []
    for spec in [s for s in specs if s.strip()]:
        parts = re.split(r"[-_:]", spec.strip())
        if len(parts) != 2:
            raise UserError(f"--xling-pairs: cross-lingual pair {spec!r}: expected 'L1-L2', e.g. 'en-fr'")
        pairs.append((_lang_code(parts[0], "--xling-pairs"), _lang_code(parts[1], "--xling-pairs")))
    return pairs


def check_options(sets: Iterable[str] | None = None, languages: Iterable[str] | None = None,
                  cross_lingual: Iterable[str] | str | None = None, **_: Any) -> None:
    """The option values checked before any model loads (`--option`, `--wordsim-languages`, `--xling-pairs`)."""
    for name in sets or []:
        if name not in ENGLISH_SETS and name != "multisimlex":
            raise UserError(f"--option wordsim.sets: unknown word-similarity set {name!r}; known: "
                            f"{', '.join([*ENGLISH_SETS, 'multisimlex'])}")
    for language in languages or []:
        _lang_code(language)
    _parse_pairs(cross_lingual)


def evaluate_wordsim(encoder: TextEncoder, data_dir: str | Path | None = None, *,
                     settings: WordsimSettings | None = None, batch_size: int = 256, show_progress: bool = False,
                     **_: Any) -> TaskMetrics:
    """Word similarity task (its options: ``WordsimSettings``); ``primary`` = SimLex-999, else Multi-SimLex
    English, else the first set scored."""
    settings = settings or WordsimSettings()
    check_options(**asdict(settings))
    wanted = list(settings.sets) if settings.sets is not None else [*ENGLISH_SETS, "multisimlex"]
    xpairs = _parse_pairs(settings.cross_lingual)
    scoring = _Scoring(encoder, batch_size, show_progress)
    for name in wanted:
        folder = scoring.folder(data_dir, name) if name != "multisimlex" else None
        if folder is not None:
            scoring.record(name, _load_english(name, folder / datasets.REGISTRY[name].files[0]))
    if "multisimlex" in wanted or xpairs:
        monolingual = None if "multisimlex" in wanted else []  # None: every language of the file
        if monolingual is None and settings.languages is not None:
            monolingual = [_lang_code(x) for x in settings.languages]
        _score_multisimlex(scoring, data_dir, monolingual, xpairs, settings.max_score_diff)
    return scoring.with_primary()


@dataclass
class _Scoring:
    """The task's scores as its sets are scored (each with its coverage), and why the others were skipped."""

    encoder: TextEncoder
    batch_size: int
    show_progress: bool
    out: TaskMetrics = field(default_factory=TaskMetrics)

    def folder(self, data_dir: str | Path | None, name: str) -> Path | None:
        """The set's folder, or None with the reason it is skipped."""
        try:
            return datasets.require(data_dir, name)
        except DatasetMissing as exc:
            self.out.skipped[name] = str(exc)
            return None

    def record(self, key: str, pairs: PairSet) -> None:
        rho, cov = score_word_pairs(self.encoder, pairs, batch_size=self.batch_size, show_progress=self.show_progress)
        self.out[key] = rho
        self.out[f"{key}_coverage"] = cov
        if cov < 1.0:
            logger.info("%s: coverage %.4f (%d pairs)", key, cov, len(pairs))

    def with_primary(self) -> TaskMetrics:
        """The scores with ``primary``: SimLex-999, else Multi-SimLex English, else the first set scored."""
        out = self.out
        scored = [k for k in out if not k.endswith("_coverage")]
        if not scored:
            raise datasets.nothing_found("word-similarity set", list(out.skipped), list(out.skipped.values()))
        out["primary"] = next((out[key] for key in ("simlex999", "msimlex_en") if key in out), out[scored[0]])
        return out


def _score_multisimlex(scoring: _Scoring, data_dir: str | Path | None, monolingual: list[str] | None,
                       xpairs: list[tuple[str, str]], max_score_diff: float | None) -> None:
    """Multi-SimLex: the ``monolingual`` languages (None: all of the file) and the cross-lingual pairs ``xpairs``."""
    folder = scoring.folder(data_dir, "multisimlex")
    if folder is None:
        return
    table = load_multisimlex(folder / "multisimlex.tsv")
    for lang in list(table) if monolingual is None else monolingual:
        if lang not in table:
            scoring.out.skipped[f"msimlex_{lang}"] = f"language {lang} not in {folder / 'multisimlex.tsv'}"
            continue
        scoring.record(f"msimlex_{lang}", PairSet.of(e for e in table[lang] if e is not None))
    for l1, l2 in xpairs:
        absent = [x for x in (l1, l2) if x not in table]
        if absent:
            scoring.out.skipped[f"xmsimlex_{l1}-{l2}"] = f"language(s) {', '.join(absent)} not in Multi-SimLex file"
            continue
        scoring.record(f"xmsimlex_{l1}-{l2}", cross_lingual_pairs(table, l1, l2, max_score_diff))
