"""Checks of a cached token store before it is used: it must hold the data's strings and the tokenizer's ids.

Read back as untrusted (the cache outlives the run that wrote it, and anyone who can write there can edit it
and rehash its manifest): a store is used only once its content is checked against the data it claims to hold.
Every file is read through `safeguards.confined.ConfinedFolder` (inside the store, a regular file, of exactly the
size the counts give, the manifest bounded and nested no deeper than JSON's limit) from the descriptor that the
run then reads; then

* the strings: the SHA-256 of the strings as the data gives them (`data_sha256`, which the caller computed from
  the data, never read from the store) is recomputed from `text.bin` and the dropped strings (`dropped*.bin`,
  with their positions), so the store holds exactly the data's strings, in order; every dropped string is
  tokenised again and must give no real token;
* the ids: offsets from 0, never decreasing, to their file's end; ids inside the vocabulary; every string with a
  real token; the strings tokenised again and compared with the stored ids: all of them when the store holds
  at most `FULL_CHECK` strings (a few seconds of the fast tokenizer), else `SAMPLE` strings drawn afresh each run
  from the operating system's randomness (a fixed sample would tell a forger which strings to leave alone; a
  fresh one finds a forgery of a share f of the strings with probability 1 - (1 - f) ** SAMPLE);
* the manifest's counts (`max_chars`, `max_real_tokens`, the dropped example) are recomputed and must agree;
  the files' SHA-256 in the manifest still catch bit rot in strings a sample skips.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from mirrorbert.data.token_files import (
    ALL_FILES,
    CHUNK,
    EXAMPLE_CHARS,
    FILES,
    FORMAT,
    INT64,
    KIND,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    OPTION,
    StoreDamaged,
    TokenStore,
    file_counts,
    open_files,
    read_array,
)
from mirrorbert.data.token_writing import encode_chunk, real_counts, special_ids, tokenizer_threads
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import PositionedReader, stream_sha256

FULL_CHECK = 50_000  # a store of at most this many strings is tokenised again whole before it is used
SAMPLE = 4096  # strings of a bigger store tokenised again, drawn afresh each run
ROWS = 1 << 16  # strings checked a block at a time
COUNTS = ("strings", "tokens", "text_bytes", "read", "dropped", "dropped_bytes", "max_chars", "max_real_tokens")


def check_store(root: Path, key: str, data_sha256: str, tokenizer, max_length: int) -> TokenStore:
    """The store at `root`, opened and checked against the data (module docstring); `StoreDamaged` naming the
    file and the reason when any check fails."""
    if root.is_symlink() or not root.is_dir():
        raise StoreDamaged("not a folder")
    try:
        folder = ConfinedFolder(root, OPTION, KIND)
        meta = folder.read_json(MANIFEST, limit=MAX_MANIFEST_BYTES)
        _check_manifest(meta, key, data_sha256, max_length)
        files = open_files(folder, file_counts(meta))
    except UserError as exc:  # the refusal names the file and the path; the option is the warning's
        raise StoreDamaged(str(exc).removeprefix(f"{OPTION} ")) from None
    store = TokenStore(root, meta, files)
    try:
        with tokenizer_threads():
            _check_content(store, data_sha256, tokenizer, max_length)
    except BaseException:
        store.close()
        raise
    return store


def _check_manifest(meta: Any, key: str, data_sha256: str, max_length: int) -> None:
    if meta.get("complete") is not True or meta.get("key") != key or meta.get("format") != FORMAT \
            or meta.get("data_sha256") != data_sha256 or meta.get("max_length") != int(max_length):
        raise StoreDamaged("manifest.json is incomplete or of other strings")
    for name in COUNTS:
        value = meta.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StoreDamaged(f"manifest.json: {name} is not a count")
    if meta["read"] != meta["strings"] + meta["dropped"]:
        raise StoreDamaged("manifest.json: the strings read are not those kept plus those dropped")
    files = meta.get("files")
    if not isinstance(files, dict) or set(files) != {f"{stem}.bin" for stem in ALL_FILES} \
            or not all(isinstance(v, str) for v in files.values()):
        raise StoreDamaged("manifest.json names other files than a store's, or no checksums")
    if not isinstance(meta.get("dropped_example"), (str, type(None))):
        raise StoreDamaged("manifest.json: dropped_example is not a string")


def _check_content(store: TokenStore, data_sha256: str, tokenizer, max_length: int) -> None:
    """Every file's checksum (bit rot); offsets, ids and the recomputed counts; the strings against the data;
    the dropped strings without tokens; the ids against the tokenizer (all, or a fresh sample)."""
    for stem, reader in store._handles.items():
        reader.seek(0)
        if stream_sha256(reader) != store.meta["files"][f"{stem}.bin"]:
            raise StoreDamaged(f"{stem}.bin: SHA-256 differs from the manifest's")
    special = special_ids(tokenizer)
    max_chars, max_real = _check_rows(store, len(tokenizer), special)
    if (max_chars, max_real) != (store.max_chars, store.max_real_tokens):
        raise StoreDamaged("manifest.json: max_chars or max_real_tokens are not those of the strings")
    _check_strings(store, data_sha256)
    dropped = store.dropped_texts()
    for start in range(0, len(dropped), CHUNK):
        chunk = dropped[start:start + CHUNK]
        if any(any(int(t) not in special for t in ids) for ids in encode_chunk(tokenizer, chunk, max_length)):
            raise StoreDamaged("dropped.bin holds a string with tokens (a string was taken out of the store)")
    example = dropped[0][:EXAMPLE_CHARS] if dropped else None
    if store.meta["dropped_example"] != example:
        raise StoreDamaged("manifest.json: dropped_example is not the first dropped string")
    _check_ids(store, tokenizer, max_length)


def _check_rows(store: TokenStore, vocab_size: int, special: np.ndarray) -> tuple[int, int]:
    """Offsets from 0, never decreasing, to their file's end; ids in the vocabulary; a real token in every
    string. Read a block of strings at a time with positioned reads (nothing mapped: a check of every page would
    leave the whole store resident, 10M strings: 1.4 GB of ids). Returns (max_chars, max_real_tokens)."""
    counts, files = file_counts(store.meta), store._files
    max_chars = max_real = 0
    n = store.n
    for a in range(0, max(n, 1), ROWS):
        b = min(n, a + ROWS)
        bounds = {}
        for stem in ("ids", "text"):
            off = read_array(files[f"{stem}_offsets"], INT64, a, b - a + 1)
            if (a == 0 and int(off[0]) != 0) or bool((np.diff(off) < 0).any()) or int(off[-1]) > counts[stem] \
                    or (b == n and int(off[-1]) != counts[stem]):
                raise StoreDamaged(f"{stem}_offsets.bin holds offsets out of order or past {stem}.bin")
            bounds[stem] = off
        if b == a:
            break
        ids = read_array(files["ids"], FILES["ids"], int(bounds["ids"][0]), int(bounds["ids"][-1] - bounds["ids"][0]))
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise StoreDamaged("ids.bin holds ids outside the vocabulary")
        real = real_counts(ids.astype(np.int64), np.diff(bounds["ids"]), special)
        if bool((real <= 0).any()):
            raise StoreDamaged("ids.bin holds a string without real tokens")
        text = read_array(files["text"], FILES["text"], int(bounds["text"][0]),
                      int(bounds["text"][-1] - bounds["text"][0]))
        chars = np.concatenate([[0], np.cumsum((text & 0xC0) != 0x80)])  # UTF-8: bytes that start a character
        rel = bounds["text"] - bounds["text"][0]
        max_chars = max(max_chars, int((chars[rel[1:]] - chars[rel[:-1]]).max()))
        max_real = max(max_real, int(real.max()))
    return max_chars, max_real


def _check_strings(store: TokenStore, data_sha256: str) -> None:
    """The strings of the store, the dropped ones put back at their positions, hashed as `data.strings.
    fingerprint` hashes the data's: equal to `data_sha256` only when the store holds exactly the data's strings."""
    counts, files = file_counts(store.meta), store._files
    d = counts["dropped_at"]
    at = read_array(files["dropped_at"], INT64, 0, d)
    bounds = read_array(files["dropped_offsets"], INT64, 0, d + 1)
    if d and (int(at[0]) < 0 or bool((np.diff(at) <= 0).any()) or int(at[-1]) >= int(store.meta["read"])):
        raise StoreDamaged("dropped_at.bin holds positions out of order or past the strings read")
    if int(bounds[0]) != 0 or bool((np.diff(bounds) < 0).any()) or int(bounds[-1]) != counts["dropped"]:
        raise StoreDamaged("dropped_offsets.bin holds offsets out of order or past dropped.bin")
    digest, kept = hashlib.sha256(), 0
    for i, before in enumerate((at - np.arange(d)).tolist()):  # kept strings before the i-th dropped one
        _hash_kept(digest, files, kept, before)
        kept = before
        digest.update(files["dropped"].read(int(bounds[i]), int(bounds[i + 1] - bounds[i])) + b"\n")
    _hash_kept(digest, files, kept, store.n)
    if digest.hexdigest() != data_sha256:
        raise StoreDamaged("text.bin and dropped.bin do not hold the data's strings (their SHA-256 is not the "
                           "data's)")


def _hash_kept(digest, files: dict[str, PositionedReader], a: int, b: int) -> None:
    """Add strings a..b of text.bin to `digest`, each followed by a newline, a block at a time."""
    for start in range(a, b, ROWS):
        off = read_array(files["text_offsets"], INT64, start, min(b, start + ROWS) - start + 1)
        raw = np.frombuffer(files["text"].read(int(off[0]), int(off[-1] - off[0])), dtype=np.uint8)
        digest.update(np.insert(raw, (off[1:] - off[0]).astype(np.intp), 10).tobytes())


def _check_ids(store: TokenStore, tokenizer, max_length: int) -> None:
    """The stored ids of every string (a store of at most FULL_CHECK strings) or of SAMPLE strings drawn afresh
    from the system's randomness, against the tokenizer's ids of the (already checked) strings."""
    if store.n <= FULL_CHECK:
        groups: Iterable[Sequence[int]] = (range(a, min(store.n, a + CHUNK)) for a in range(0, store.n, CHUNK))
    else:
        rng = np.random.default_rng(secrets.randbits(128))
        rows = np.sort(rng.choice(store.n, size=SAMPLE, replace=False)).tolist()
        groups = (rows[a:a + CHUNK] for a in range(0, len(rows), CHUNK))
    for rows in groups:
        rows = rows if isinstance(rows, range) else list(rows)
        if len(rows) and store.token_ids(rows) != encode_chunk(tokenizer, store.texts(rows), max_length):
            raise StoreDamaged("ids.bin holds ids that are not the tokenizer's ids of the strings")
