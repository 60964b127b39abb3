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
atomically: an interrupted preparation never leaves a half cache. meta.json records the SHA-256 of every
token file; a cache is reused only when its meta.json is well-formed and every file has the recorded size
and checksum and holds ids inside the vocabulary. A damaged cache is set aside (renamed
`<name>.damaged-<time>`, never deleted or used) with a warning, and the corpus is tokenised again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

import mirrorbert.jsonio as jsonio
from mirrorbert.data.strings import check_utf8_file
from mirrorbert.data.token_store import tokenizer_fingerprint  # noqa: F401  (here since the MLM cache)
from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes import remove_tree, write_error, write_errors, write_failure

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: keyed by content checksums, token files checksummed
META_FILE = "meta.json"
MAX_META_BYTES = 1 << 20
SPLITS = ("train", "eval")


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
    with open(path, "rb") as fh:
        return any(raw.strip() for raw in fh)


def _has_blank_separators(path: Path) -> bool:
    """True when the file uses blank lines between non-blank ones (documents); reads until the first such."""
    seen_text = False
    seen_blank_after_text = False
    with open(path, "rb") as fh:
        for raw in fh:
            if raw.strip():
                if seen_blank_after_text:
                    return True
                seen_text = True
            elif seen_text:
                seen_blank_after_text = True
    return False


def iter_sentences(path: Path) -> Iterator[tuple[str, bool, int]]:
    """Yield `(sentence, starts_new_document, bytes_read)`; reads bytes so a broken byte never stops a run."""
    by_blank = _has_blank_separators(path)
    new_doc = True
    skipped = 0  # bytes of blank lines, reported with the next sentence so progress adds up
    with open(path, "rb") as fh:
        for raw in fh:
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                new_doc = True
                skipped += len(raw)
                continue
            yield text, (new_doc or not by_blank), len(raw) + skipped
            new_doc, skipped = False, 0


def is_eval_document(doc_index: int, eval_fraction: float) -> bool:
    """Evenly spaced selection: document d is held out when round(d*f) steps up, i.e. about every 1/f-th."""
    if eval_fraction <= 0:
        return False
    return math.floor((doc_index + 1) * eval_fraction + 0.5) > math.floor(doc_index * eval_fraction + 0.5)


# --------------------------------------------------------------------------- the prepared corpus
@dataclass
class TokenizedCorpus:
    """A prepared corpus folder: `{train,eval}.tokens` streams and `{train,eval}.docs` document starts."""

    root: Path
    meta: dict[str, Any]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    def stream(self, split: str) -> np.ndarray:
        """The split's token stream as a read-only memmap (an empty array for an empty split)."""
        n = int(self.meta["splits"][split]["tokens"])
        if n == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.root / f"{split}.tokens", dtype=self.dtype, mode="r", shape=(n,))

    def doc_starts(self, split: str) -> np.ndarray:
        n = int(self.meta["splits"][split]["documents"])
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        return np.memmap(self.root / f"{split}.docs", dtype=np.uint64, mode="r", shape=(n,))

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
    """Tokenise the corpus into `cache_dir/<key>/` unless an identical preparation is already there."""
    paths = check_corpus_files([corpus] if isinstance(corpus, (str, Path)) else list(corpus))
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"--eval-fraction must be in [0, 1), got {eval_fraction}")
    start_id, sep_id, pad_id = special_ids(tokenizer)
    vocab_size = len(tokenizer)
    fingerprint = tokenizer_fingerprint(tokenizer)
    sources = [{"name": p.name, "size": p.stat().st_size, "sha256": _content_sha256(p)} for p in paths]
    key_obj = {"v": FORMAT_VERSION, "sources": sources, "tokenizer": fingerprint, "eval_fraction": eval_fraction}
    key = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()[:20]  # key, not output
    cache_dir = Path(cache_dir)
    root = cache_dir / f"{paths[0].stem[:40]}-{key}"
    if os.path.lexists(root):
        problem = cache_problem(root, key, vocab_size)
        if problem is None:
            logger.info("using tokenised corpus cache %s", root)
            return TokenizedCorpus(root, json.loads((root / META_FILE).read_text(encoding="utf-8")))
        aside = _set_aside(root)
        logger.warning("tokenised corpus cache %s is damaged (%s): set aside as %s; tokenising the corpus again",
                       root, problem, aside.name)

    with write_errors(cache_dir, "--cache-dir"):  # a full disk: one line naming the cache, nothing left there
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=cache_dir))
    try:
        meta = _tokenize_into(
            tmp, paths, tokenizer, sep_id, token_dtype(vocab_size), eval_fraction, batch_lines, show_progress
        )
        if meta["splits"]["train"]["sentences"] + meta["splits"]["eval"]["sentences"] == 0:
            names = ", ".join(str(p) for p in paths)
            raise UserError(f"--corpus {names}: the corpus is empty (no non-blank line gives any token)")
        meta.update(
            key=key,
            files={name: _content_sha256(tmp / name) for name in _token_files()},
            format_version=FORMAT_VERSION,
            sources=sources,
            tokenizer_fingerprint=fingerprint,
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
            raise write_error(cache_dir, "--cache-dir", code) from None
        raise
    logger.info(
        "tokenised corpus: %d train / %d held-out tokens (incl. separators) in %s",
        meta["splits"]["train"]["tokens"],
        meta["splits"]["eval"]["tokens"],
        root,
    )
    return TokenizedCorpus(root, meta)


def _token_files() -> list[str]:
    return [f"{split}.{kind}" for split in SPLITS for kind in ("tokens", "docs")]


def _content_sha256(path: Path) -> str:
    from mirrorbert.safeguards.readback import file_sha256

    return file_sha256(path, what="--corpus")


def _set_aside(root: Path) -> Path:
    """Rename a damaged cache folder (or whatever sits at its name) out of the way; nothing is deleted."""
    from mirrorbert.safeguards.readback import set_aside

    return set_aside(root, "--cache-dir")


def cache_problem(root: Path, key: str, vocab_size: int) -> str | None:
    """Why the cache folder `root` cannot be used, or None when it is complete and intact: meta.json a
    well-formed object of this key, every token file of the recorded size and SHA-256, ids in the vocabulary,
    document starts inside their stream and increasing."""
    from mirrorbert.safeguards.readback import parse_json, read_regular_bytes

    if root.is_symlink() or not root.is_dir():
        return "not a folder"
    try:
        meta = parse_json(read_regular_bytes(root / META_FILE, "--cache-dir", MAX_META_BYTES), "--cache-dir",
                          root / META_FILE)
    except UserError as exc:
        return str(exc).split(": ", 1)[-1]
    if not isinstance(meta, dict) or meta.get("complete") is not True or meta.get("key") != key:
        return "meta.json is incomplete or of another corpus"
    dtype = token_dtype(vocab_size)
    splits, files = meta.get("splits"), meta.get("files")
    if meta.get("dtype") != dtype.name or not isinstance(splits, dict) or not isinstance(files, dict):
        return "meta.json has a wrong dtype or no splits/checksums"
    for name in ("start_id", "sep_id", "pad_id"):
        value = meta.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
            return f"meta.json: {name} is not a token id"
    for split in SPLITS:
        info = splits.get(split)
        if not isinstance(info, dict) or not all(isinstance(info.get(k), int) and not isinstance(info.get(k), bool)
                                                 and info.get(k) >= 0 for k in ("tokens", "sentences", "documents")):
            return f"meta.json: split {split!r} has no valid counts"
        for kind, item, count in (("tokens", dtype.itemsize, info["tokens"]), ("docs", 8, info["documents"])):
            path = root / f"{split}.{kind}"
            if path.is_symlink() or not path.is_file():
                return f"{path.name} is missing or not a regular file"
            if path.stat().st_size != count * item:
                return f"{path.name} has {path.stat().st_size} bytes, meta.json needs {count * item}"
            if files.get(path.name) != _content_sha256(path):
                return f"{path.name}: SHA-256 differs from meta.json's"
        if info["tokens"]:
            tokens = np.memmap(root / f"{split}.tokens", dtype=dtype, mode="r")
            if int(tokens.max()) >= vocab_size:
                return f"{split}.tokens holds ids outside the vocabulary"
        if info["documents"]:
            docs = np.array(np.memmap(root / f"{split}.docs", dtype=np.uint64, mode="r"))
            if (docs.size > 1 and bool((np.diff(docs.astype(np.int64)) <= 0).any())) or int(docs.max()) >= max(
                    info["tokens"], 1):
                return f"{split}.docs holds document starts out of order or past the stream"
    return None


def _tokenize_into(
    out: Path,
    paths: list[Path],
    tokenizer,
    sep_id: int,
    dtype: np.dtype,
    eval_fraction: float,
    batch_lines: int,
    show_progress: bool,
) -> dict[str, Any]:
    from mirrorbert.reporting.progress import progress_bar

    files = {s: open(out / f"{s}.tokens", "wb") for s in SPLITS}
    docs = {s: open(out / f"{s}.docs", "wb") for s in SPLITS}
    counts = {s: {"tokens": 0, "sentences": 0, "documents": 0, "words": 0} for s in SPLITS}
    total_bytes = sum(p.stat().st_size for p in paths)
    bar = progress_bar(total=total_bytes, unit="B", unit_scale=True, desc="tokenising corpus", show=show_progress)
    doc_index = -1
    split = "train"
    pending: list[tuple[str, bool, str]] = []  # (text, new document, split)
    # A line that tokenises to nothing (control characters only) is dropped; if it opened a document,
    # the document starts at that split's next sentence that does give tokens.
    carry_doc_start = {s: False for s in SPLITS}

    def flush() -> None:
        if not pending:
            return
        texts = [t for t, _, _ in pending]
        encoded = tokenizer(
            texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False, verbose=False
        )["input_ids"]
        for (text, new_doc, sp), ids in zip(pending, encoded):
            if not ids:
                carry_doc_start[sp] = carry_doc_start[sp] or new_doc
                continue
            c = counts[sp]
            if new_doc or carry_doc_start[sp]:
                carry_doc_start[sp] = False
                np.asarray([c["tokens"]], dtype=np.uint64).tofile(docs[sp])
                c["documents"] += 1
            arr = np.empty(len(ids) + 1, dtype=dtype)
            arr[:-1] = ids
            arr[-1] = sep_id
            arr.tofile(files[sp])
            c["tokens"] += len(arr)
            c["sentences"] += 1
            c["words"] += len(text.split())
        pending.clear()

    try:
        for path in paths:
            for text, new_doc, nbytes in iter_sentences(path):
                if new_doc:
                    doc_index += 1
                    split = "eval" if is_eval_document(doc_index, eval_fraction) else "train"
                pending.append((text, new_doc, split))
                bar.update(nbytes)
                if len(pending) >= batch_lines:
                    flush()
        flush()
    finally:
        bar.close()
        for fh in (*files.values(), *docs.values()):
            fh.close()
    return {"splits": counts}


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
