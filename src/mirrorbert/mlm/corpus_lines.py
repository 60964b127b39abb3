"""The MLM corpus read line by line: its files checked, its documents found, each line placed in its split.

Documents are runs of non-blank lines separated by blank lines; in a file without blank lines every
line is its own document. Evenly spaced whole documents form the held-out evaluation slice, so no
document is split between training and evaluation. Each file's bytes are hashed as they are read, so what was
tokenised can be checked to be the file the cache is keyed by.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from mirrorbert.data.strings import check_utf8_file
from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import open_regular


def check_corpus_files(paths: Sequence[str | Path]) -> list[Path]:
    if not paths:
        raise UserError("--corpus: no corpus file given")
    out = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise UserError(f"--corpus {path}: no such file")
        if not path.is_file():
            raise UserError(f"--corpus {path}: not a regular file")
        # the same rule as `train --data`: a binary or mis-encoded corpus is refused, not tokenised as U+FFFD
        check_utf8_file(path, "--corpus", hint="convert the file to UTF-8 (e.g. iconv -c -f utf-8 -t utf-8)")
        if not _has_text(path):
            raise UserError(f"--corpus {path}: no text in the file (it is empty or every line is blank)")
        out.append(path)
    return out


def _has_text(path: Path) -> bool:
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        return any(raw.strip() for raw in fh)


def _has_blank_separators(path: Path) -> bool:
    """True when the file uses blank lines between non-blank ones (documents); reads until the first such."""
    seen_text = False
    seen_blank_after_text = False
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        for raw in fh:
            if raw.strip():
                if seen_blank_after_text:
                    return True
                seen_text = True
            elif seen_text:
                seen_blank_after_text = True
    return False


def iter_sentences(path: Path, by_blank: bool | None = None, digest=None) -> Iterator[tuple[str, bool, int]]:
    """Yield `(sentence, starts_new_document, bytes_read)`; reads bytes so a broken byte never stops a run.
    `digest` (a hashlib object) takes every byte read, so what was tokenised can be checked to be the file the
    cache is keyed by."""
    by_blank = _has_blank_separators(path) if by_blank is None else by_blank
    new_doc = True
    skipped = 0  # bytes of blank lines, reported with the next sentence so progress adds up
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        for raw in fh:
            if digest is not None:
                digest.update(raw)
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                new_doc = True
                skipped += len(raw)
                continue
            yield text, (new_doc or not by_blank), len(raw) + skipped
            new_doc, skipped = False, 0


def corpus_lines(paths: list[Path], sources: list[dict[str, Any]],
           eval_fraction: float) -> Iterator[tuple[str, bool, str, int]]:
    """`(sentence, starts_new_document, split, bytes_read)` of every non-blank line of the corpus; each file's
    bytes, as read, must be those its SHA-256 in `sources` was taken from, else one error naming it (the file was
    edited while the run read it)."""
    doc_index, split = -1, "train"
    for path, source in zip(paths, sources):
        digest = hashlib.sha256()
        for text, new_doc, nbytes in iter_sentences(path, digest=digest):
            if new_doc:
                doc_index += 1
                split = "eval" if is_eval_document(doc_index, eval_fraction) else "train"
            yield text, new_doc, split, nbytes
        if digest.hexdigest() != source["sha256"]:
            raise UserError(f"--corpus {path}: changed while it was read (its content is no longer the one the "
                            "cache is keyed by: was the file edited during the run?); nothing was cached, run again "
                            "once the file is complete")


def is_eval_document(doc_index: int, eval_fraction: float) -> bool:
    """Evenly spaced selection: document d is held out when round(d*f) steps up, i.e. about every 1/f-th."""
    if eval_fraction <= 0:
        return False
    return math.floor((doc_index + 1) * eval_fraction + 0.5) > math.floor(doc_index * eval_fraction + 0.5)


def encode_lines(tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each sentence, without special tokens: what the stream holds before each separator."""
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False,
                     verbose=False)["input_ids"]


def file_source(path: Path) -> dict[str, Any]:
    """Name, size and SHA-256 of a corpus file, from one read of its bytes (what keys the cache)."""
    digest, size = hashlib.sha256(), 0
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
    return {"name": path.name, "size": size, "sha256": digest.hexdigest()}
