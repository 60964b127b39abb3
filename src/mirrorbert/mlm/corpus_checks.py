"""Checks of a tokenised corpus cache before it is used: it must hold this corpus's tokens.

The cache is read back as untrusted (anyone who can write there can edit it and rehash meta.json), and used only
once it is shown to hold this corpus's tokens: every file read through `safeguards.confined.ConfinedFolder`
(inside the cache folder, a regular file of the size the counts give, meta.json bounded and nested no deeper
than JSON's limit), its SHA-256 the recorded one (bit rot), ids inside the vocabulary, a separator at every
line's end; then the corpus is read again (its bytes must hash to the key's SHA-256), every line placed in its
split and its document starts and word counts recomputed, and the lines tokenised again and compared with
their stretch of the stream: all of them for a corpus of at most `FULL_CHECK_LINES` lines, else
`SAMPLE_LINES` lines drawn afresh each run from the operating system's randomness (a fixed sample would tell a
forger which lines to leave alone; a fresh one finds a forgery of a share f of the lines with probability
1 - (1 - f) ** SAMPLE_LINES).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.data.token_store import tokenizer_fingerprint
from mirrorbert.errors import UserError
from mirrorbert.mlm.corpus_lines import corpus_lines, encode_lines
from mirrorbert.mlm.tokenized import (
    COUNTS,
    FORMAT_VERSION,
    KIND,
    MAX_META_BYTES,
    META_FILE,
    OPTION,
    SPLITS,
    special_ids,
    token_dtype,
    token_files,
)
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import stream_sha256

FULL_CHECK_LINES = 50_000  # a cache of a corpus of at most this many lines is checked line by line
SAMPLE_LINES = 4096  # lines of a bigger corpus tokenised again, drawn afresh each run


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
    if not isinstance(files, dict) or set(files) != set(token_files()) \
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
    for number, (text, new_doc, sp, _) in enumerate(corpus_lines(paths, sources, eval_fraction)):
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
    for (text, sp, start, end), ids in zip(pending, encode_lines(tokenizer, [t for t, _, _, _ in pending])):
        stored = streams[sp][start:max(start, end - 1)].tolist()
        if (end > start) != bool(ids) or stored != list(ids):
            raise CacheDamaged(f"{sp}.tokens holds tokens that are not the tokenizer's tokens of the corpus")
