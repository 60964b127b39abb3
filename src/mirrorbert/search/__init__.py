"""Nearest-neighbour search over vectors of any encoder (an object with `encode`): exact chunked top-k,
`SearchIndex`, `build_index` and `search` (`exact`, on the primitives of `ranking`), a running exact top-k over a
corpus encoded a chunk at a time (`streaming`), the approximate IVF index (`approximate`), int8/binary vectors
(`quantized`), and the index folder: its writer and reader (`index_store`), its manifest and the checks of what
it claims (`index_claims`, `fingerprints`), the read-back of its files (`index_files`).
"""

_EXACT = {"search", "SearchIndex", "Hit", "build_index", "cosine_topk", "chunked_topk", "l2_normalize"}


def __getattr__(name):
    # `from mirrorbert.search import search, SearchIndex` works without importing numpy until it is used.
    if name in _EXACT:
        from mirrorbert.search import exact

        return getattr(exact, name)
    raise AttributeError(name)
