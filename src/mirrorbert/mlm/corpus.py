"""Corpus preparation for MLM pre-training: tokenise once, ahead of time, into memory-mapped token files.

A corpus may be far larger than memory, so it is read line by line (`mlm.corpus_lines`) and tokenised in
batches into a flat token stream per split on disk (`mlm.tokenized`: the layout, and the packed sequences
training reads from it).

The result is cached in a folder keyed by the corpus files' contents (SHA-256 of their bytes, streamed;
never size and mtime, which an edit can keep), the tokenizer and the held-out fraction, and written
atomically: an interrupted preparation never leaves a half cache. Besides each split's stream (`.tokens`) and
document starts (`.docs`), `.ends` records where each of the split's non-blank lines ends in the stream (a line
without tokens ends where it began), so the cache can be checked line by line against the corpus.

The cache is used only once it is shown to hold this corpus's tokens (`mlm.corpus_checks`); one that fails a check
is set aside (renamed `<name>.damaged-<time>`, never deleted or used) with one warning naming the file and the
reason, and the corpus is tokenised again.

While tokenising, each file's bytes are hashed as they are read: a file edited during the run (its bytes no
longer those its key was taken from) stops the run with one error naming it, and nothing is cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.data.token_store import tokenizer_fingerprint
from mirrorbert.errors import UserError
from mirrorbert.mlm.corpus_checks import CacheDamaged, check_cache
from mirrorbert.mlm.corpus_lines import check_corpus_files, corpus_lines, encode_lines, file_source
from mirrorbert.mlm.tokenized import (
    FORMAT_VERSION,
    KINDS,
    META_FILE,
    OPTION,
    SPLITS,
    PackedSequences,
    TokenizedCorpus,
    epoch_order,
    special_ids,
    token_dtype,
    token_files,
)
from mirrorbert.safeguards.readback import file_sha256, set_aside
from mirrorbert.safeguards.writes import make_temporary, remove_tree, write_error, write_errors, write_failure

logger = logging.getLogger(__name__)


def prepare_corpus(
    corpus: str | Path | Sequence[str | Path],
    tokenizer,
    cache_dir: str | Path,
    eval_fraction: float = 0.01,
    batch_lines: int = 4096,
    show_progress: bool = True,
) -> TokenizedCorpus:
    """Tokenise the corpus into `cache_dir/<key>/` unless an identical preparation is already there (and holds
    this corpus's tokens: `check_cache`)."""
    paths = check_corpus_files([corpus] if isinstance(corpus, (str, Path)) else list(corpus))
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"--eval-fraction must be in [0, 1), got {eval_fraction}")
    fingerprint = tokenizer_fingerprint(tokenizer)
    sources = [file_source(p) for p in paths]
    key_obj = {"v": FORMAT_VERSION, "sources": sources, "tokenizer": fingerprint, "eval_fraction": eval_fraction}
    key = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()[:20]  # key, not output
    cache_dir = Path(cache_dir)
    root = cache_dir / f"{paths[0].stem[:40]}-{key}"
    if os.path.lexists(root):
        try:
            meta = check_cache(root, key, paths, sources, tokenizer, eval_fraction)
            logger.info("using tokenised corpus cache %s", root)
            return TokenizedCorpus(root, meta)
        except CacheDamaged as exc:
            aside = _set_aside(root)
            logger.warning("tokenised corpus cache %s is damaged (%s): set aside as %s; tokenising the corpus again",
                           root, exc, aside.name)
    return _build(root, key, paths, sources, tokenizer, eval_fraction, batch_lines, show_progress)


def _build(root: Path, key: str, paths: list[Path], sources: list[dict[str, Any]], tokenizer, eval_fraction: float,
           batch_lines: int, show_progress: bool) -> TokenizedCorpus:
    """Tokenise into a temporary folder beside `root` that replaces it in one rename."""
    start_id, sep_id, pad_id = special_ids(tokenizer)
    vocab_size, cache_dir = len(tokenizer), root.parent
    with write_errors(cache_dir, OPTION):  # a full disk: one line naming the cache, nothing left there
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = make_temporary(root, folder=True)  # a killed build's leftovers for this key are removed first
    try:
        meta = _tokenize_into(
            tmp, paths, sources, tokenizer, sep_id, token_dtype(vocab_size), eval_fraction, batch_lines,
            show_progress)
        if meta["splits"]["train"]["sentences"] + meta["splits"]["eval"]["sentences"] == 0:
            names = ", ".join(str(p) for p in paths)
            raise UserError(f"--corpus {names}: the corpus is empty (no non-blank line gives any token)")
        meta.update(
            key=key,
            files={name: _content_sha256(tmp / name) for name in token_files()},
            format_version=FORMAT_VERSION,
            sources=sources,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            tokenizer_class=type(tokenizer).__name__,
            vocab_size=vocab_size,
            dtype=token_dtype(vocab_size).name,
            start_id=start_id,
            sep_id=sep_id,
            pad_id=pad_id,
            eval_fraction=eval_fraction,
            complete=True,
        )
        (tmp / META_FILE).write_text(jsonio.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if os.path.lexists(root):  # appeared meanwhile (another run): keep it aside, never delete it
            _set_aside(root)
        os.replace(tmp, root)
    except BaseException as exc:
        remove_tree(tmp)
        code = write_failure(exc) if isinstance(exc, Exception) and not isinstance(exc, UserError) else None
        if code is not None:
            raise write_error(cache_dir, OPTION, code) from None
        raise
    logger.info(
        "tokenised corpus: %d train / %d held-out tokens (incl. separators) in %s",
        meta["splits"]["train"]["tokens"],
        meta["splits"]["eval"]["tokens"],
        root,
    )
    return TokenizedCorpus(root, meta)


def _content_sha256(path: Path) -> str:
    return file_sha256(path, what="--corpus")


def _set_aside(root: Path) -> Path:
    """Rename a damaged cache folder (or whatever sits at its name) out of the way; nothing is deleted."""
    return set_aside(root, OPTION)


def _tokenize_into(
    out: Path,
    paths: list[Path],
    sources: list[dict[str, Any]],
    tokenizer,
    sep_id: int,
    dtype: np.dtype,
    eval_fraction: float,
    batch_lines: int,
    show_progress: bool,
) -> dict[str, Any]:
    from mirrorbert.reporting.progress import progress_bar

    files = {(s, kind): open(out / f"{s}.{kind}", "wb") for s in SPLITS for kind in KINDS}
    counts = {s: {"tokens": 0, "sentences": 0, "documents": 0, "words": 0, "lines": 0} for s in SPLITS}
    total_bytes = sum(int(s["size"]) for s in sources)
    bar = progress_bar(total=total_bytes, unit="B", unit_scale=True, desc="tokenising corpus", show=show_progress)
    pending: list[tuple[str, bool, str]] = []  # (text, new document, split)
    # A line that tokenises to nothing (control characters only) is dropped; if it opened a document,
    # the document starts at that split's next sentence that does give tokens.
    carry_doc_start = {s: False for s in SPLITS}

    def flush() -> None:
        ends: dict[str, list[int]] = {s: [] for s in SPLITS}
        for (text, new_doc, sp), ids in zip(pending, encode_lines(tokenizer, [t for t, _, _ in pending])):
            c = counts[sp]
            c["lines"] += 1
            if ids:
                if new_doc or carry_doc_start[sp]:
                    carry_doc_start[sp] = False
                    np.asarray([c["tokens"]], dtype=np.uint64).tofile(files[sp, "docs"])
                    c["documents"] += 1
                arr = np.empty(len(ids) + 1, dtype=dtype)
                arr[:-1] = ids
                arr[-1] = sep_id
                arr.tofile(files[sp, "tokens"])
                c["tokens"] += len(arr)
                c["sentences"] += 1
                c["words"] += len(text.split())
            else:
                carry_doc_start[sp] = carry_doc_start[sp] or new_doc
            ends[sp].append(c["tokens"])  # where this line ends in its split's stream (empty: where it began)
        for sp in SPLITS:
            np.asarray(ends[sp], dtype=np.uint64).tofile(files[sp, "ends"])
        pending.clear()

    try:
        for text, new_doc, split, nbytes in corpus_lines(paths, sources, eval_fraction):
            pending.append((text, new_doc, split))
            bar.update(nbytes)
            if len(pending) >= batch_lines:
                flush()
        flush()
    finally:
        bar.close()
        for fh in files.values():
            fh.close()
    return {"splits": counts}


__all__ = ["PackedSequences", "TokenizedCorpus", "check_corpus_files", "epoch_order", "prepare_corpus"]
