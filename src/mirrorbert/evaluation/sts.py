"""Semantic textual similarity: Spearman x100 of cosine similarity, no trained regressor.

Protocols (as in SentEval / SimCSE / the Mirror-BERT paper):

* STS12-STS16, SentEval layout ``sts/STS1x-en-test/STS.input.<subset>.txt`` (``s1 TAB s2``) with
  ``STS.gs.<subset>.txt`` (one gold score per line; an empty gold line marks an unscored pair, which
  is dropped). The primary score of a year is the Spearman over all its subsets *pooled* ("all"
  aggregation); the unweighted and size-weighted means of the per-subset scores are reported too.
* STS-B test (``sts-test.csv``; ``sts-dev.csv`` reported as ``stsb_dev`` for model selection) and
  SICK-R test (``SICK_test_annotated.txt``, 4927 pairs).
* Other languages (``sts-es``, ``sts-ar``, ``sts-ru``, or any extra pair/score files) through the same
  pair/score loader.
* ``avg`` = mean over the available English sets among STS12-16, STS-B, SICK-R; when all seven are
  present it equals the paper's 7-set average and is also reported as ``avg7``.

This module also holds the small helpers shared by the other tasks (deduplicated encoding, row-wise
cosine, Spearman, the result type).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import datasets

logger = logging.getLogger(__name__)

ENGLISH_SETS: tuple[str, ...] = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
OTHER_LANGUAGE_SETS: tuple[str, ...] = ("sts-es", "sts-ar", "sts-ru")


class TextEncoder(Protocol):
    """The duck-typed encoder protocol used by every task."""

    def encode(
        self, texts: list[str], batch_size: int = 64, normalize: bool = False, show_progress: bool = False
    ) -> np.ndarray: ...


class TaskMetrics(dict):
    """A flat ``{metric: float}`` dict (with ``primary``) plus what the report needs besides numbers.

    ``skipped`` maps a sub-set that could not be evaluated to the reason (e.g. STS13 absent while
    STS-B ran); ``artifacts`` maps a label to a written file (plots).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped: dict[str, str] = {}
        self.artifacts: dict[str, str] = {}


# ------------------------------------------------------------------------------------------ helpers
def encode_unique(
    encoder: TextEncoder, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False
) -> np.ndarray:
    """Encode ``texts`` once per distinct string (STS sets repeat many sentences); rows in input order."""
    index: dict[str, int] = {}
    positions = np.empty(len(texts), dtype=np.int64)
    for i, t in enumerate(texts):
        positions[i] = index.setdefault(t, len(index))
    unique = list(index)
    if not unique:
        return np.zeros((0, 0), dtype=np.float32)
    emb = np.asarray(encoder.encode(unique, batch_size=batch_size, normalize=False, show_progress=show_progress))
    if emb.ndim != 2 or emb.shape[0] != len(unique):
        raise ValueError(f"encoder returned shape {emb.shape} for {len(unique)} texts")
    return emb.astype(np.float32, copy=False)[positions]


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit l2 norm; zero rows stay zero (cosine 0 with anything)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``a`` with row i of ``b``."""
    return np.einsum("ij,ij->i", unit_rows(a), unit_rows(b))


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (ties get average ranks); NaN when undefined (constant input)."""
    from scipy.stats import spearmanr

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(spearmanr(x, y).correlation)


def pair_similarities(
    encoder: TextEncoder, s1: Sequence[str], s2: Sequence[str], batch_size: int = 64, show_progress: bool = False
) -> np.ndarray:
    """Cosine similarity of each pair, encoding the union of both sides once."""
    emb = encode_unique(encoder, list(s1) + list(s2), batch_size=batch_size, show_progress=show_progress)
    return paired_cosine(emb[: len(s1)], emb[len(s1) :])


# ------------------------------------------------------------------------------------------ loaders
@dataclass
class PairSet:
    """Sentence pairs with gold similarity scores."""

    s1: list[str]
    s2: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.s1)


def _normalise_space(text: str) -> str:
    # SentEval splits sentences on whitespace and joins with single spaces before encoding.
    return " ".join(text.split())


def _read_lines(path: Path) -> list[str]:
    return read_text_lines(path)


#: SemEval STS and STS-B gold scores run from 0 to 5; SICK relatedness from 1 to 5, checked on the same 0-5
#: scale (a rescaled copy is not refused; NaN, infinity, -7 or 50 are).
STS_RANGE = (0.0, 5.0)
SICK_RANGE = STS_RANGE


def _to_float(value: str, path: Path, lineno: int, score_range: tuple[float, float] | None = STS_RANGE) -> float:
    return datasets.gold_score(value, path, lineno, score_range)


def load_pair_score(input_path: str | Path, gs_path: str | Path,
                    score_range: tuple[float, float] | None = STS_RANGE) -> PairSet:
    """SentEval pair/score layout: ``s1 TAB s2`` lines and a parallel gold file (empty gold = dropped).
    Gold scores must be finite and inside ``score_range`` (None: any finite number, for a user's own files)."""
    input_path, gs_path = Path(input_path), Path(gs_path)
    pairs = _read_lines(input_path)
    golds = _read_lines(gs_path)
    # Trailing empty lines at the end of the input file are not pairs.
    while pairs and not pairs[-1].strip() and len(pairs) > len(golds):
        pairs.pop()
    if len(pairs) < len(golds):
        golds_tail = golds[len(pairs) :]
        if any(g.strip() for g in golds_tail):
            raise UserError(f"{gs_path}: {len(golds)} gold lines but only {len(pairs)} pairs in {input_path}")
        golds = golds[: len(pairs)]
    if len(pairs) > len(golds):
        raise UserError(f"{input_path}: {len(pairs)} pairs but only {len(golds)} gold lines in {gs_path}")
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for lineno, (line, gold) in enumerate(zip(pairs, golds), start=1):
        if not gold.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise UserError(f"{input_path}:{lineno}: expected 's1 TAB s2', got {len(fields)} field(s)")
        s1.append(_normalise_space(fields[0]))
        s2.append(_normalise_space(fields[1]))
        scores.append(_to_float(gold.strip(), gs_path, lineno, score_range))
    return PairSet(s1, s2, np.asarray(scores, dtype=np.float64))


def load_stsb(path: str | Path) -> PairSet:
    """STS Benchmark csv: TAB fields genre, file, year, id, score, s1, s2 (extra trailing fields ignored)."""
    path = Path(path)
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise UserError(f"{path}:{lineno}: expected 7 TAB-separated fields, got {len(fields)}")
        scores.append(_to_float(fields[4], path, lineno))
        s1.append(_normalise_space(fields[5]))
        s2.append(_normalise_space(fields[6]))
    return PairSet(s1, s2, np.asarray(scores, dtype=np.float64))


def load_sick(path: str | Path) -> PairSet:
    """SICK (SentEval files): header, then pair_ID, sentence_A, sentence_B, relatedness_score, ..."""
    path = Path(path)
    lines = _read_lines(path)
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for lineno, line in enumerate(lines, start=1):
        if lineno == 1 and line.lower().startswith("pair_id"):
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 4:
            raise UserError(f"{path}:{lineno}: expected pair_ID, sentence_A, sentence_B, relatedness_score")
        s1.append(_normalise_space(fields[1]))
        s2.append(_normalise_space(fields[2]))
        scores.append(_to_float(fields[3], path, lineno, SICK_RANGE))
    return PairSet(s1, s2, np.asarray(scores, dtype=np.float64))


def load_sts_year(data_dir: str | Path | None, name: str) -> dict[str, PairSet]:
    """Subsets of one STS12-16 year that are present (raises DatasetMissing when none is)."""
    entry = datasets.info(name)
    folder = datasets.resolve_data_dir(data_dir) / entry.folder
    year = entry.folder.rsplit("/", 1)[-1].split("-", 1)[0]
    subsets: dict[str, PairSet] = {}
    for subset in datasets.STS_YEAR_SUBSETS[year]:
        inp, gs = folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"
        if inp.is_file() and gs.is_file():
            subsets[subset] = load_pair_score(inp, gs)
        else:
            logger.debug("%s: subset %s absent, skipped", name, subset)
    if not subsets:
        datasets.require(data_dir, name)  # raises with the full list of files and the source
    return subsets


# --------------------------------------------------------------------------------------------- task
def score_pairs(encoder: TextEncoder, pairs: PairSet, batch_size: int = 64, show_progress: bool = False) -> float:
    """Spearman (fraction, not x100) of cosine similarity against gold scores."""
    sims = pair_similarities(encoder, pairs.s1, pairs.s2, batch_size=batch_size, show_progress=show_progress)
    return spearman(sims, pairs.scores)


def _score_year(
    encoder: TextEncoder, subsets: dict[str, PairSet], batch_size: int, show_progress: bool
) -> dict[str, float]:
    sims_all: list[np.ndarray] = []
    gold_all: list[np.ndarray] = []
    per_subset: dict[str, float] = {}
    for subset, pairs in subsets.items():
        sims = pair_similarities(encoder, pairs.s1, pairs.s2, batch_size=batch_size, show_progress=show_progress)
        per_subset[subset] = spearman(sims, pairs.scores)
        sims_all.append(sims)
        gold_all.append(pairs.scores)
    sizes = np.array([len(p) for p in subsets.values()], dtype=np.float64)
    values = np.array(list(per_subset.values()), dtype=np.float64)
    out = {"all": spearman(np.concatenate(sims_all), np.concatenate(gold_all))}
    out["mean"] = float(values.mean())
    out["wmean"] = float((values * sizes).sum() / sizes.sum())
    out.update({f"{k}": v for k, v in per_subset.items()})
    out["n"] = float(sizes.sum())
    return out


def load_set(data_dir: str | Path | None, name: str, split: str = "test") -> PairSet:
    """One pair/score set of the registry by name (STS-B, SICK-R or an other-language set)."""
    if name == "stsb":
        fname = {"test": "sts-test.csv", "dev": "sts-dev.csv", "train": "sts-train.csv"}[split]
        folder = datasets.require(data_dir, "stsb", files=(fname,))
        return load_stsb(folder / fname)
    if name == "sickr":
        fname = {"test": "SICK_test_annotated.txt", "dev": "SICK_trial.txt", "train": "SICK_train.txt"}[split]
        folder = datasets.require(data_dir, "sickr", files=(fname,))
        return load_sick(folder / fname)
    entry = datasets.info(name)
    folder = datasets.require(data_dir, name)
    inputs = [f for f in entry.files if f.startswith("STS.input.")]
    gold = [f for f in entry.files if f.startswith("STS.gs.")]
    if len(inputs) != 1 or len(gold) != 1:
        raise UserError(f"registry entry {name!r} is not a single pair/score set")
    return load_pair_score(folder / inputs[0], folder / gold[0])


def check_gold_files(data_dir: str | Path) -> None:
    """Every present STS file of the data directory read as the task reads it (gold scores checked), before
    any model loads."""
    root = Path(data_dir)
    for name in ENGLISH_SETS + OTHER_LANGUAGE_SETS:
        entry = datasets.info(name)
        folder = root / entry.folder
        if name.upper() in datasets.STS_YEAR_SUBSETS:
            for subset in datasets.STS_YEAR_SUBSETS[name.upper()]:
                inp, gs = folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"
                if inp.is_file() and gs.is_file():
                    load_pair_score(inp, gs)
        elif name == "stsb":
            for fname in ("sts-test.csv", "sts-dev.csv"):
                if (folder / fname).is_file():
                    load_stsb(folder / fname)
        elif name == "sickr":
            if (folder / "SICK_test_annotated.txt").is_file():
                load_sick(folder / "SICK_test_annotated.txt")
        elif all((folder / f).is_file() for f in entry.files):
            load_set(root, name)


def stsb_dev_score(encoder: TextEncoder, data_dir: str | Path | None, batch_size: int = 64) -> float:
    """STS-B dev Spearman (fraction): the model-selection signal used during training."""
    return score_pairs(encoder, load_set(data_dir, "stsb", "dev"), batch_size=batch_size)


def check_options(sets: Iterable[str] | None = None, **_: Any) -> None:
    """The set names checked before any model loads (the runner calls this for `--sts-sets`/`--option`)."""
    for name in sets or []:
        if name not in datasets.REGISTRY or not (name in ENGLISH_SETS or name in OTHER_LANGUAGE_SETS):
            raise UserError(f"--sts-sets: unknown STS set {name!r}; known: "
                            f"{', '.join(ENGLISH_SETS + OTHER_LANGUAGE_SETS)}")


def evaluate_sts(
    encoder: TextEncoder,
    data_dir: str | Path | None = None,
    *,
    sets: Iterable[str] | None = None,
    include_dev: bool = True,
    extra: dict[str, tuple[str, str]] | None = None,
    batch_size: int = 64,
    show_progress: bool = False,
    **_: Any,
) -> TaskMetrics:
    """STS task: Spearman (fraction) per set, per-year aggregations, English average as ``primary``.

    ``sets`` defaults to the seven English sets plus the other-language ones; absent sets are listed in
    ``.skipped`` (other-language sets only when asked for explicitly). ``extra`` maps a name to
    ``(input_path, gold_path)`` files in the pair/score layout. Raises DatasetMissing if nothing ran.
    """
    explicit = sets is not None
    wanted = list(sets) if sets is not None else list(ENGLISH_SETS) + list(OTHER_LANGUAGE_SETS)
    for name in wanted:
        if name not in datasets.REGISTRY:
            raise UserError(f"unknown STS set {name!r}; known: {', '.join(ENGLISH_SETS + OTHER_LANGUAGE_SETS)}")
    out = TaskMetrics()
    messages: list[str] = []
    absent: list[str] = []
    for name in wanted:
        try:
            _score_set(out, encoder, data_dir, name, include_dev, batch_size, show_progress)
        except DatasetMissing as exc:
            messages.append(str(exc))
            if name in ENGLISH_SETS or explicit:
                out.skipped[name] = str(exc)
            absent.append(name)
            logger.debug("STS set %s skipped: %s", name, exc)
    if absent:  # one line, not one per optional set (details with -v)
        logger.info("STS: %d set(s) absent from the data directory, skipped: %s", len(absent), ", ".join(absent))
    for name, (inp, gs) in (extra or {}).items():
        for p in (inp, gs):
            if not Path(p).is_file():
                raise UserError(f"STS extra set {name!r}: file not found: {p}")
        out[name] = score_pairs(encoder, load_pair_score(inp, gs, score_range=None), batch_size=batch_size,
                                show_progress=show_progress)
    _set_primary(out, [*wanted, *(extra or {})], messages)
    if any(isinstance(v, float) and math.isnan(v) for v in out.values()):
        logger.warning("some STS scores are NaN (constant similarities or constant gold scores)")
    return out


def _score_set(out: TaskMetrics, encoder: TextEncoder, data_dir: str | Path | None, name: str, include_dev: bool,
               batch_size: int, show_progress: bool) -> None:
    """One set's scores into ``out``: a year's pooled subsets with their means, or a test split (STS-B's dev too)."""
    if name.upper() in datasets.STS_YEAR_SUBSETS:
        scores = _score_year(encoder, load_sts_year(data_dir, name), batch_size, show_progress)
        out[name] = scores.pop("all")
        for key, value in scores.items():
            out[f"{name}_{key}" if key in ("mean", "wmean", "n") else f"{name}/{key}"] = value
        return
    pairs = load_set(data_dir, name, "test")
    out[name] = score_pairs(encoder, pairs, batch_size=batch_size, show_progress=show_progress)
    out[f"{name}_n"] = float(len(pairs))
    if name == "stsb" and include_dev:
        try:
            out["stsb_dev"] = stsb_dev_score(encoder, data_dir, batch_size=batch_size)
        except DatasetMissing as exc:
            out.skipped["stsb_dev"] = str(exc)


def _set_primary(out: TaskMetrics, ran_names: list[str], messages: list[str]) -> None:
    """``primary``: the mean of the English sets scored (``avg``; ``avg7`` when all seven are), else of every
    set that ran; no set at all is DatasetMissing with each set's reason."""
    english = [out[n] for n in ENGLISH_SETS if n in out]
    if english:
        out["avg"] = float(np.mean(english))
        out["n_english_sets"] = float(len(english))
        if len(english) == len(ENGLISH_SETS):
            out["avg7"] = out["avg"]
        out["primary"] = out["avg"]
        return
    ran = [v for k, v in out.items() if k in ran_names]
    if not ran:
        raise DatasetMissing("no STS set found: " + " | ".join(messages))
    out["primary"] = float(np.mean(ran))
