"""Nearest-neighbour search: exact chunked top-k and faiss (`exact`), int8/binary vectors (`quantized`), and the
persistent index on disk (`index_store`).
"""

_EXACT = {"search", "SearchIndex", "Hit", "build_index", "cosine_topk", "chunked_topk", "l2_normalize"}


def __getattr__(name):
    # `from mirrorbert.search import search, SearchIndex` keeps working; numpy is imported only when used.
    if name in _EXACT:
        from mirrorbert.search import exact

        return getattr(exact, name)
    raise AttributeError(name)
