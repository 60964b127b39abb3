"""The one index folder format: `mirrorbert index` and `SearchIndex.save` write it, `search --index` and
`SearchIndex.load` read it: `vectors.npy`, `texts.jsonl`, `ids.npy` (each row's record number in the corpus), the
search structure (`faiss.index`, or an IVF index's parts) and `manifest.json` (search/index_claims.py) with each
file's SHA-256, all read back as untrusted (search/index_files.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import file_sha256
from mirrorbert.search.approximate import IVFIndex, ivf_from_parts, train_ivf
from mirrorbert.search.index_claims import FORMAT, INDEX_FILES, IVF_FILES, MANIFEST, Manifest, manifest_problem
from mirrorbert.search.index_files import (CorpusRecords, StoredTexts, damaged, open_vectors, own_npy, read_checked,
                                           read_ids_npy, read_ivf_parts, read_texts)
from mirrorbert.search.ranking import build_faiss_index, faiss_available, l2_normalize, wants_faiss

SPOT_ROWS = 8  # stored texts re-encoded to check the vectors against the loaded model
SPOT_MIN_COSINE = 0.999  # the same model and settings agree to 1e-6 on any device; other settings do not
SPOT_MAX_BYTES = 1 << 20  # a stored text longer than this is not re-encoded
MODEL_META = ("model", "pooling", "max_length")  # SearchIndex.meta entries that are manifest fields


def write_index(folder: Path, texts: Iterable[str] | None, ids: Sequence[int], manifest: Manifest, *, vectors=None,
                nprobe: int | None = None, ivf_parts=None) -> None:
    """Everything into `folder` (a temporary folder of the write policy, renamed into place by the caller), the
    manifest last with each file's SHA-256. `vectors` is saved when given, else `folder/vectors.npy` is already
    there and only memory-mapped; `texts` (None: none stored) are written one at a time, and an IVF index
    (unless its `ivf_parts` are given) is trained on a sample."""
    if vectors is not None:
        np.save(folder / "vectors.npy", np.ascontiguousarray(vectors, dtype=np.float32), allow_pickle=False)
    vectors = own_npy(folder / "vectors.npy")
    manifest.texts = texts is not None
    if texts is not None:
        with open(folder / "texts.jsonl", "w", encoding="utf-8") as fh:
            for text in texts:
                fh.write(jsonio.dumps(text, ensure_ascii=False) + "\n")
    np.save(folder / "ids.npy", np.asarray(ids, dtype=np.int64), allow_pickle=False)
    manifest.format = FORMAT
    if manifest.index_type == "ivf":  # the parts as numpy arrays, never a faiss file
        parts = ivf_parts if ivf_parts is not None else train_ivf(vectors, nprobe=nprobe)
        for name, array in zip(IVF_FILES, (parts.centroids.astype("<f4"), parts.sq_trained.astype("<f4"),
                                           parts.lists.astype("<i4"))):
            np.save(folder / name, array, allow_pickle=False)
        manifest.ivf = parts.description()
    elif faiss_available():
        import faiss

        faiss.write_index(build_faiss_index(vectors), str(folder / "faiss.index"))
        manifest.faiss = True
    del vectors
    manifest.files = {name: file_sha256(folder / name, what="--output") for name in INDEX_FILES
                      if (folder / name).is_file()}
    (folder / MANIFEST).write_text(jsonio.dumps(manifest.__dict__, indent=2) + "\n", encoding="utf-8")


def save_search_index(index, folder: str | Path, overwrite: bool = False) -> Path:
    """`SearchIndex.save`; the manifest records no corpus and no model fingerprint (an encoder in memory may have
    been trained since it was loaded)."""
    from mirrorbert.safeguards.writes import atomic_output_dir

    rows = len(index)
    if rows == 0:
        raise UserError(f"folder {folder}: the index is empty; there is nothing to save")
    ids = np.arange(rows, dtype=np.int64) if index.ids is None else np.asarray(index.ids, dtype=np.int64)
    meta = dict(index.meta or {})
    model, pooling, max_length = (meta.pop(name, None) for name in MODEL_META)
    parts = index.approximate.parts if index.approximate is not None else None
    manifest = Manifest(model=model, model_sha256=None, pooling=pooling, max_length=max_length, corpus=None,
                        corpus_sha256=None, corpus_lines=int(ids[-1]) + 1, rows=rows, dim=index.dim,
                        index_type="exact" if parts is None else "ivf", texts=index.texts is not None,
                        ivf=None if parts is None else parts.description(), meta=meta or None)
    problem = manifest_problem(dict(manifest.__dict__))
    if problem:
        raise UserError(f"folder {folder}: cannot save this index: its meta does not fit an index manifest "
                        f"({problem})")
    with atomic_output_dir(folder, overwrite=overwrite, kind="index", option="folder") as tmp:
        write_index(Path(tmp), index.texts, ids, manifest, vectors=index.vectors, ivf_parts=parts)
    return Path(folder)


def read_index(folder: Path, manifest: Manifest, use_faiss: bool | None, corpus: str | Path | None = None,
               skip_bad_lines: bool = False, option: str = "--index") -> dict[str, Any]:
    """The fields of a `SearchIndex` (`SearchIndex(**fields)`) read from the folder, every file checked against
    the manifest first; with `corpus` (matched by `check_index`) the ids and texts against its records too. The
    stored faiss index or the IVF index rebuilt from its parts is used when faiss is wanted and present."""
    confined = ConfinedFolder(folder, option, "index folder")
    _check_checksums_listed(confined, manifest)
    files = manifest.files
    vectors = open_vectors(confined, manifest.rows, manifest.dim, files["vectors.npy"])
    ids = read_ids_npy(confined, manifest.rows, manifest.corpus_lines, files["ids.npy"])
    records = CorpusRecords(corpus, manifest, ids, skip_bad_lines, confined) if corpus is not None else None
    texts = read_texts(confined, manifest, records) if manifest.texts else None
    meta = {name: getattr(manifest, name) for name in MODEL_META if getattr(manifest, name) is not None}
    stored = {"vectors": vectors, "texts": texts, "ids": ids, "meta": {**meta, **(manifest.meta or {})}}
    if manifest.index_type == "ivf":
        if wants_faiss(use_faiss):  # the IVF index rebuilt over the vectors from its checked parts
            parts = read_ivf_parts(confined, manifest.rows, manifest.dim, manifest.ivf, files)
            stored["approximate"] = IVFIndex(ivf_from_parts(vectors, parts), parts)
    elif manifest.faiss and wants_faiss(use_faiss) and confined.exists("faiss.index"):
        if "faiss.index" not in files:
            raise UserError(f"{option} {Path(folder) / MANIFEST}: damaged (no checksum for faiss.index)")
        stored["faiss_index"] = _read_faiss(confined, manifest, vectors)
    return stored


def _check_checksums_listed(folder: ConfinedFolder, manifest: Manifest) -> None:
    """Every file the index reads has its checksum in the manifest."""
    needed = ["vectors.npy", "ids.npy", *(["texts.jsonl"] if manifest.texts else []),
              *(IVF_FILES if manifest.index_type == "ivf" else ())]
    for name in needed:
        if name not in (manifest.files or {}):
            raise UserError(f"{folder.option} {folder.given / MANIFEST}: damaged (no checksum for {name})")


def _read_faiss(folder: ConfinedFolder, manifest: Manifest, vectors):
    """The stored faiss index, read after its checksum matched, holding exactly the rows of vectors.npy."""
    import faiss
    name = "faiss.index"
    raw = read_checked(folder, name, manifest.files[name], 4096 + manifest.rows * manifest.dim * 4)
    try:
        index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
    except Exception as exc:  # noqa: BLE001  faiss raises RuntimeError with a C++ trace for a damaged file
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise damaged(folder, name, f"faiss cannot read it: {reason}") from None
    if index.ntotal != manifest.rows or index.d != manifest.dim:
        raise damaged(folder, name, f"{index.ntotal} vectors of dimension {index.d}, manifest.json says "
                                    f"{manifest.rows} of {manifest.dim}")
    # faiss 1.7 reads back the generic class, later ones the concrete one; the downcast view does not own the
    # index, so `index` (which does) is what is kept and returned
    concrete = faiss.downcast_index(index)
    if not (isinstance(concrete, faiss.IndexFlat) and concrete.metric_type == faiss.METRIC_INNER_PRODUCT):
        raise damaged(folder, name, f"a {type(concrete).__name__}, expected an exact IndexFlatIP")
    if not np.array_equal(index.reconstruct_n(0, index.ntotal), vectors):  # proposes candidates: must be ours
        raise damaged(folder, name, "its vectors are not those of vectors.npy")
    return index


def check_vectors_match_model(encoder, index, folder: Path, option: str = "--index") -> None:
    """Re-encode a few stored texts (`_spot_rows`) with the loaded model as the manifest configured it; each must
    give its stored vector (cosine >= SPOT_MIN_COSINE), so the vectors are what these weights, this pooling and
    this maximum length make of these texts."""
    texts = index.texts
    rows = _spot_rows(texts) if texts is not None and len(texts) else []
    if not rows:
        return
    fresh = l2_normalize(encoder.encode([texts[r] for r in rows], normalize=True))
    stored = np.asarray(index.vectors[rows], dtype=np.float32)
    cosines = np.einsum("ij,ij->i", fresh.astype(np.float64), stored.astype(np.float64))
    bad = np.flatnonzero(~(cosines >= SPOT_MIN_COSINE))
    if bad.size:
        row = rows[int(bad[0])]
        raise UserError(f"{option} {folder}: vectors.npy row {row} is not what --model makes of its text "
                        f"(cosine {cosines[bad[0]]:.4f}) with the manifest's pooling {encoder.pooling!r} and "
                        f"max_length {encoder.max_length}: the index was built otherwise (its {MANIFEST} edited?) "
                        "or its vectors replaced; rebuild it with `mirrorbert index`")


def _spot_rows(texts) -> list[int]:
    """Up to SPOT_ROWS rows of at most SPOT_MAX_BYTES each: the longest half (where another maximum length changes
    the vectors) and the rest drawn at random anew for every check, so a tamperer cannot know which."""
    lengths = texts.lengths() if isinstance(texts, StoredTexts) else np.array([len(t) for t in texts])
    eligible = np.flatnonzero(lengths <= SPOT_MAX_BYTES)
    longest = eligible[np.argsort(-lengths[eligible], kind="stable")[:SPOT_ROWS // 2]]
    others = np.setdiff1d(eligible, longest)
    drawn = np.random.default_rng().choice(others, size=min(len(others), SPOT_ROWS - len(longest)), replace=False)
    return sorted(set(longest.tolist()) | set(drawn.tolist()))


__all__ = ["check_vectors_match_model", "read_index", "save_search_index", "write_index"]
