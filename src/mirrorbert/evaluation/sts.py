"""Semantic textual similarity: Spearman of cosine similarity against gold scores, no trained regressor.

Sets: STS12-16 (a year's score pools its subsets; the unweighted and size-weighted subset means are reported
too), STS-B test (dev as ``stsb_dev``), SICK-R test, and other languages in the pair/score layout. ``avg`` is
the mean of the English sets present (``avg7`` when all seven are). The helpers the other tasks share (encoding
each distinct text once, row-wise cosine, Spearman, the result type) are here too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
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
    """A flat ``{metric: float}`` dict (with ``primary``); ``skipped`` maps a part not evaluated to the reason (STS13
    absent while STS-B ran), ``artifacts`` a label to a written file (plots)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped: dict[str, str] = {}
        self.artifacts: dict[str, str] = {}


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


def pyplot_figure(**kwargs: Any) -> tuple[Any, Any]:
    """``matplotlib.pyplot.subplots(**kwargs)`` drawn off-screen (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(**kwargs)


def save_figure(fig: Any, path: str | Path, dpi: int) -> Path:
    """``fig`` laid out, written to ``path`` as a PNG (its folder made) and closed."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


@dataclass
class PairSet:
    """Text pairs (sentences or words) with gold similarity scores."""

    s1: list[str]
    s2: list[str]
    scores: np.ndarray

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str, float]]) -> PairSet:
        """From (text 1, text 2, gold score) rows."""
        rows = list(rows)
        return cls([r[0] for r in rows], [r[1] for r in rows], np.asarray([r[2] for r in rows], dtype=np.float64))

    def __len__(self) -> int:
        return len(self.s1)


def _space(text: str) -> str:
    """Whitespace runs as one space, as SentEval joins the tokens of a sentence."""
    return " ".join(text.split())


#: SemEval STS and STS-B gold scores run from 0 to 5; SICK relatedness from 1 to 5, checked on the same 0-5
#: scale (a rescaled copy is not refused; NaN, infinity, -7 or 50 are).
STS_RANGE = (0.0, 5.0)


def load_pair_score(input_path: str | Path, gs_path: str | Path,
                    score_range: tuple[float, float] | None = STS_RANGE) -> PairSet:
    """SentEval pair/score layout: ``s1 TAB s2`` lines and a parallel gold file (empty gold = dropped).
    Gold scores must be finite and inside ``score_range`` (None: any finite number, for a user's own files)."""
    input_path, gs_path = Path(input_path), Path(gs_path)
    pairs, golds = read_text_lines(input_path), read_text_lines(gs_path)
    while pairs and not pairs[-1].strip() and len(pairs) > len(golds):  # trailing empty lines are not pairs
        pairs.pop()
    if len(pairs) < len(golds) and not any(g.strip() for g in golds[len(pairs):]):
        golds = golds[: len(pairs)]
    if len(pairs) != len(golds):
        raise UserError(f"{input_path}: {len(pairs)} pairs but {len(golds)} gold lines in {gs_path}")
    rows = []
    for lineno, (line, gold) in enumerate(zip(pairs, golds), start=1):
        if not gold.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise UserError(f"{input_path}:{lineno}: expected 's1 TAB s2', got {len(fields)} field(s)")
        rows.append((_space(fields[0]), _space(fields[1]), datasets.gold_score(gold, gs_path, lineno, score_range)))
    return PairSet.of(rows)


def _tab_rows(path: Path, width: int, expected: str, header: str = "") -> Iterator[tuple[int, list[str]]]:
    """(line number, TAB fields) of each non-empty line, a first line starting with ``header`` skipped; fewer
    than ``width`` fields is an error naming the file and line."""
    for lineno, line in enumerate(read_text_lines(path), start=1):
        if not line.strip() or (lineno == 1 and header and line.lower().startswith(header)):
            continue
        fields = line.split("\t")
        if len(fields) < width:
            raise UserError(f"{path}:{lineno}: expected {expected}, got {len(fields)} field(s)")
        yield lineno, fields


def load_stsb(path: str | Path) -> PairSet:
    """STS Benchmark csv: TAB fields genre, file, year, id, score, s1, s2 (extra trailing fields ignored)."""
    return PairSet.of((_space(f[5]), _space(f[6]), datasets.gold_score(f[4], path, n, STS_RANGE))
                      for n, f in _tab_rows(Path(path), 7, "7 TAB-separated fields"))


def load_sick(path: str | Path) -> PairSet:
    """SICK (SentEval files): header, then pair_ID, sentence_A, sentence_B, relatedness_score, ..."""
    return PairSet.of((_space(f[1]), _space(f[2]), datasets.gold_score(f[3], path, n, STS_RANGE))
                      for n, f in _tab_rows(Path(path), 4, "pair_ID, sentence_A, sentence_B, relatedness_score",
                                            header="pair_id"))


def load_sts_year(data_dir: str | Path | None, name: str) -> dict[str, PairSet]:
    """Subsets of one STS12-16 year that are present (raises DatasetMissing when none is)."""
    folder = datasets.resolve_data_dir(data_dir) / datasets.info(name).folder
    subsets = {subset: load_pair_score(folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt")
               for subset in datasets.STS_YEAR_SUBSETS[name.upper()]
               if (folder / f"STS.input.{subset}.txt").is_file() and (folder / f"STS.gs.{subset}.txt").is_file()}
    if not subsets:
        datasets.require(data_dir, name)  # raises with the full list of files and the source
    return subsets


def score_pairs(encoder: TextEncoder, pairs: PairSet, batch_size: int = 64, show_progress: bool = False) -> float:
    """Spearman (fraction, not x100) of cosine similarity against gold scores."""
    sims = pair_similarities(encoder, pairs.s1, pairs.s2, batch_size=batch_size, show_progress=show_progress)
    return spearman(sims, pairs.scores)


def _score_year(out: TaskMetrics, encoder: TextEncoder, name: str, subsets: dict[str, PairSet], batch_size: int,
                show_progress: bool) -> None:
    """A year's Spearman over its subsets pooled, per subset, and the unweighted and size-weighted subset means."""
    sims = [pair_similarities(encoder, p.s1, p.s2, batch_size=batch_size, show_progress=show_progress)
            for p in subsets.values()]
    per_subset = np.array([spearman(s, p.scores) for s, p in zip(sims, subsets.values())])
    sizes = np.array([len(p) for p in subsets.values()], dtype=np.float64)
    out[name] = spearman(np.concatenate(sims), np.concatenate([p.scores for p in subsets.values()]))
    out[f"{name}_mean"] = float(per_subset.mean())
    out[f"{name}_wmean"] = float((per_subset * sizes).sum() / sizes.sum())
    out.update({f"{name}/{subset}": float(v) for subset, v in zip(subsets, per_subset)})
    out[f"{name}_n"] = float(sizes.sum())


#: The sets with splits: their loader and each split's file.
_SPLIT_FILES = {
    "stsb": (load_stsb, {"test": "sts-test.csv", "dev": "sts-dev.csv", "train": "sts-train.csv"}),
    "sickr": (load_sick, {"test": "SICK_test_annotated.txt", "dev": "SICK_trial.txt", "train": "SICK_train.txt"}),
}


def load_set(data_dir: str | Path | None, name: str, split: str = "test") -> PairSet:
    """One pair/score set of the registry by name (STS-B, SICK-R or an other-language set)."""
    if name in _SPLIT_FILES:
        loader, files = _SPLIT_FILES[name]
        return loader(datasets.require(data_dir, name, files=(files[split],)) / files[split])
    inputs, gold = datasets.info(name).files  # the pair/score layout: STS.input.*, STS.gs.*
    folder = datasets.require(data_dir, name)
    return load_pair_score(folder / inputs, folder / gold)


def check_gold_files(data_dir: str | Path) -> None:
    """Every present STS file read as the task reads it (gold scores checked), before any model loads."""
    for name in ENGLISH_SETS + OTHER_LANGUAGE_SETS:
        for split in ("test", "dev") if name == "stsb" else ("test",):
            try:
                if name.upper() in datasets.STS_YEAR_SUBSETS:
                    load_sts_year(data_dir, name)
                else:
                    load_set(data_dir, name, split)
            except DatasetMissing:
                continue


def check_options(sets: Iterable[str] | None = None, **_: Any) -> None:
    """The set names checked before any model loads (the runner calls this for `--sts-sets`/`--option`)."""
    for name in sets or []:
        if name not in ENGLISH_SETS + OTHER_LANGUAGE_SETS:
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
    """Spearman (fraction) per set, per-year aggregations, the English average as ``primary``. ``sets``: default the
    English and other-language sets, absent ones in ``.skipped`` (other-language ones only when named); ``extra``:
    name -> ``(input_path, gold_path)`` in the pair/score layout. DatasetMissing if nothing ran."""
    check_options(sets)
    explicit = sets is not None
    wanted = list(sets) if sets is not None else list(ENGLISH_SETS) + list(OTHER_LANGUAGE_SETS)
    out = TaskMetrics()
    absent: dict[str, str] = {}
    for name in wanted:
        try:
            _score_set(out, encoder, data_dir, name, include_dev, batch_size, show_progress)
        except DatasetMissing as exc:
            absent[name] = str(exc)
            if name in ENGLISH_SETS or explicit:
                out.skipped[name] = str(exc)
            logger.debug("STS set %s skipped: %s", name, exc)
    if absent:  # one line, not one per optional set (details with -v)
        logger.info("STS: %d set(s) absent from the data directory, skipped: %s", len(absent), ", ".join(absent))
    for name, (inp, gs) in (extra or {}).items():
        for p in (inp, gs):
            if not Path(p).is_file():
                raise UserError(f"STS extra set {name!r}: file not found: {p}")
        out[name] = score_pairs(encoder, load_pair_score(inp, gs, score_range=None), batch_size=batch_size,
                                show_progress=show_progress)
    _set_primary(out, [*wanted, *(extra or {})], list(absent.values()))
    return out


def _score_set(out: TaskMetrics, encoder: TextEncoder, data_dir: str | Path | None, name: str, include_dev: bool,
               batch_size: int, show_progress: bool) -> None:
    """One set's scores into ``out``: a year's pooled subsets with their means, or a test split (STS-B's dev too)."""
    if name.upper() in datasets.STS_YEAR_SUBSETS:
        _score_year(out, encoder, name, load_sts_year(data_dir, name), batch_size, show_progress)
        return
    pairs = load_set(data_dir, name, "test")
    out[name] = score_pairs(encoder, pairs, batch_size=batch_size, show_progress=show_progress)
    out[f"{name}_n"] = float(len(pairs))
    if name == "stsb" and include_dev:
        try:
            out["stsb_dev"] = score_pairs(encoder, load_set(data_dir, "stsb", "dev"), batch_size=batch_size)
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
        raise datasets.nothing_found("STS set", ran_names, messages)
    out["primary"] = float(np.mean(ran))
