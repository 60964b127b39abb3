"""The one streaming pass that writes a token store's files (their layout: `data.token_files`).

The strings come in chunks (`data.readers.chunked`: the fast tokenizer on `CHUNK` strings a call, never a Python
list of every string's ids), so a streaming reader can feed the pass an iterable of chunks. A string whose ids are
all special tokens (only control or zero-width characters) is dropped, as `mirror.views.drop_tokenless` drops it;
the manifest counts them and keeps the first one's beginning for the warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from mirrorbert.data.token_files import ALL_FILES, EXAMPLE_CHARS, string_bytes

CHECKED = 32  # strings of each chunk also tokenised through the tokenizer's own call, as a check


def special_ids(tokenizer) -> np.ndarray:
    return np.array(sorted({int(i) for i in tokenizer.all_special_ids}), dtype=np.int64)


def write_store(out: Path, chunks: Iterable[Sequence[str]], tokenizer,
                max_length: int) -> tuple[dict[str, Any], str]:
    """One pass: each chunk tokenised in one call and appended to the files; returns the counts and the SHA-256
    of the strings streamed (as `data.strings.fingerprint` takes it)."""
    special = special_ids(tokenizer)
    digest = hashlib.sha256()
    stack = contextlib.ExitStack()
    meta: dict[str, Any] = {"strings": 0, "tokens": 0, "text_bytes": 0, "read": 0, "dropped": 0, "dropped_bytes": 0,
                            "dropped_example": None, "max_chars": 0, "max_real_tokens": 0}
    handles = {stem: open(out / f"{stem}.bin", "wb") for stem in ALL_FILES}
    try:
        stack.enter_context(tokenizer_threads())
        for stem in ("ids_offsets", "text_offsets", "dropped_offsets"):
            np.zeros(1, dtype=np.int64).tofile(handles[stem])
        for chunk in chunks:
            chunk = list(chunk)
            digest.update(b"".join(string_bytes(s) + b"\n" for s in chunk))
            _append_chunk(handles, chunk, tokenizer, max_length, special, meta)
    finally:
        stack.close()
        for fh in handles.values():
            fh.close()
    return meta, digest.hexdigest()


@contextlib.contextmanager
def tokenizer_threads() -> Iterator[None]:
    """The fast tokenizer on every core for the pass (its own threads; `TOKENIZERS_PARALLELISM`, which the
    command line sets to false against fork warnings, is read at each call), the setting put back after.
    Nothing forks during the pass, and nothing after it forks a process that tokenises."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def real_counts(flat: np.ndarray, lengths: np.ndarray, special: np.ndarray) -> np.ndarray:
    """The number of ids of each string (consecutive runs of `lengths` in `flat`) that are not special."""
    ends = np.cumsum(lengths)
    real_cum = np.concatenate([[0], np.cumsum(~np.isin(flat, special))])
    return real_cum[ends] - real_cum[ends - lengths]


def _append_chunk(handles, chunk: list[str], tokenizer, max_length: int, special: np.ndarray,
                  meta: dict[str, Any]) -> None:
    """Tokenise one chunk, set aside its strings without real tokens, append ids, text and both offsets."""
    if not chunk:
        return
    encoded = encode_chunk(tokenizer, chunk, max_length)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
    real = real_counts(flat, lengths, special)
    keep = real > 0
    if not keep.all():
        _append_dropped(handles, chunk, keep, meta)
        flat = flat[np.repeat(keep, lengths)]
        lengths, chunk = lengths[keep], [s for s, k in zip(chunk, keep) if k]
    meta["read"] += len(keep)
    if not chunk:
        return
    texts = [string_bytes(s) for s in chunk]
    text_lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    flat.astype(np.int32).tofile(handles["ids"])
    (meta["tokens"] + np.cumsum(lengths)).tofile(handles["ids_offsets"])
    handles["text"].write(b"".join(texts))
    (meta["text_bytes"] + np.cumsum(text_lengths)).tofile(handles["text_offsets"])
    meta["strings"] += len(chunk)
    meta["tokens"] += int(lengths.sum())
    meta["text_bytes"] += int(text_lengths.sum())
    meta["max_chars"] = max(meta["max_chars"], max(map(len, chunk)))
    meta["max_real_tokens"] = max(meta["max_real_tokens"], int(real[keep].max()))


def _append_dropped(handles, chunk: list[str], keep: np.ndarray, meta: dict[str, Any]) -> None:
    """The chunk's strings without real tokens, kept aside with their positions among the strings read."""
    where = np.flatnonzero(~keep)
    texts = [string_bytes(chunk[i]) for i in where.tolist()]
    if meta["dropped_example"] is None:
        meta["dropped_example"] = chunk[int(where[0])][:EXAMPLE_CHARS]
    handles["dropped"].write(b"".join(texts))
    (meta["dropped_bytes"] + np.cumsum([len(t) for t in texts], dtype=np.int64)).tofile(handles["dropped_offsets"])
    (meta["read"] + where.astype(np.int64)).tofile(handles["dropped_at"])
    meta["dropped"] += len(texts)
    meta["dropped_bytes"] += sum(map(len, texts))


def encode_chunk(tokenizer, chunk: list[str], max_length: int) -> list[list[int]]:
    """`tokenizer(chunk, add_special_tokens=True, truncation=True, max_length=L)["input_ids"]`, through the fast
    backend's `encode_batch_fast` (no offsets computed: about twice the speed) where the tokenizer has one.

    The backend is called as transformers' own fast path calls it (longest-first truncation on the
    tokenizer's side, no padding), with the backend's settings put back afterwards; the first strings of each
    chunk are checked against the tokenizer's own call, and any difference sends the chunk that way.
    """
    if not chunk:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    encode = getattr(backend, "encode_batch_fast", None) if getattr(tokenizer, "is_fast", False) else None
    reference = lambda texts: tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length,
                                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    if encode is None:
        return reference(chunk)
    checked = reference(chunk[:CHECKED])
    truncation, padding = backend.truncation, backend.padding
    try:
        backend.enable_truncation(max_length, strategy="longest_first",
                                  direction=getattr(tokenizer, "truncation_side", "right"))
        backend.no_padding()
        ids = [e.ids for e in encode(chunk, add_special_tokens=True)]
    finally:
        _restore(backend, truncation, padding)
    return ids if ids[:CHECKED] == checked else reference(chunk)


def _restore(backend, truncation, padding) -> None:
    if truncation is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(**truncation)
    if padding is None:
        backend.no_padding()
    else:
        padding = dict(padding)
        padding["length"] = padding.pop("length", None)
        backend.enable_padding(**padding)
