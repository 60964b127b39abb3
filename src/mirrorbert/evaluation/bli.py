"""Bilingual lexicon induction (BLI): Procrustes map + CSLS retrieval, acc@1 (Glavaš et al. 2019 data).

Protocol for a pair ``src-tgt`` (the Mirror-BERT paper's setup):

1. every word is encoded on its own (no context) and scaled to unit length;
2. an orthogonal map ``W`` (Procrustes: ``W = U V^T`` from the SVD of ``X_s^T X_t``) is learned on the
   5k training pairs ``yacle.train.freq.5k.<pair>.tsv``;
3. each test source word is mapped and its translation retrieved by CSLS (k = 10) over the target
   vocabulary = the target words of the pair's training and test dictionaries plus the ``extra_vocab``
   (20k) most frequent words of the target language from ``wordfreq.top_n_list`` (deduplicated, in
   that order);
4. the source-side neighbourhood term of CSLS (``r_S``) is computed over the mapped source vocabulary
   built the same way (source words of both dictionaries plus the 20k most frequent source-language
   words), mirroring MUSE which uses the whole source vocabulary;
5. acc@1 over the distinct source words of ``yacle.test.freq.2k.<pair>.tsv``; a source with several
   gold translations is correct when its top-1 is any of them.

Words are embedded once per call and shared across pairs (a word is encoded without any language
tag, so its vector does not depend on the pair).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import datasets as ds
from mirrorbert.evaluation.retrieval import DEFAULT_CHUNK_SIZE, csls_topk, l2_normalize
from mirrorbert.evaluation.sts import TaskMetrics, TextEncoder

logger = logging.getLogger(__name__)

BLI_PAIRS: tuple[str, ...] = ds.BLI_PAIRS


def load_bli_dictionary(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``source TAB target`` pairs of a Glavaš et al. dictionary file (blank lines ignored)."""
    path = Path(path)
    pairs: list[tuple[str, str]] = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        line = line.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 2 or not cols[0].strip() or not cols[1].strip():
            raise UserError(f"{path}:{lineno}: expected 'source<TAB>target', got {line[:80]!r}")
        pairs.append((cols[0].strip(), cols[1].strip()))
    if not pairs:
        raise UserError(f"{path}: no word pairs")
    return pairs


def procrustes(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Orthogonal ``W`` minimising ``||source @ W - target||_F`` (Schönemann 1966)."""
    u, _, vt = np.linalg.svd(source.astype(np.float64).T @ target.astype(np.float64))
    return (u @ vt).astype(np.float32)


def frequent_words(lang: str, n: int) -> list[str]:
    """The ``n`` most frequent words of ``lang`` according to wordfreq (its bundled lists, offline)."""
    if n <= 0:
        return []
    try:
        import wordfreq
    except ImportError as err:  # pragma: no cover - wordfreq is a core dependency
        raise UserError("BLI needs the 'wordfreq' package for the target vocabulary (pip install wordfreq)") from err
    try:
        return list(wordfreq.top_n_list(lang, n))
    except LookupError:
        raise UserError(f"wordfreq has no word list for language {lang!r} (BLI extra vocabulary)") from None


class _EmbeddingCache:
    """Unit-length word vectors, each word encoded once per evaluation."""

    def __init__(self, encoder: TextEncoder, batch_size: int, show_progress: bool) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.vectors: dict[str, np.ndarray] = {}

    def __call__(self, words: Sequence[str]) -> np.ndarray:
        new = [w for w in dict.fromkeys(words) if w not in self.vectors]
        if new:
            emb = l2_normalize(
                self.encoder.encode(new, batch_size=self.batch_size, normalize=True, show_progress=self.show_progress)
            )
            if emb.shape[0] != len(new):
                raise RuntimeError(f"encoder returned {emb.shape[0]} vectors for {len(new)} words")
            self.vectors.update(zip(new, emb))
        return np.stack([self.vectors[w] for w in words]).astype(np.float32)


def evaluate_pair(
    embed: _EmbeddingCache | TextEncoder,
    train: Sequence[tuple[str, str]],
    test: Sequence[tuple[str, str]],
    source_lang: str,
    target_lang: str,
    *,
    csls_k: int = 10,
    extra_vocab: int = 20000,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = False,
) -> float:
    """acc@1 of one language pair (see the module docstring for the protocol)."""
    if not isinstance(embed, _EmbeddingCache):
        embed = _EmbeddingCache(embed, batch_size=256, show_progress=False)
    gold: dict[str, set[str]] = {}
    for s, t in test:
        gold.setdefault(s, set()).add(t)
    test_sources = list(gold)

    target_vocab = list(
        dict.fromkeys([t for _, t in train] + [t for _, t in test] + frequent_words(target_lang, extra_vocab))
    )
    source_vocab = list(
        dict.fromkeys([s for s, _ in train] + test_sources + frequent_words(source_lang, extra_vocab))
    )
    w = procrustes(embed([s for s, _ in train]), embed([t for _, t in train]))
    mapped_space = embed(source_vocab) @ w
    queries = embed(test_sources) @ w
    targets = embed(target_vocab)
    _, top = csls_topk(
        queries, targets, 1, csls_k=csls_k, source_space=mapped_space, chunk_size=chunk_size, use_faiss=use_faiss
    )
    hits = [target_vocab[top[i, 0]] in gold[s] for i, s in enumerate(test_sources)]
    logger.info(
        "BLI %s-%s: %d train pairs, %d test sources, %d target words, %d source words",
        source_lang, target_lang, len(train), len(test_sources), len(target_vocab), len(source_vocab),
    )
    return float(np.mean(hits))


def _require_pair(data_dir: str | os.PathLike[str] | None, pair: str) -> Path:
    """Folder of a BLI pair; pairs outside the registry use the same layout and provenance."""
    key = f"bli-{pair}"
    if key in ds.REGISTRY:
        return ds.require(data_dir, key)
    base = ds.REGISTRY[f"bli-{BLI_PAIRS[0]}"]
    files = (f"yacle.train.freq.5k.{pair}.tsv", f"yacle.test.freq.2k.{pair}.tsv")
    entry = ds.DatasetInfo(key, f"bli/{pair}", files, base.official_source, base.licence, base.note)
    folder = ds.resolve_data_dir(data_dir) / entry.folder
    missing = [folder / f for f in files if not (folder / f).is_file()]
    if missing:
        raise DatasetMissing(ds.missing_message(entry, folder, missing))
    return folder


def evaluate_bli(
    encoder: TextEncoder,
    data_dir: str | os.PathLike[str] | None = None,
    pairs: Sequence[str] | None = None,
    csls_k: int = 10,
    extra_vocab: int = 20000,
    batch_size: int = 256,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = None,
    show_progress: bool = True,
) -> TaskMetrics:
    """acc@1 per pair (keys ``<src>-<tgt>_acc@1``) and ``primary`` = their mean.

    ``pairs=None`` evaluates the paper's six pairs that are present, skipping a missing one with a
    warning (:class:`DatasetMissing` only when none is present; the result's ``skipped`` maps a
    skipped pair to the reason); naming pairs makes each required.
    A pair ``xx-yy`` is read from ``bli/xx-yy/`` of the data directory.
    """
    explicit = pairs is not None
    names = [pairs] if isinstance(pairs, str) else list(BLI_PAIRS if pairs is None else pairs)
    for pair in names:
        if pair.count("-") != 1 or not all(pair.split("-")):
            raise UserError(f"BLI pair must look like 'en-fr', got {pair!r}")

    folders: dict[str, Path] = {}
    messages: dict[str, str] = {}
    for pair in names:
        try:
            folders[pair] = _require_pair(data_dir, pair)
        except DatasetMissing as err:
            if explicit:
                raise
            logger.warning("BLI: skipping %s: %s", pair, err)
            messages[pair] = str(err)
    if not folders:
        if len(messages) == 1:
            raise DatasetMissing(next(iter(messages.values())))
        base = ds.REGISTRY[f"bli-{BLI_PAIRS[0]}"]
        root = ds.resolve_data_dir(data_dir) / "bli"
        raise DatasetMissing(
            f"no BLI pair found: expected <pair>/yacle.train.freq.5k.<pair>.tsv and yacle.test.freq.2k.<pair>.tsv "
            f"in {root} for {', '.join(names)}; official source: {base.official_source}; licence: {base.licence}"
        )

    embed = _EmbeddingCache(encoder, batch_size=batch_size, show_progress=show_progress)
    metrics = TaskMetrics()
    metrics.skipped.update(messages)
    for pair, folder in folders.items():
        src, tgt = pair.split("-")
        train = load_bli_dictionary(folder / f"yacle.train.freq.5k.{pair}.tsv")
        test = load_bli_dictionary(folder / f"yacle.test.freq.2k.{pair}.tsv")
        acc = evaluate_pair(
            embed, train, test, src, tgt, csls_k=csls_k, extra_vocab=extra_vocab, chunk_size=chunk_size,
            use_faiss=use_faiss,
        )
        metrics[f"{pair}_acc@1"] = acc
        logger.info("BLI %s: acc@1=%.4f", pair, acc)
    metrics["primary"] = float(np.mean([metrics[f"{p}_acc@1"] for p in folders]))
    return metrics
