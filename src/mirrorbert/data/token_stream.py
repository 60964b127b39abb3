"""MLM pre-training's corpus in the token cache (`data.token_cache`): one token stream per split, memory-mapped.

Documents are runs of non-blank lines between blank lines (without blank lines, every line); evenly spaced whole
documents are held out (`is_eval_document`). The entry, `<--cache-dir>/<name>-<key>/` (default
`<cache>/mlm-corpus/`; the key: the corpus files' SHA-256, the tokenizer, the held-out fraction), holds per split:

* `{split}.tokens` (uint16, or uint32 above 65,536 ids): each non-blank line's ids without special tokens, each
  followed by the separator (a document opened by a line without tokens starts at the next line with tokens);
* `{split}.docs`, `{split}.ends` (uint64): where each document starts, where each non-blank line ends.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from mirrorbert.data.readers import chunked
from mirrorbert.data.strings import check_utf8_file
from mirrorbert.data.token_cache import (ArrayWriter, CacheDamaged, CacheEntry, cache_key, cache_root, encode_chunk,
                                         open_cache, rows_to_check, tokenizer_fingerprint, tokenizer_threads)
from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import file_sha256, open_regular

FORMAT = "mirrorbert-corpus/4"  # in the cache key and the manifest: a cache of another format is prepared again
SPLITS = ("train", "eval")
BLOCK = 1 << 22  # tokens whose ids a check bounds at a time
BATCH_LINES = 4096  # corpus lines a tokenizer call


def check_corpus_files(paths: Sequence[str | Path]) -> list[Path]:
    """The corpus files, each a regular UTF-8 file (a mis-encoded one is refused, not read as U+FFFD) with text."""
    if not paths:
        raise UserError("--corpus: no corpus file given")
    for path in map(Path, paths):
        check_utf8_file(path, "--corpus", hint="convert the file to UTF-8 (e.g. iconv -c -f utf-8 -t utf-8)")
        if not any(text for text, _, _ in iter_sentences(path, by_blank=False)):
            raise UserError(f"--corpus {path}: no text in the file (it is empty or every line is blank)")
    return [Path(p) for p in paths]


def _has_blank_separators(path: Path) -> bool:
    """True when the file uses blank lines between non-blank ones (documents); reads until the first such."""
    seen_text = seen_blank = False
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        for raw in fh:
            if raw.strip():
                if seen_blank:
                    return True
                seen_text = True
            elif seen_text:
                seen_blank = True
    return False


def iter_sentences(path: Path, by_blank: bool | None = None, digest=None) -> Iterator[tuple[str, bool, int]]:
    """`(sentence, starts_new_document, bytes_read)` of each non-blank line (a broken byte read as U+FFFD);
    `digest` (a hashlib object) takes every byte read."""
    by_blank = _has_blank_separators(path) if by_blank is None else by_blank
    new_doc, skipped = True, 0  # skipped: bytes of blank lines, reported with the next sentence
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        for raw in fh:
            if digest is not None:
                digest.update(raw)
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                new_doc, skipped = True, skipped + len(raw)
                continue
            yield text, (new_doc or not by_blank), len(raw) + skipped
            new_doc, skipped = False, 0


def corpus_lines(paths: list[Path], sources: list[dict[str, Any]],
                 eval_fraction: float) -> Iterator[tuple[str, bool, str, int]]:
    """`(sentence, starts_new_document, split, bytes_read)` of every non-blank line of the corpus; each file's
    bytes, as read, must hash to its SHA-256 in `sources`, else one error naming it."""
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


def corpus_key(sources: list[dict[str, Any]], tokenizer, eval_fraction: float) -> str:
    """The corpus as a checkpoint records it (its files' content, the tokenizer, the held-out fraction); a resume
    must find it again, so its recipe never changes."""
    key = {"v": 3, "sources": sources, "tokenizer": tokenizer_fingerprint(tokenizer), "eval_fraction": eval_fraction}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]  # key, not output


def special_ids(tokenizer) -> tuple[int, int, int]:
    """(start, separator, pad) ids: [CLS]/[SEP] for BERT, <s>/</s> for RoBERTa (via bos/eos fallback)."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if start is None or sep is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise UserError(f"tokenizer {name} has no [CLS]/<s> or [SEP]/</s> token; MLM packing needs a start and a "
                        "separator token")
    pad = tokenizer.pad_token_id
    return int(start), int(sep), int(sep if pad is None else pad)  # padded positions are masked out anyway


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def prepare_corpus(corpus: str | Path | Sequence[str | Path], tokenizer, cache_dir: str | Path | None = None,
                   eval_fraction: float = 0.01, show_progress: bool = True) -> "TokenizedCorpus":
    """The corpus tokenised into the cache (`cache_dir`, default `<cache>/mlm-corpus`), unless an identical
    preparation is already there and holds this corpus's tokens."""
    paths = check_corpus_files([corpus] if isinstance(corpus, (str, Path)) else list(corpus))
    layout = CorpusLayout(paths, tokenizer, eval_fraction, show_progress)
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "mlm-corpus"
    return TokenizedCorpus(open_cache(layout, folder, own=cache_dir is None))


class CorpusLayout:
    """The token cache's layout of an MLM corpus: the files, one pass to write them, one to check them."""

    kind, redo, option, fmt = "tokenised corpus cache", "tokenising the corpus", "--cache-dir", FORMAT

    def __init__(self, paths: list[Path], tokenizer, eval_fraction: float, show_progress: bool = False):
        self.paths, self.tokenizer, self.eval_fraction = paths, tokenizer, eval_fraction
        self.show_progress = show_progress
        self.sources = [{"name": p.name, "size": p.stat().st_size, "sha256": file_sha256(p, what="--corpus")}
                        for p in paths]
        self.corpus_key = corpus_key(self.sources, tokenizer, eval_fraction)
        self.key = cache_key(FORMAT, self.corpus_key, tokenizer)
        self.name = f"{paths[0].stem[:40]}-{self.key}"
        self.start_id, self.sep_id, self.pad_id = special_ids(tokenizer)
        self.dtype = token_dtype(len(tokenizer))
        self.files = {f"{s}.{kind}": self.dtype if kind == "tokens" else np.dtype(np.uint64)
                      for s in SPLITS for kind in ("tokens", "docs", "ends")}

    def write(self, writer: ArrayWriter) -> dict[str, Any]:
        from mirrorbert.reporting.progress import progress_bar

        with progress_bar(total=sum(int(s["size"]) for s in self.sources), unit="B", unit_scale=True,
                          desc="tokenising corpus", show=self.show_progress) as bar, tokenizer_threads():
            meta = self._pass(writer, self._batches(bar))
        if not any(meta["splits"][s]["sentences"] for s in SPLITS):
            names = ", ".join(str(p) for p in self.paths)
            raise UserError(f"--corpus {names}: the corpus is empty (no non-blank line gives any token)")
        return meta

    def _batches(self, bar) -> Iterator[list[tuple[str, bool, str, Any]]]:
        """The corpus's lines with their ids, a batch of lines a tokenizer call."""
        def lines():
            for text, new_doc, split, nbytes in corpus_lines(self.paths, self.sources, self.eval_fraction):
                bar.update(nbytes)
                yield text, new_doc, split

        for batch in chunked(lines(), BATCH_LINES):
            ids = encode_chunk(self.tokenizer, [text for text, _, _ in batch], None, special=False)
            yield [(*line, line_ids) for line, line_ids in zip(batch, ids)]

    def replay(self, entry: CacheEntry, writer: ArrayWriter) -> dict[str, Any]:
        """The pass again over the corpus read again, each line's ids taken from its stretch of the stream (its
        place: the line ends); every line, or a fresh sample, tokenised again must give those ids."""
        streams = {s: entry.array(f"{s}.tokens") for s in SPLITS}
        ends = {s: entry.read(f"{s}.ends").astype(np.int64) for s in SPLITS}
        for s in SPLITS:
            if bool((np.diff(ends[s]) < 0).any()) or (ends[s].size and int(ends[s][-1]) > len(streams[s])):
                raise CacheDamaged(f"{s}.ends holds line ends out of order or past {s}.tokens")
            for start in range(0, len(streams[s]), BLOCK):
                if int(streams[s][start:start + BLOCK].max()) >= len(self.tokenizer):
                    raise CacheDamaged(f"{s}.tokens holds ids outside the vocabulary")
        sample = rows_to_check(sum(len(e) for e in ends.values()))
        with tokenizer_threads():
            return self._pass(writer, self._stored(streams, ends, None if sample is None else set(sample.tolist())))

    def _stored(self, streams: dict[str, np.ndarray], ends: dict[str, np.ndarray],
                sample: set[int] | None) -> Iterator[list[tuple[str, bool, str, Any]]]:
        """The corpus's lines with their ids taken from the stream, a batch at a time; every line's (or `sample`'s)
        tokenised again must be those ids."""
        seen = dict.fromkeys(SPLITS, 0)
        for batch in chunked(enumerate(corpus_lines(self.paths, self.sources, self.eval_fraction)), BATCH_LINES):
            lines = []
            for text, new_doc, sp, _ in (line for _, line in batch):
                k = seen[sp]
                if k >= len(ends[sp]):
                    raise CacheDamaged(f"{sp}.ends holds fewer lines than the corpus")
                seen[sp], start = k + 1, int(ends[sp][k - 1]) if k else 0
                lines.append((text, new_doc, sp, streams[sp][start:max(start, int(ends[sp][k]) - 1)]))
            again = [line for (number, _), line in zip(batch, lines) if sample is None or number in sample]
            fresh = encode_chunk(self.tokenizer, [text for text, _, _, _ in again], None, special=False)
            for (_, _, sp, stored), ids in zip(again, fresh):
                if list(ids) != stored.tolist():
                    raise CacheDamaged(f"{sp}.tokens holds tokens that are not the tokenizer's tokens of the corpus")
            yield lines

    def _pass(self, writer: ArrayWriter, batches: Iterator[list[tuple[str, bool, str, Any]]]) -> dict[str, Any]:
        """The one pass, building or checking: each line's ids and a separator appended to its split's stream,
        where it ends, where each document starts (a line without tokens drops out; a document it opened starts
        at the split's next line with tokens); the counts the manifest records."""
        counts = {s: {"tokens": 0, "sentences": 0, "documents": 0, "words": 0, "lines": 0} for s in SPLITS}
        carry, sep = dict.fromkeys(SPLITS, False), np.array([self.sep_id])
        for batch in batches:
            parts: dict[str, list] = {s: [] for s in SPLITS}
            docs: dict[str, list[int]] = {s: [] for s in SPLITS}
            ends: dict[str, list[int]] = {s: [] for s in SPLITS}
            for text, new_doc, sp, ids in batch:
                c = counts[sp]
                c["lines"] += 1
                if len(ids):
                    if new_doc or carry[sp]:
                        docs[sp].append(c["tokens"])
                        c["documents"] += 1
                        carry[sp] = False
                    parts[sp] += [np.asarray(ids, dtype=np.int64), sep]
                    c["tokens"] += len(ids) + 1
                    c["sentences"] += 1
                    c["words"] += len(text.split())
                else:
                    carry[sp] = carry[sp] or new_doc
                ends[sp].append(c["tokens"])
            for s in SPLITS:
                writer.append(f"{s}.tokens", np.concatenate(parts[s]) if parts[s] else [])
                writer.append(f"{s}.docs", docs[s])
                writer.append(f"{s}.ends", ends[s])
        return {"splits": counts, "sources": self.sources, "corpus_key": self.corpus_key,
                "tokenizer_class": type(self.tokenizer).__name__, "vocab_size": len(self.tokenizer),
                "dtype": self.dtype.name, "start_id": self.start_id, "sep_id": self.sep_id, "pad_id": self.pad_id,
                "eval_fraction": self.eval_fraction}


class TokenizedCorpus:
    """A prepared corpus: each split's token stream, mapped from the checked files."""

    def __init__(self, entry: CacheEntry):
        self.entry, self.root, self.meta = entry, entry.root, entry.manifest

    def stream(self, split: str) -> np.ndarray:
        """The split's token stream, read-only (an empty array for an empty split)."""
        return self.entry.array(f"{split}.tokens")

    def n_tokens(self, split: str, with_separators: bool = True) -> int:
        info = self.meta["splits"][split]
        return int(info["tokens"]) if with_separators else int(info["tokens"]) - int(info["sentences"])


__all__ = ["CorpusLayout", "TokenizedCorpus", "check_corpus_files", "corpus_key", "corpus_lines",
           "is_eval_document", "iter_sentences", "prepare_corpus", "special_ids", "token_dtype"]
