"""The prepared MLM corpus as training reads it: the cache folder's layout, its token streams, and the packed sequences.

A prepared corpus is a flat token *stream* per split on disk: every sentence (one non-blank line) followed by the
separator token. Training reads fixed-length windows of that stream through `numpy.memmap`, so batches cost a
slice and the model is never starved by tokenisation.

Packing: sequence i is `[CLS] + stream[i*(L-1) : (i+1)*(L-1)]` (`<s>` for RoBERTa, whose separator
is `</s>`). Windows tile the stream exactly, so no token is lost or duplicated and only the very last
sequence of a split can need padding. Sentences that straddle a window boundary continue in the next
window, as in RoBERTa's FULL-SENTENCES packing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder

FORMAT_VERSION = 3  # in the cache key and meta.json: a cache of another format is prepared again
META_FILE = "meta.json"
MAX_META_BYTES = 1 << 20
SPLITS = ("train", "eval")
KINDS = ("tokens", "docs", "ends")  # the files of each split
COUNTS = ("tokens", "sentences", "documents", "words", "lines")  # meta.json's counts of each split
OPTION = "--cache-dir"
KIND = "tokenised corpus cache"
FULL_CHECK_LINES = 50_000  # a cache of a corpus of at most this many lines is checked line by line
SAMPLE_LINES = 4096  # lines of a bigger corpus tokenised again, drawn afresh each run


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


def token_files() -> list[str]:
    """The cache's token files: each split's stream, document starts and line ends."""
    return [f"{split}.{kind}" for split in SPLITS for kind in KINDS]


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
