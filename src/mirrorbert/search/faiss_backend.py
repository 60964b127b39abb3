"""faiss, where it is wanted and installed: whether to use it, and the exact inner-product index every path
builds. A module of its own so that search and the index folder's writer and reader share one answer without
importing each other; faiss itself is imported only when used."""

from __future__ import annotations

import numpy as np

from mirrorbert.errors import UserError

ADD_ROWS = 16384  # rows added to a faiss index at a time (bounds the float32 copy of a memory-mapped chunk)


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def wants_faiss(use_faiss: bool | None) -> bool:
    """True: faiss (an error if missing); None: faiss when importable; False: never."""
    if use_faiss and not faiss_available():
        raise UserError("faiss was requested but is not installed: pip install \"mirrorbert[faiss]\"")
    return bool(use_faiss) or (use_faiss is None and faiss_available())


def build_faiss_index(keys: np.ndarray, chunk_size: int = ADD_ROWS):
    """An exact inner-product faiss index (`IndexFlatIP`) over ``keys``, added in chunks."""
    import faiss

    index = faiss.IndexFlatIP(keys.shape[1])
    for k0 in range(0, keys.shape[0], chunk_size):
        index.add(np.ascontiguousarray(keys[k0 : k0 + chunk_size], dtype=np.float32))
    return index


__all__ = ["faiss_available", "wants_faiss", "build_faiss_index"]
