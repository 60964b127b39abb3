"""Isotropy of an embedding space, and how Mirror tuning separates similar from dissimilar pairs.

* IS (Mu & Viswanath, "All-but-the-top", ICLR 2018) of the raw vectors V: min_c Z(c) / max_c Z(c) with
  Z(c) = sum_i exp(c . v_i), over the unit eigenvectors c of V^T V and their opposites; near 1 for an isotropic
  cloud, near 0 when every vector points into one narrow cone.
* MVN: the norm of the mean of the unit-length vectors (0 = spread out, 1 = all identical).
* Plot: histograms of cos(s1, s2) of high- and low-scored STS-B test pairs, the model's beside a reference's.
The texts embedded default to the distinct sentences of the STS-B test split.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import UserError
from mirrorbert.evaluation.sts import (
    PairSet,
    TaskMetrics,
    TextEncoder,
    encode_unique,
    load_set,
    pair_similarities,
    paired_cosine,
    pyplot_figure,
    save_figure,
    unit_rows,
)

logger = logging.getLogger(__name__)


def isotropy_score(vectors: np.ndarray) -> float:
    """Mu & Viswanath's IS over the (signed) eigenvectors of V^T V; in (0, 1]."""
    from scipy.special import logsumexp

    v = np.asarray(vectors, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] < 2:
        raise UserError("isotropy needs a 2-d array of at least two vectors")
    _, eigvecs = np.linalg.eigh(v.T @ v)  # columns are unit eigenvectors
    proj = v @ eigvecs  # [n, d]: c . v_i for every eigenvector c
    log_z = np.concatenate([logsumexp(proj, axis=0), logsumexp(-proj, axis=0)])
    return float(np.exp(log_z.min() - log_z.max()))


def mean_vector_norm(vectors: np.ndarray) -> float:
    """Norm of the mean unit vector."""
    return float(np.linalg.norm(unit_rows(vectors).mean(axis=0)))


def plot_cosine_distributions(
    panels: dict[str, tuple[np.ndarray, np.ndarray]], path: str | Path, high: float, low: float
) -> Path:
    """One histogram panel per model: cosine of high- vs low-scored pairs."""
    fig, axes = pyplot_figure(ncols=len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    bins = np.linspace(-1.0, 1.0, 81)
    for ax, (label, (hi, lo)) in zip(axes[0], panels.items()):
        ax.hist(hi, bins=bins, alpha=0.6, density=True, label=f"gold >= {high:g} (n={len(hi)})", color="tab:blue")
        ax.hist(lo, bins=bins, alpha=0.6, density=True, label=f"gold <= {low:g} (n={len(lo)})", color="tab:red")
        ax.set_title(label)
        ax.set_xlabel("cosine similarity")
        ax.legend(loc="upper left", fontsize=8)
    axes[0][0].set_ylabel("density")
    fig.suptitle("STS-B test: cosine of high- vs low-scored pairs")
    return save_figure(fig, path, dpi=120)


@dataclass
class IsotropySettings:
    """What the isotropy task embeds and how it draws its plot: each field is an `--option isotropy.KEY=VALUE`."""

    texts: Sequence[str] | None = None  # the strings scored (default: the distinct STS-B test sentences)
    texts_file: str | Path | None = None  # or a text file of them, one a line
    max_texts: int | None = None  # a sample of at most this many, drawn with `seed`
    seed: int = 0
    high: float = 4.0  # gold score from which an STS-B pair counts as high-scored in the plot
    low: float = 1.0  # gold score up to which it counts as low-scored
    model_label: str | None = None  # the plot panels' titles
    reference_label: str | None = None


SETTINGS = IsotropySettings


@dataclass
class _Embedded:
    """The texts scored and each model's vectors of them ("" the evaluated model, "_before" the reference)."""

    texts: list[str]
    encoders: dict[str, TextEncoder]
    vectors: dict[str, np.ndarray]

    def pair_cosines(self, suffix: str, pairs: PairSet, batch_size: int) -> np.ndarray:
        """Cosine of each STS-B pair, from the vectors above when they hold both sides (no second encoding)."""
        row = {t: i for i, t in enumerate(self.texts)}
        if all(t in row for t in pairs.s1) and all(t in row for t in pairs.s2):
            vectors = self.vectors[suffix]
            return paired_cosine(vectors[[row[t] for t in pairs.s1]], vectors[[row[t] for t in pairs.s2]])
        return pair_similarities(self.encoders[suffix], pairs.s1, pairs.s2, batch_size=batch_size)


def evaluate_isotropy(
    encoder: TextEncoder,
    data_dir: str | Path | None = None,
    *,
    settings: IsotropySettings | None = None,
    reference_encoder: TextEncoder | None = None,
    plot_dir: str | Path | None = None,
    batch_size: int = 64,
    show_progress: bool = False,
    **_: Any,
) -> TaskMetrics:
    """IS (``primary``) and MVN of the model (and of ``reference_encoder`` as ``*_before``), with the plot:
    ``cos_gap`` (``cos_gap_before``) = mean cosine of high- minus low-scored STS-B pairs, the separation it shows."""
    settings = settings or IsotropySettings()
    texts, pairs = _texts(settings, data_dir)
    encoders: dict[str, TextEncoder] = {"": encoder}
    if reference_encoder is not None:
        encoders["_before"] = reference_encoder
    out = TaskMetrics()
    embedded = _Embedded(texts, encoders, {})
    for suffix, enc in encoders.items():
        embedded.vectors[suffix] = encode_unique(enc, texts, batch_size=batch_size, show_progress=show_progress)
        out[f"is{suffix}"] = isotropy_score(embedded.vectors[suffix])
        out[f"mvn{suffix}"] = mean_vector_norm(embedded.vectors[suffix])
    out["primary"] = out["is"]
    out["n_texts"] = float(len(texts))
    if plot_dir is not None:
        pairs = _plot_pairs(out, pairs, data_dir)
        if pairs is not None:
            _plot_cosines(out, embedded, pairs, settings, Path(plot_dir), batch_size)
    return out


def _texts(settings: IsotropySettings, data_dir: str | Path | None) -> tuple[list[str], PairSet | None]:
    """The texts scored, and the STS-B test pairs when the texts were taken from them (else None)."""
    pairs = None
    if settings.texts is not None:
        texts = list(settings.texts)
    elif settings.texts_file is not None:
        if not Path(settings.texts_file).is_file():
            raise UserError(f"isotropy texts file not found: {settings.texts_file}")
        texts = [line.strip() for line in read_text_lines(settings.texts_file) if line.strip()]
    else:
        pairs = load_set(data_dir, "stsb", "test")
        texts = list(dict.fromkeys(pairs.s1 + pairs.s2))
    if settings.max_texts is not None and len(texts) > settings.max_texts:
        rng = np.random.default_rng(settings.seed)
        texts = [texts[i] for i in sorted(rng.choice(len(texts), size=settings.max_texts, replace=False))]
    return texts, pairs


def _plot_pairs(out: TaskMetrics, pairs: PairSet | None, data_dir: str | Path | None) -> PairSet | None:
    """The STS-B test pairs the plot needs, or None with the reason in ``out.skipped`` (the scores still stand)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        out.skipped["cosine plot"] = 'needs matplotlib, which is not installed: pip install "mirrorbert[eval]"'
        logger.warning("isotropy: scores computed; the cosine plot %s", out.skipped["cosine plot"])
        return None
    if pairs is not None:
        return pairs
    try:
        return load_set(data_dir, "stsb", "test")
    except UserError as exc:  # DatasetMissing included
        out.skipped["cosine plot"] = str(exc)
        return None


def _plot_cosines(out: TaskMetrics, embedded: _Embedded, pairs: PairSet, settings: IsotropySettings, plot_dir: Path,
                  batch_size: int) -> None:
    """The cosine histograms of high- and low-scored pairs, one panel per model ("before" first), and cos_gap."""
    hi_mask, lo_mask = pairs.scores >= settings.high, pairs.scores <= settings.low
    name = settings.model_label or "evaluated model"
    labels = {"": f"after: {name}" if "_before" in embedded.encoders else name,
              "_before": f"before: {settings.reference_label or 'reference model'}"}
    panels: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for suffix in sorted(embedded.encoders, reverse=True):  # "_before" first
        sims = embedded.pair_cosines(suffix, pairs, batch_size)
        panels[labels[suffix]] = (sims[hi_mask], sims[lo_mask])
        out[f"cos_gap{suffix}"] = float(sims[hi_mask].mean() - sims[lo_mask].mean())
    path = plot_cosine_distributions(panels, plot_dir / "isotropy_cosine.png", settings.high, settings.low)
    out.artifacts["cosine distributions of high- vs low-scored STS-B pairs"] = str(path)
