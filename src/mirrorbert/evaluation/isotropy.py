"""Isotropy of an embedding space, and how Mirror tuning separates similar from dissimilar pairs.

* IS (Mu & Viswanath, "All-but-the-top", ICLR 2018): with the partition function
  Z(c) = sum_i exp(c . v_i), IS(V) = min_c Z(c) / max_c Z(c) over the unit eigenvectors c of V^T V.
  An eigenvector is only defined up to sign, so both c and -c are included (this also makes the score
  independent of the sign convention of the eigen-solver). IS is close to 1 for an isotropic cloud
  and close to 0 when all vectors point into one narrow cone (the anisotropy of raw MLM outputs).
  Computed in log space (log-sum-exp) so large norms do not overflow. Raw (unnormalised) vectors.
* MVN: l2 norm of the mean of the unit-normalised vectors (0 = spread out, 1 = all identical).
* Plot: histograms of cos(s1, s2) for high-scored (gold >= ``high``) and low-scored (gold <= ``low``)
  STS-B test pairs, for the evaluated model and, when given, a reference "before" model
  (the off-the-shelf MLM before Mirror tuning), side by side.

The embedded text set defaults to the distinct sentences of the STS-B test split.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import UserError
from mirrorbert.evaluation.sts import (
    TaskMetrics,
    TextEncoder,
    encode_unique,
    load_set,
    pair_similarities,
    paired_cosine,
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


def _matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def mean_vector_norm(vectors: np.ndarray) -> float:
    """Norm of the mean unit vector."""
    return float(np.linalg.norm(unit_rows(vectors).mean(axis=0)))


def plot_cosine_distributions(
    panels: dict[str, tuple[np.ndarray, np.ndarray]], path: str | Path, high: float, low: float
) -> Path:
    """One histogram panel per model: cosine of high- vs low-scored pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=False)
    bins = np.linspace(-1.0, 1.0, 81)
    for ax, (label, (hi, lo)) in zip(axes[0], panels.items()):
        ax.hist(hi, bins=bins, alpha=0.6, density=True, label=f"gold >= {high:g} (n={len(hi)})", color="tab:blue")
        ax.hist(lo, bins=bins, alpha=0.6, density=True, label=f"gold <= {low:g} (n={len(lo)})", color="tab:red")
        ax.set_title(label)
        ax.set_xlabel("cosine similarity")
        ax.legend(loc="upper left", fontsize=8)
    axes[0][0].set_ylabel("density")
    fig.suptitle("STS-B test: cosine of high- vs low-scored pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _read_texts(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"isotropy texts file not found: {path}")
    return [line.strip() for line in read_text_lines(path) if line.strip()]


def evaluate_isotropy(
    encoder: TextEncoder,
    data_dir: str | Path | None = None,
    *,
    texts: Sequence[str] | None = None,
    texts_file: str | Path | None = None,
    max_texts: int | None = None,
    reference_encoder: TextEncoder | None = None,
    model_label: str | None = None,
    reference_label: str | None = None,
    plot_dir: str | Path | None = None,
    high: float = 4.0,
    low: float = 1.0,
    batch_size: int = 64,
    show_progress: bool = False,
    seed: int = 0,
    **_: Any,
) -> TaskMetrics:
    """IS (``primary``) and MVN of the model (and of ``reference_encoder`` as ``*_before``), plus the plot.

    ``cos_gap`` (and ``cos_gap_before``) = mean cosine of high-scored minus low-scored STS-B pairs, the
    separation the plot shows. ``model_label`` / ``reference_label`` title the plot panels.
    """
    pairs = None
    if texts is None and texts_file is None:
        pairs = load_set(data_dir, "stsb", "test")
        texts = list(dict.fromkeys(pairs.s1 + pairs.s2))
    elif texts is None:
        texts = _read_texts(texts_file)  # type: ignore[arg-type]
    texts = list(texts)
    if max_texts is not None and len(texts) > max_texts:
        rng = np.random.default_rng(seed)
        texts = [texts[i] for i in sorted(rng.choice(len(texts), size=max_texts, replace=False))]
    encoders: dict[str, TextEncoder] = {"": encoder}
    if reference_encoder is not None:
        encoders["_before"] = reference_encoder
    out = TaskMetrics()
    embeddings: dict[str, np.ndarray] = {}
    for suffix, enc in encoders.items():
        embeddings[suffix] = encode_unique(enc, texts, batch_size=batch_size, show_progress=show_progress)
        out[f"is{suffix}"] = isotropy_score(embeddings[suffix])
        out[f"mvn{suffix}"] = mean_vector_norm(embeddings[suffix])
    out["primary"] = out["is"]
    out["n_texts"] = float(len(texts))
    if plot_dir is not None and not _matplotlib_available():
        out.skipped["cosine plot"] = 'needs matplotlib, which is not installed: pip install "mirrorbert[eval]"'
        logger.warning("isotropy: scores computed; the cosine plot %s", out.skipped["cosine plot"])
    elif plot_dir is not None:
        if pairs is None:
            try:
                pairs = load_set(data_dir, "stsb", "test")
            except UserError as exc:  # DatasetMissing included: the scores above still stand
                out.skipped["cosine plot"] = str(exc)
        if pairs is not None:
            hi_mask, lo_mask = pairs.scores >= high, pairs.scores <= low
            row = {t: i for i, t in enumerate(texts)}
            reuse = all(t in row for t in pairs.s1) and all(t in row for t in pairs.s2)
            name = model_label or "evaluated model"
            labels = {"": f"after: {name}" if reference_encoder is not None else name,
                      "_before": f"before: {reference_label or 'reference model'}"}
            panels: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for suffix in sorted(encoders, reverse=True):  # "_before" first
                if reuse:  # the pair sentences were embedded above: no second encoding pass
                    emb = embeddings[suffix]
                    sims = paired_cosine(emb[[row[t] for t in pairs.s1]], emb[[row[t] for t in pairs.s2]])
                else:
                    sims = pair_similarities(encoders[suffix], pairs.s1, pairs.s2, batch_size=batch_size)
                panels[labels[suffix]] = (sims[hi_mask], sims[lo_mask])
                out[f"cos_gap{suffix}"] = float(sims[hi_mask].mean() - sims[lo_mask].mean())
            path = plot_cosine_distributions(panels, Path(plot_dir) / "isotropy_cosine.png", high, low)
            out.artifacts["cosine distributions of high- vs low-scored STS-B pairs"] = str(path)
    return out
