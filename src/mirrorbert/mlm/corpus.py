"""Corpus preparation for MLM pre-training: tokenise once, ahead of time, into memory-mapped token files.

A corpus may be far larger than memory, so it is read line by line and tokenised in batches into a
flat token *stream* on disk: every sentence (one
non-blank line) followed by the separator token. Training then reads fixed-length windows of that
stream through `numpy.memmap`, so batches cost a slice and the model is never starved by tokenisation.

Packing: sequence i is `[CLS] + stream[i*(L-1) : (i+1)*(L-1)]` (`<s>` for RoBERTa, whose separator
is `</s>`). Windows tile the stream exactly, so no token is lost or duplicated and only the very last
sequence of a split can need padding. Sentences that straddle a window boundary continue in the next
window, as in RoBERTa's FULL-SENTENCES packing.

Documents are runs of non-blank lines separated by blank lines; in a file without blank lines every
line is its own document. Evenly spaced whole documents form the held-out evaluation slice, so no
document is split between training and evaluation.

The result is cached in a folder keyed by the corpus files' contents (SHA-256 of their bytes, streamed;
never size and mtime, which an edit can keep), the tokenizer and the held-out fraction, and written
atomically: an interrupted preparation never leaves a half cache. Besides each split's stream (`.tokens`) and
document starts (`.docs`), `.ends` records where each of the split's non-blank lines ends in the stream (a line
without tokens ends where it began), so the cache can be checked line by line against the corpus.

The cache is read back as untrusted (anyone who can write there can edit it and rehash meta.json), and used only
once it is shown to hold this corpus's tokens: every file read through `safeguards.confined.ConfinedFolder`
(inside the cache folder, a regular file of the size the counts give, meta.json bounded and nested no deeper
than JSON's limit), its SHA-256 the recorded one (bit rot), ids inside the vocabulary, a separator at every
line's end; then the corpus is read again (its bytes must hash to the key's SHA-256), every line placed in its
split and its document starts and word counts recomputed, and the lines tokenised again and compared with
their stretch of the stream: all of them for a corpus of at most `FULL_CHECK_LINES` lines, else
`SAMPLE_LINES` lines drawn afresh each run from the operating system's randomness (a fixed sample would tell a
forger which lines to leave alone; a fresh one finds a forgery of a share f of the lines with probability
1 - (1 - f) ** SAMPLE_LINES). A cache that fails a check is set aside (renamed `<name>.damaged-<time>`, never
deleted or used) with one warning naming the file and the reason, and the corpus is tokenised again.

While tokenising, each file's bytes are hashed as they are read: a file edited during the run (its bytes no
longer those its key was taken from) stops the run with one error naming it, and nothing is cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

import mirrorbert.jsonio as jsonio
from mirrorbert.data.strings import check_utf8_file
from mirrorbert.data.token_store import tokenizer_fingerprint  # noqa: F401  (here since the MLM cache)
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import file_sha256, open_regular, set_aside, stream_sha256
from mirrorbert.safeguards.writes import make_temporary, remove_tree, write_error, write_errors, write_failure

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 2: keyed by content checksums, token files checksummed; 3: line ends, checked against the corpus
META_FILE = "meta.json"
MAX_META_BYTES = 1 << 20
SPLITS = ("train", "eval")
KINDS = ("tokens", "docs", "ends")  # the files of each split
COUNTS = ("tokens", "sentences", "documents", "words", "lines")  # meta.json's counts of each split
OPTION = "--cache-dir"
KIND = "tokenised corpus cache"
FULL_CHECK_LINES = 50_000  # a cache of a corpus of at most this many lines is checked line by line
SAMPLE_LINES = 4096  # lines of a bigger corpus tokenised again, drawn afresh each run


# --------------------------------------------------------------------------- tokenizer helpers
def special_ids(tokenizer) -> tuple[int, int, int]:
    """(start, separator, pad) ids: [CLS]/[SEP] for BERT, <s>/</s> for RoBERTa (via bos/eos fallback)."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if start is None or sep is None:
        raise UserError(
            f"tokenizer {name} has no [CLS]/<s> or [SEP]/</s> token; MLM packing needs a start and a separator token"
        )
    if pad is None:
        pad = sep  # padded positions are masked out of attention and loss, so any id will do
    return int(start), int(sep), int(pad)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


# --------------------------------------------------------------------------- reading
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


def _lines(paths: list[Path], sources: list[dict[str, Any]],
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


def _encode_lines(tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each sentence, without special tokens: what the stream holds before each separator."""
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False,
                     verbose=False)["input_ids"]


# --------------------------------------------------------------------------- the prepared corpus
@dataclass
class TokenizedCorpus:
    """A prepared corpus folder: `{train,eval}.tokens` streams and `{train,eval}.docs` document starts."""

    root: Path
    meta: dict[str, Any]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    def _file(self, name: str, size: int) -> Path:
        """The real path of a checked file of the cache (inside it, regular, of its size) for the map."""
        return ConfinedFolder(self.root, OPTION, KIND).check_file(name, limit=size)

    def stream(self, split: str) -> np.ndarray:
        """The split's token stream as a read-only memmap (an empty array for an empty split)."""
        n = int(self.meta["splits"][split]["tokens"])
        if n == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self._file(f"{split}.tokens", n * self.dtype.itemsize), dtype=self.dtype, mode="r",
                         shape=(n,))

    def doc_starts(self, split: str) -> np.ndarray:
        n = int(self.meta["splits"][split]["documents"])
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        return np.memmap(self._file(f"{split}.docs", 8 * n), dtype=np.uint64, mode="r", shape=(n,))

    def n_tokens(self, split: str, with_separators: bool = True) -> int:
        info = self.meta["splits"][split]
        return int(info["tokens"]) if with_separators else int(info["tokens"]) - int(info["sentences"])

    def packed(self, split: str, seq_length: int) -> "PackedSequences":
        return PackedSequences(self.stream(split), seq_length, self.meta["start_id"], self.meta["pad_id"])


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
    sources = [_source(p) for p in paths]
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
            files={name: _content_sha256(tmp / name) for name in _token_files()},
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


def _token_files() -> list[str]:
    return [f"{split}.{kind}" for split in SPLITS for kind in KINDS]


def _source(path: Path) -> dict[str, Any]:
    """Name, size and SHA-256 of a corpus file, from one read of its bytes (what keys the cache)."""
    digest, size = hashlib.sha256(), 0
    with os.fdopen(open_regular(path, "--corpus"), "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
    return {"name": path.name, "size": size, "sha256": digest.hexdigest()}


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
        for (text, new_doc, sp), ids in zip(pending, _encode_lines(tokenizer, [t for t, _, _ in pending])):
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
        for text, new_doc, split, nbytes in _lines(paths, sources, eval_fraction):
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


# --------------------------------------------------------------------------- checks on read-back
class CacheDamaged(Exception):
    """Why a cached preparation cannot be used (its message is the reason the warning names)."""


def check_cache(root: Path, key: str, paths: list[Path], sources: list[dict[str, Any]], tokenizer,
                eval_fraction: float) -> dict[str, Any]:
    """The meta of the cache at `root` once it is shown to hold this corpus's tokens (module docstring), or
    `CacheDamaged` naming the file and the reason; a corpus file that changed meanwhile is a `UserError`."""
    if root.is_symlink() or not root.is_dir():
        raise CacheDamaged("not a folder")
    handles: dict[str, Any] = {}
    try:
        folder = ConfinedFolder(root, OPTION, KIND)
        meta = folder.read_json(META_FILE, limit=MAX_META_BYTES)
        _check_meta(meta, key, sources, tokenizer, eval_fraction)
        dtype = token_dtype(len(tokenizer))
        for split in SPLITS:
            info = meta["splits"][split]
            for kind, size in (("tokens", info["tokens"] * dtype.itemsize), ("docs", 8 * info["documents"]),
                               ("ends", 8 * info["lines"])):
                name = f"{split}.{kind}"
                handles[name] = fh = os.fdopen(folder.open(name, limit=size), "rb")
                if os.fstat(fh.fileno()).st_size != size:
                    raise CacheDamaged(f"{name} has {os.fstat(fh.fileno()).st_size} bytes, meta.json needs {size}")
                if stream_sha256(fh) != meta["files"][name]:
                    raise CacheDamaged(f"{name}: SHA-256 differs from meta.json's")
        ends = {split: _check_ends(handles, meta, split, dtype, len(tokenizer)) for split in SPLITS}
        _check_against_corpus(handles, meta, ends, paths, sources, tokenizer, eval_fraction, dtype)
    except UserError as exc:
        if str(exc).startswith("--corpus "):  # the corpus changed under the run: not the cache's fault
            raise
        raise CacheDamaged(str(exc).removeprefix(f"{OPTION} ")) from None
    finally:
        for fh in handles.values():
            fh.close()
    return meta


def cache_problem(root: Path, key: str, paths: list[Path], sources: list[dict[str, Any]], tokenizer,
                  eval_fraction: float) -> str | None:
    """Why the cache folder `root` cannot be used for this corpus, or None when it holds the corpus's tokens."""
    try:
        check_cache(root, key, paths, sources, tokenizer, eval_fraction)
    except CacheDamaged as exc:
        return str(exc)
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_meta(meta: dict[str, Any], key: str, sources: list[dict[str, Any]], tokenizer,
                eval_fraction: float) -> None:
    """meta.json a complete object of this key, corpus, tokenizer and split, with counts and every file's
    checksum (names only of the cache's own files)."""
    if meta.get("complete") is not True or meta.get("key") != key or meta.get("format_version") != FORMAT_VERSION \
            or meta.get("sources") != sources or meta.get("eval_fraction") != eval_fraction:
        raise CacheDamaged("meta.json is incomplete or of another corpus")
    start_id, sep_id, pad_id = special_ids(tokenizer)
    expected = {"dtype": token_dtype(len(tokenizer)).name, "vocab_size": len(tokenizer), "start_id": start_id,
                "sep_id": sep_id, "pad_id": pad_id, "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)}
    wrong = sorted(name for name, value in expected.items() if meta.get(name) != value)
    if wrong:
        raise CacheDamaged(f"meta.json: {', '.join(wrong)} not this tokenizer's")
    splits, files = meta.get("splits"), meta.get("files")
    if not isinstance(files, dict) or set(files) != set(_token_files()) \
            or not all(isinstance(v, str) for v in files.values()):
        raise CacheDamaged("meta.json names other files than a cache's, or no checksums")
    for split in SPLITS:
        info = splits.get(split) if isinstance(splits, dict) else None
        if not isinstance(info, dict) or not all(_is_count(info.get(k)) for k in COUNTS):
            raise CacheDamaged(f"meta.json: split {split!r} has no valid counts")


def _check_ends(handles: dict[str, Any], meta: dict[str, Any], split: str, dtype: np.dtype,
                vocab_size: int) -> np.ndarray:
    """The split's line ends: never decreasing, a sentence at least one token and its separator long, the
    last at the stream's end, a separator at every sentence's end; every id inside the vocabulary."""
    info = meta["splits"][split]
    handles[f"{split}.ends"].seek(0)
    ends = np.fromfile(handles[f"{split}.ends"], dtype=np.uint64, count=info["lines"]).astype(np.int64)
    steps = np.diff(np.concatenate([[0], ends]))
    if bool((steps < 0).any()) or bool((steps == 1).any()) or (int(ends[-1]) if ends.size else 0) != info["tokens"]:
        raise CacheDamaged(f"{split}.ends holds line ends out of order or past {split}.tokens")
    if int((steps > 0).sum()) != info["sentences"]:
        raise CacheDamaged(f"meta.json: the {split} sentences are not those of {split}.ends")
    if info["tokens"]:
        fh = handles[f"{split}.tokens"]
        stream = np.memmap(fh, dtype=dtype, mode="r", shape=(info["tokens"],))
        if bool((stream[ends[steps > 0] - 1] != meta["sep_id"]).any()):
            raise CacheDamaged(f"{split}.tokens has no separator where a sentence of {split}.ends ends")
        for start in range(0, info["tokens"], 1 << 22):
            if int(stream[start:start + (1 << 22)].max()) >= vocab_size:
                raise CacheDamaged(f"{split}.tokens holds ids outside the vocabulary")
    return ends


class _Replay:
    """The corpus's lines placed in the cache's line ends as the build placed them: each split's next line
    takes its next end; a line with tokens that opens a document (or follows one without) starts a document."""

    def __init__(self, ends: dict[str, np.ndarray]):
        self.ends = ends
        self.seen = {s: 0 for s in SPLITS}
        self.docs: dict[str, list[int]] = {s: [] for s in SPLITS}
        self.words = {s: 0 for s in SPLITS}
        self.carry = {s: False for s in SPLITS}

    def place(self, text: str, new_doc: bool, sp: str) -> tuple[int, int]:
        """(start, end) of this line in its split's stream."""
        k = self.seen[sp]
        if k >= len(self.ends[sp]):
            raise CacheDamaged(f"{sp}.ends holds fewer lines than the corpus")
        self.seen[sp] += 1
        start, end = (int(self.ends[sp][k - 1]) if k else 0), int(self.ends[sp][k])
        if end > start:
            if new_doc or self.carry[sp]:
                self.docs[sp].append(start)
                self.carry[sp] = False
            self.words[sp] += len(text.split())
        else:
            self.carry[sp] = self.carry[sp] or new_doc
        return start, end

    def check(self, handles: dict[str, Any], splits: dict[str, Any]) -> None:
        """Every line end used, the document starts and word counts those of the corpus."""
        for sp in SPLITS:
            if self.seen[sp] != len(self.ends[sp]):
                raise CacheDamaged(f"{sp}.ends holds more lines than the corpus")
            handles[f"{sp}.docs"].seek(0)
            stored = np.fromfile(handles[f"{sp}.docs"], dtype=np.uint64, count=splits[sp]["documents"])
            if stored.tolist() != self.docs[sp]:
                raise CacheDamaged(f"{sp}.docs holds document starts that are not the corpus's")
            if self.words[sp] != splits[sp]["words"]:
                raise CacheDamaged(f"meta.json: the {sp} word count is not the corpus's")


def _sampled_lines(total: int) -> set[int] | None:
    """None (every line) for a corpus of at most FULL_CHECK_LINES lines, else SAMPLE_LINES line numbers drawn
    afresh from the system's randomness (a fixed sample would tell a forger which lines to leave alone)."""
    if total <= FULL_CHECK_LINES:
        return None
    return set(np.random.default_rng(secrets.randbits(128)).choice(total, size=SAMPLE_LINES, replace=False).tolist())


def _check_against_corpus(handles: dict[str, Any], meta: dict[str, Any], ends: dict[str, np.ndarray],
                          paths: list[Path], sources: list[dict[str, Any]], tokenizer, eval_fraction: float,
                          dtype: np.dtype) -> None:
    """Read the corpus again (its bytes must be those it is keyed by), place every line in the cache
    (`_Replay`), and tokenise the lines again (all, or a fresh sample) to compare with their stretch of stream."""
    splits = meta["splits"]
    sample = _sampled_lines(sum(splits[s]["lines"] for s in SPLITS))
    streams = {s: np.memmap(handles[f"{s}.tokens"], dtype=dtype, mode="r", shape=(splits[s]["tokens"],))
               if splits[s]["tokens"] else np.zeros(0, dtype=dtype) for s in SPLITS}
    replay = _Replay(ends)
    pending: list[tuple[str, str, int, int]] = []
    for number, (text, new_doc, sp, _) in enumerate(_lines(paths, sources, eval_fraction)):
        start, end = replay.place(text, new_doc, sp)
        if sample is None or number in sample:
            pending.append((text, sp, start, end))
            if len(pending) >= 4096:
                _compare_lines(pending, streams, tokenizer)
                pending.clear()
    _compare_lines(pending, streams, tokenizer)
    replay.check(handles, splits)


def _compare_lines(pending: list[tuple[str, str, int, int]], streams: dict[str, np.ndarray], tokenizer) -> None:
    """Each pending line's ids against its stretch of its split's stream (its ids, then the separator)."""
    for (text, sp, start, end), ids in zip(pending, _encode_lines(tokenizer, [t for t, _, _, _ in pending])):
        stored = streams[sp][start:max(start, end - 1)].tolist()
        if (end > start) != bool(ids) or stored != list(ids):
            raise CacheDamaged(f"{sp}.tokens holds tokens that are not the tokenizer's tokens of the corpus")


# --------------------------------------------------------------------------- packing
class PackedSequences:
    """Fixed-length windows over a token stream, each prefixed by the start token ([CLS] / <s>)."""

    def __init__(self, stream: np.ndarray, seq_length: int, start_id: int, pad_id: int):
        if seq_length < 2:
            raise UserError(f"--seq-length must be at least 2, got {seq_length}")
        self.stream = stream
        self.seq_length = int(seq_length)
        self.body = self.seq_length - 1
        self.start_id = int(start_id)
        self.pad_id = int(pad_id)

    def __len__(self) -> int:
        return -(-len(self.stream) // self.body)

    def batch(self, indices: Sequence[int] | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """`(input_ids, attention_mask)` as int64 [len(indices), seq_length]; only the final window pads."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"sequence index out of range [0, {n})")
        ids = np.full((len(idx), self.seq_length), self.pad_id, dtype=np.int64)
        att = np.zeros((len(idx), self.seq_length), dtype=np.int64)
        ids[:, 0] = self.start_id
        att[:, 0] = 1
        for row, i in enumerate(idx):
            lo = int(i) * self.body
            chunk = self.stream[lo : lo + self.body]
            ids[row, 1 : 1 + len(chunk)] = chunk
            att[row, : 1 + len(chunk)] = 1
        return torch.from_numpy(ids), torch.from_numpy(att)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled sequence order of one epoch, reproducible from (seed, epoch) alone (exact resume)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EC, epoch]))
    return rng.permutation(n)
