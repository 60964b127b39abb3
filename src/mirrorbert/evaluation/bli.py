"""Bilingual lexicon induction (BLI): Procrustes map + CSLS retrieval, acc@1 (Glavaš et al. 2019 data).

For a pair ``src-tgt``: each word encoded alone, unit length, once per call; an orthogonal map learned on the 5k
training pairs maps each test source word, translated by CSLS over the target vocabulary (both dictionaries' target
words and the ``extra_vocab`` most frequent words, wordfreq; the source side likewise: docs/design.md). acc@1 is
over the distinct test source words, any gold translation counting.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import UserError
from mirrorbert.evaluation import datasets as ds
from mirrorbert.evaluation.sts import TaskMetrics, TextEncoder
from mirrorbert.search.exact import DEFAULT_CHUNK_SIZE, chunked_topk, cosine_topk, l2_normalize

logger = logging.getLogger(__name__)
Embed = Callable[[Sequence[str]], np.ndarray]

BLI_PAIRS: tuple[str, ...] = ds.BLI_PAIRS


@dataclass
class BliSettings:
    """The task's options, each an `--option bli.KEY=VALUE`: ``pairs`` like ``en-fr``, read from ``bli/<pair>/``
    (default: the paper's six that are present, a missing one skipped with a warning; a pair named is required),
    ``csls_k``, ``extra_vocab`` (frequent words added to each side's vocabulary), and the exact search's
    ``chunk_size`` and ``use_faiss`` (None: faiss when importable)."""

    pairs: Sequence[str] | str | None = None
    csls_k: int = 10
    extra_vocab: int = 20000
    chunk_size: int = DEFAULT_CHUNK_SIZE
    use_faiss: bool | None = None


SETTINGS = BliSettings


def load_bli_dictionary(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``source TAB target`` pairs of a Glavaš et al. dictionary file (blank lines ignored)."""
    path = Path(path)
    pairs: list[tuple[str, str]] = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 2 or not cols[0].strip() or not cols[1].strip():
            raise UserError(f"{path}:{lineno}: expected 'source<TAB>target', got {line[:80]!r}")
        pairs.append((cols[0].strip(), cols[1].strip()))
    if not pairs:
        raise UserError(f"{path}: no word pairs")
    return pairs


def csls_topk(
    sources: np.ndarray,
    targets: np.ndarray,
    k: int = 1,
    *,
    csls_k: int = 10,
    source_space: np.ndarray | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` targets by CSLS (Conneau et al. 2018) of each (already mapped) source vector: ``2 cos(x, y) - r_T(x)
    - r_S(y)``, ``r_T(x)`` the mean cosine of ``x`` to its ``csls_k`` nearest targets, ``r_S(y)`` that of ``y`` to
    its nearest ``source_space`` vectors (the mapped source vocabulary; default ``sources``). Exact chunked search
    (ties: the smaller key id; ``use_faiss=None``: faiss's exact ``IndexFlatIP`` when installed)."""

    def density(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
        scores, _ = cosine_topk(queries, keys, csls_k, chunk_size=chunk_size, use_faiss=use_faiss)
        return scores.mean(axis=1) if scores.shape[1] else np.zeros(scores.shape[0], np.float32)

    src = l2_normalize(sources)
    tgt = l2_normalize(targets)
    r_t = density(src, tgt)
    r_s = density(tgt, src if source_space is None else l2_normalize(source_space))
    # for unit x, y: 2 x.y - r_S(y) = [x, 1] . [2y, -r_S(y)], one inner-product search
    q_aug = np.hstack([src, np.ones((src.shape[0], 1), np.float32)])
    k_aug = np.hstack([2.0 * tgt, -r_s[:, None].astype(np.float32)])
    scores, ids = chunked_topk(q_aug, k_aug, k, chunk_size=chunk_size, use_faiss=use_faiss)
    return scores - r_t[:, None], ids


def procrustes(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Orthogonal ``W`` minimising ``||source @ W - target||_F`` (Schönemann 1966)."""
    u, _, vt = np.linalg.svd(source.astype(np.float64).T @ target.astype(np.float64))
    return (u @ vt).astype(np.float32)


def frequent_words(lang: str, n: int) -> list[str]:
    """The ``n`` most frequent words of ``lang`` according to wordfreq (its bundled lists, offline)."""
    import wordfreq

    if n <= 0:
        return []
    try:
        return list(wordfreq.top_n_list(lang, n))
    except LookupError:
        raise UserError(f"wordfreq has no word list for language {lang!r} (BLI extra vocabulary)") from None


def _embedding_cache(encoder: TextEncoder, batch_size: int, show_progress: bool) -> Embed:
    """Unit-length word vectors, each word encoded once per evaluation."""
    vectors: dict[str, np.ndarray] = {}

    def embed(words: Sequence[str]) -> np.ndarray:
        new = [w for w in dict.fromkeys(words) if w not in vectors]
        if new:
            emb = l2_normalize(encoder.encode(new, batch_size=batch_size, normalize=True, show_progress=show_progress))
            if emb.shape[0] != len(new):
                raise RuntimeError(f"encoder returned {emb.shape[0]} vectors for {len(new)} words")
            vectors.update(zip(new, emb))
        return np.stack([vectors[w] for w in words]).astype(np.float32)

    return embed


def evaluate_pair(embed: Embed, train: Sequence[tuple[str, str]], test: Sequence[tuple[str, str]],
                  pair: str, settings: BliSettings) -> float:
    """acc@1 of one language pair ``src-tgt`` (see the module docstring for the protocol)."""
    source_lang, target_lang = pair.split("-")
    gold: dict[str, set[str]] = {}
    for s, t in test:
        gold.setdefault(s, set()).add(t)
    test_sources = list(gold)
    target_vocab = list(dict.fromkeys([t for _, t in train] + [t for _, t in test]
                                      + frequent_words(target_lang, settings.extra_vocab)))
    source_vocab = list(dict.fromkeys([s for s, _ in train] + test_sources
                                      + frequent_words(source_lang, settings.extra_vocab)))
    w = procrustes(embed([s for s, _ in train]), embed([t for _, t in train]))
    _, top = csls_topk(embed(test_sources) @ w, embed(target_vocab), 1, csls_k=settings.csls_k,
                       source_space=embed(source_vocab) @ w, chunk_size=settings.chunk_size,
                       use_faiss=settings.use_faiss)
    hits = [target_vocab[top[i, 0]] in gold[s] for i, s in enumerate(test_sources)]
    logger.info("BLI %s: %d train pairs, %d test sources, %d target words, %d source words", pair, len(train),
                len(test_sources), len(target_vocab), len(source_vocab))
    return float(np.mean(hits))


def evaluate_bli(encoder: TextEncoder, data_dir: str | os.PathLike[str] | None = None, *,
                 settings: BliSettings | None = None, batch_size: int = 256, show_progress: bool = True) -> TaskMetrics:
    """acc@1 per pair (keys ``<src>-<tgt>_acc@1``; options: ``BliSettings``) and ``primary`` = their mean; the
    result's ``skipped`` maps a skipped pair to the reason."""
    settings = settings or BliSettings()
    chosen = BLI_PAIRS if settings.pairs is None else settings.pairs
    names = [chosen] if isinstance(chosen, str) else list(chosen)
    for pair in names:
        if pair.count("-") != 1 or not all(pair.split("-")):
            raise UserError(f"BLI pair must look like 'en-fr', got {pair!r}")
    folders, skipped = ds.present_sets(data_dir, names, explicit=settings.pairs is not None, what="BLI pair",
                                       entry=ds.bli_entry)
    embed = _embedding_cache(encoder, batch_size, show_progress)
    metrics = TaskMetrics()
    metrics.skipped.update(skipped)
    for pair, folder in folders.items():
        train = load_bli_dictionary(folder / f"yacle.train.freq.5k.{pair}.tsv")
        test = load_bli_dictionary(folder / f"yacle.test.freq.2k.{pair}.tsv")
        metrics[f"{pair}_acc@1"] = evaluate_pair(embed, train, test, pair, settings)
        logger.info("BLI %s: acc@1=%.4f", pair, metrics[f"{pair}_acc@1"])
    metrics["primary"] = float(np.mean([metrics[f"{p}_acc@1"] for p in folders]))
    return metrics
