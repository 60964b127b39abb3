"""Training strings as token ids on disk: flat arrays with offsets, memory-mapped, cached by content.

Why: Python lists of token ids (and every second view of an epoch drawn up front) cost about 10 KB per
training string, so a million strings would need 10 GB before the first step. The store keeps each string's
token ids and text in flat files (`data.token_files`), written in one streaming pass (`data.token_writing`).

Cache: `<cache>/tokens/<key>/`, where `<cache>` is `$MIRRORBERT_CACHE`, else `$XDG_CACHE_HOME/mirrorbert`, else
`~/.cache/mirrorbert` (`cache_root`; the MLM corpus cache lives there too) and the key is the SHA-256 of the
format, the strings' content (their SHA-256, `TrainingStrings.fingerprint`), the tokenizer (`tokenizer_fingerprint`:
its class, its whole tokenizer.json or vocabulary, its special tokens) and `max_length`. A run on the same
strings with the same tokenizer opens the files written before instead of tokenising again. Written into a
temporary folder beside it that replaces the key's folder in one rename: an interrupted build never leaves a
half store; a full disk is one line naming the cache.

A cached store is used only once it is shown to hold the data's strings and the tokenizer's ids
(`data.token_checks`); one that fails a check is set aside (renamed `<key>.damaged-<time>`, never used or
deleted) with one warning line naming the file and the reason, and the strings are tokenised again. While
building, the strings streamed are hashed as they are tokenised: when they are not the strings `data_sha256` was
taken from (the data file was edited during the run), nothing is kept and the run stops with one error line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import mirrorbert.jsonio as jsonio
from mirrorbert.data.token_checks import check_store
from mirrorbert.data.token_files import (
    ALL_FILES,
    CHUNK,
    FORMAT,
    MANIFEST,
    OPTION,
    ListStore,
    StoreDamaged,
    StoreStrings,
    TokenStore,
)
from mirrorbert.data.token_writing import write_store
from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import file_sha256, set_aside
from mirrorbert.safeguards.writes import make_temporary, remove_tree, write_error, write_errors, write_failure

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    """The cache of every command: $MIRRORBERT_CACHE, else $XDG_CACHE_HOME/mirrorbert, else ~/.cache/mirrorbert."""
    base = os.environ.get("MIRRORBERT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mirrorbert")
    return Path(base)


def token_cache_dir() -> Path:
    return cache_root() / "tokens"


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash that changes whenever the tokenisation could change (vocab, normaliser, class)."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(_without_call_settings(backend).encode("utf-8"))
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode("utf-8"))  # key, not output
    h.update(json.dumps([str(t) for t in tokenizer.all_special_tokens]).encode("utf-8"))  # key, not output
    h.update(str(getattr(tokenizer, "do_lower_case", "")).encode())
    return h.hexdigest()


def _without_call_settings(backend) -> str:
    """The backend's JSON without truncation and padding: a call with `truncation=True, max_length=L` leaves
    them set on the shared backend, which would change the fingerprint of the same tokenizer after its first use."""
    text = backend.to_str()
    if '"truncation":null' in text.replace(" ", "") and '"padding":null' in text.replace(" ", ""):
        return text
    from tokenizers import Tokenizer

    clean = Tokenizer.from_str(text)
    clean.no_truncation()
    clean.no_padding()
    return clean.to_str()


def store_key(data_sha256: str, tokenizer, max_length: int) -> str:
    """The cache key: the same strings, tokenizer and length limit give the same ids, so the same folder."""
    key = {"format": FORMAT, "data": data_sha256, "tokenizer": tokenizer_fingerprint(tokenizer),
           "max_length": int(max_length)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]  # key, not output


# --------------------------------------------------------------------------- open or build
def open_token_store(chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
                     cache_dir: str | Path | None = None, source: str = "--data") -> TokenStore:
    """The store of these strings under this tokenizer: the cached one once checked against `data_sha256`, else
    built from `chunks` (read only when building). `data_sha256` must be the strings' content hash
    (`data.strings.fingerprint`): it keys the cache and is what a cached store is checked against; `source`
    names the data in the error when the strings streamed are not the ones it was taken from."""
    cache_dir = Path(cache_dir) if cache_dir is not None else token_cache_dir()
    key = store_key(data_sha256, tokenizer, max_length)
    root = cache_dir / key
    store = _cached(root, key, data_sha256, tokenizer, max_length)
    if store is not None:
        return store
    with write_errors(cache_dir, OPTION):  # a full disk: one line naming the cache, nothing left there
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = make_temporary(root, folder=True)  # a killed build's leftovers for this key are removed first
    try:
        meta = _build(tmp, chunks, data_sha256, tokenizer, max_length, source)
        meta.update(key=key)
        (tmp / MANIFEST).write_text(jsonio.dumps(meta, indent=2) + "\n", encoding="utf-8")
        store = _cached(root, key, data_sha256, tokenizer, max_length, quiet=True)  # built by another run meanwhile
        if store is not None:
            remove_tree(tmp)
            return store
        os.replace(tmp, root)
    except BaseException as exc:
        remove_tree(tmp)
        code = write_failure(exc) if isinstance(exc, Exception) and not isinstance(exc, UserError) else None
        if code is not None:
            raise write_error(cache_dir, OPTION, code) from None
        raise
    logger.info("token store: %d strings, %d token ids, in %s", meta["strings"], meta["tokens"], root)
    return TokenStore(root, meta)


def _build(out: Path, chunks: Iterable[Sequence[str]], data_sha256: str, tokenizer, max_length: int,
           source: str) -> dict[str, Any]:
    """Write the store's files into `out`; its manifest (without the key). The strings streamed must be those
    `data_sha256` was taken from: otherwise the data changed under the run, and nothing is kept."""
    meta, streamed = write_store(out, chunks, tokenizer, max_length)
    if streamed != data_sha256:
        raise UserError(f"{source}: the strings changed while they were read (their SHA-256 is no longer the one "
                        "taken when the run read them: was the file edited during the run?); nothing was cached, "
                        "run again once the file is complete")
    meta.update(format=FORMAT, data_sha256=data_sha256, max_length=int(max_length), vocab_size=len(tokenizer),
                tokenizer_class=type(tokenizer).__name__, complete=True,
                files={f"{stem}.bin": file_sha256(out / f"{stem}.bin", what=OPTION) for stem in ALL_FILES})
    return meta


def _cached(root: Path, key: str, data_sha256: str, tokenizer, max_length: int,
            quiet: bool = False) -> TokenStore | None:
    """The store at `root` once checked against the data, or None (nothing there, or a damaged or forged one,
    which is set aside with one warning)."""
    if not os.path.lexists(root):
        return None
    try:
        store = check_store(root, key, data_sha256, tokenizer, max_length)
    except StoreDamaged as exc:
        aside = set_aside(root, OPTION)
        logger.warning("token store %s is damaged (%s): set aside as %s; tokenising the strings again", root, exc,
                       aside.name)
        return None
    if not quiet:
        logger.info("using the token store %s (%d strings)", root, store.n)
    return store


__all__ = ["CHUNK", "ListStore", "StoreDamaged", "StoreStrings", "TokenStore", "cache_root", "check_store",
           "open_token_store", "store_key", "token_cache_dir", "tokenizer_fingerprint"]
