"""Nearest-neighbour search: exact chunked top-k and faiss (`exact`), a running exact top-k over a corpus
encoded a chunk at a time (`streaming`), the approximate IVF index with exact
rescoring (`approximate`), int8/binary vectors (`quantized`), the persistent index on disk (`index_store`) and
the read-back of its numpy files, the vectors memory-mapped (`index_files`).
"""

_EXACT = {"search", "SearchIndex", "Hit", "build_index", "cosine_topk", "chunked_topk", "l2_normalize"}


def __getattr__(name):
    # `from mirrorbert.search import search, SearchIndex` keeps working; numpy is imported only when used.
    if name in _EXACT:
        from mirrorbert.search import exact

        return getattr(exact, name)
    raise AttributeError(name)
