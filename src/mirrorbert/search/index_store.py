"""A search index on disk, the one folder format `mirrorbert index` and `SearchIndex.save` write and
`search --index` and `SearchIndex.load` read: encode a corpus once, answer searches from it afterwards.

The folder holds the L2-normalised vectors (`vectors.npy`), the texts (`texts.jsonl`), each row's id in the
corpus file (`ids.npy`: the line or record number, as `search --corpus` reports it; row numbers for an index
saved from Python), the search structure (`faiss.index`, an exact IndexFlatIP, when faiss is installed; or an
IVF index's parts, search/approximate.py) and `manifest.json` (search/index_claims.py): what the index was
built from and the SHA-256 of each file.

Read back as untrusted (a folder may come from someone else): every file of the folder is read through
`safeguards.confined.ConfinedFolder` (inside the folder, a regular file, of bounded size: a link leading out
or a FIFO is refused before any read); each file's SHA-256 recorded in the manifest is matched before the
file is parsed; the .npy headers are read without pickles and their dtype and shape must be the manifest's,
the vectors finite and of unit length (search/index_files.py); the texts and ids are checked line by line
(search/index_texts.py); `faiss.index` must hold exactly the vectors of `vectors.npy`. Any mismatch is one
`UserError` naming the file. A manifest without checksums (`files` null) has its files checked for
structure only, with a warning.

Checked against what it claims: a manifest is the folder's own word, and a rehashed folder agrees with it.
So `search --index` matches the model and corpus against the manifest (`index_claims.check_index`) and then
re-encodes a few stored texts with the loaded model (`check_vectors_match_model`): a manifest edited to
another pooling no longer matches its vectors. `SearchIndex.load` reads the files with every check above but
leaves the model to its caller, who holds it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import file_sha256
from mirrorbert.search.faiss_backend import build_faiss_index, faiss_available, wants_faiss
from mirrorbert.search.index_claims import FORMAT, INDEX_FILES, MANIFEST, Manifest, manifest_problem
from mirrorbert.search.index_files import IVF_FILES, damaged, open_vectors, read_checked, read_ids_npy, read_ivf_parts
from mirrorbert.search.index_texts import CorpusRecords, StoredTexts, read_ids_json, read_texts
from mirrorbert.search.ranking import l2_normalize

logger = logging.getLogger(__name__)

SPOT_ROWS = 8  # stored texts re-encoded to check the vectors against the loaded model
SPOT_MIN_COSINE = 0.999  # the same model and settings agree to 1e-6 on any device; other settings do not
SPOT_MAX_BYTES = 1 << 20  # a stored text longer than this is not re-encoded (tokenising it all takes seconds)
MODEL_META = ("model", "pooling", "max_length")  # SearchIndex.meta entries that are manifest fields
FIRST_FORMAT_META = "index.json"  # the marker file of the first SearchIndex.save format (no manifest)


@dataclass
class StoredIndex:
    """What an index folder holds, read and checked: a `SearchIndex`'s parts (`SearchIndex.from_stored`) and
    each row's id in the corpus it was built from."""

    vectors: Any  # float32 [rows, dim], memory-mapped
    texts: Sequence[str] | None
    ids: Any  # int64 [rows] (a list for format /1)
    meta: dict[str, Any] = field(default_factory=dict)
    faiss_index: Any = None
    approximate: Any = None  # an approximate.IVFIndex


# ----------------------------------------------------------------------------- writing
def write_index(folder: Path, texts: Iterable[str] | None, ids: Sequence[int], manifest: Manifest, vectors=None,
                nprobe: int | None = None, ivf_parts=None) -> None:
    """Everything into `folder` (a temporary folder of the write policy, renamed into place by the caller);
    the manifest records each file's SHA-256, checked before the file is read back.

    `vectors` is saved when given; without it `folder/vectors.npy` is already there (encoded straight to disk,
    encoder/streaming.py) and is only memory-mapped: texts are written one at a time (`None`: an index without
    texts), ids as one int64 array, and the IVF index (unless its `ivf_parts` are given) trains on a sample and
    assigns rows a chunk at a time, so nothing here holds all the vectors in memory (an exact index's
    faiss.index does: exact is for corpora below the auto threshold)."""
    import numpy as np

    if vectors is not None:
        np.save(folder / "vectors.npy", np.ascontiguousarray(vectors, dtype=np.float32), allow_pickle=False)
    vectors = np.lib.format.open_memmap(folder / "vectors.npy", mode="r")  # ours, just written
    manifest.texts = texts is not None
    if texts is not None:
        with open(folder / "texts.jsonl", "w", encoding="utf-8") as fh:
            for text in texts:
                fh.write(jsonio.dumps(text, ensure_ascii=False) + "\n")
    np.save(folder / "ids.npy", np.asarray(ids, dtype=np.int64), allow_pickle=False)
    manifest.format = FORMAT
    if manifest.index_type == "ivf":
        from mirrorbert.search.approximate import train_ivf

        _write_ivf(folder, ivf_parts if ivf_parts is not None else train_ivf(vectors, nprobe=nprobe), manifest)
    elif faiss_available():
        import faiss

        faiss.write_index(build_faiss_index(vectors), str(folder / "faiss.index"))
        manifest.faiss = True
    del vectors
    manifest.files = {name: file_sha256(folder / name, what="--output") for name in INDEX_FILES
                      if (folder / name).is_file()}
    (folder / MANIFEST).write_text(jsonio.dumps(manifest.__dict__, indent=2) + "\n", encoding="utf-8")


def _write_ivf(folder: Path, parts, manifest: Manifest) -> None:
    """The IVF parts (centroids, quantiser ranges, list numbers) as .npy files; the faiss index itself is
    rebuilt from them at load (search/approximate.py says why no faiss file is stored)."""
    import numpy as np

    np.save(folder / IVF_FILES[0], parts.centroids.astype("<f4"), allow_pickle=False)
    np.save(folder / IVF_FILES[1], parts.sq_trained.astype("<f4"), allow_pickle=False)
    np.save(folder / IVF_FILES[2], parts.lists.astype("<i4"), allow_pickle=False)
    manifest.ivf = _ivf_description(parts)


def _ivf_description(parts) -> dict[str, Any]:
    """The manifest's `ivf` field for these parts."""
    from mirrorbert.search.approximate import CODES

    return {"nlist": parts.nlist, "nprobe": parts.nprobe, "codes": CODES, "metric": "inner_product",
            "seed": parts.seed}


def save_search_index(index, folder: str | Path, overwrite: bool = False) -> Path:
    """`SearchIndex.save`: `index` (vectors, texts, meta, an approximate index) into the new folder `folder`, in
    the format `mirrorbert index` writes, atomically through the write policy (safeguards/writes). Its rows are
    their own ids; the manifest records the model, pooling and maximum length `meta` names, no corpus file and
    no model fingerprint (an encoder in memory may have been trained since it was loaded: `search --index`
    checks such an index by re-encoding its texts with `--model`)."""
    import numpy as np

    from mirrorbert.safeguards.writes import atomic_output_dir

    rows = len(index)
    if rows == 0:
        raise UserError(f"folder {folder}: the index is empty; there is nothing to save")
    meta = dict(index.meta or {})
    model, pooling, max_length = (meta.pop(name, None) for name in MODEL_META)
    parts = index.approximate.parts if index.approximate is not None else None
    manifest = Manifest(model=model, model_sha256=None, pooling=pooling, max_length=max_length, corpus=None,
                        corpus_sha256=None, corpus_lines=rows, rows=rows, dim=index.dim,
                        index_type="exact" if parts is None else "ivf", texts=index.texts is not None,
                        ivf=None if parts is None else _ivf_description(parts), meta=meta or None)
    problem = manifest_problem(dict(manifest.__dict__))
    if problem:
        raise UserError(f"folder {folder}: cannot save this index: its meta does not fit an index manifest "
                        f"({problem})")
    with atomic_output_dir(folder, overwrite=overwrite, kind="index", option="folder") as tmp:
        write_index(Path(tmp), index.texts, np.arange(rows, dtype=np.int64), manifest, vectors=index.vectors,
                    ivf_parts=parts)
    return Path(folder)


# ----------------------------------------------------------------------------- reading
def read_index(folder: Path, manifest: Manifest, use_faiss: bool | None, corpus: str | Path | None = None,
               skip_bad_lines: bool = False, option: str = "--index") -> StoredIndex:
    """The folder's parts, every file read through the confined reader and checked against the manifest first;
    the vectors memory-mapped. With `corpus` (matched against the manifest by `check_index`) the ids and texts
    are checked against its records too. The stored faiss index (exact) or the IVF index rebuilt from its parts
    (ivf) is used when faiss is wanted and present; without it (or with `use_faiss=False`) search is an exact
    scan."""
    confined = ConfinedFolder(folder, option, "index folder")
    _check_checksums_listed(confined, manifest)
    files = manifest.files or {}
    vectors = open_vectors(confined, manifest.rows, manifest.dim, files.get("vectors.npy"))
    if manifest.ids_file == "ids.json":
        ids = read_ids_json(confined, manifest)
    else:
        ids = read_ids_npy(confined, manifest.rows, manifest.corpus_lines, files.get("ids.npy"))
    records = CorpusRecords(corpus, manifest, ids, skip_bad_lines, confined) if corpus is not None else None
    texts = read_texts(confined, manifest, records) if manifest.texts else None
    meta = {name: getattr(manifest, name) for name in MODEL_META if getattr(manifest, name) is not None}
    stored = StoredIndex(vectors, texts, ids, {**meta, **(manifest.meta or {})})
    if manifest.index_type == "ivf":
        if wants_faiss(use_faiss):
            stored.approximate = _read_ivf(confined, manifest, vectors)
    elif manifest.faiss and wants_faiss(use_faiss) and confined.exists("faiss.index"):
        if manifest.files is not None and "faiss.index" not in manifest.files:
            raise UserError(f"{option} {Path(folder) / MANIFEST}: damaged (no checksum for faiss.index)")
        stored.faiss_index = _read_faiss(confined, manifest, vectors)
    return stored


def _check_checksums_listed(folder: ConfinedFolder, manifest: Manifest) -> None:
    """Every file the index reads has its checksum in the manifest (a manifest without any: a warning)."""
    if manifest.files is None:
        logger.warning("%s: an index without checksums in its manifest; its files are checked for structure only "
                       "(rebuild it with `mirrorbert index` to have them checked fully)", folder.given)
        return
    needed = ["vectors.npy", manifest.ids_file, *(["texts.jsonl"] if manifest.texts else []),
              *(IVF_FILES if manifest.index_type == "ivf" else ())]
    for name in needed:
        if name not in manifest.files:
            raise UserError(f"{folder.option} {folder.given / MANIFEST}: damaged (no checksum for {name})")


def _read_faiss(folder: ConfinedFolder, manifest: Manifest, vectors):
    """The stored faiss index, read after its checksum matched, holding exactly the rows of vectors.npy."""
    import faiss
    import numpy as np

    name = "faiss.index"
    raw = read_checked(folder, name, (manifest.files or {}).get(name), 4096 + manifest.rows * manifest.dim * 4)
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


def _read_ivf(folder: ConfinedFolder, manifest: Manifest, vectors):
    """The IVF index: its parts checked (index_files.read_ivf_parts), then rebuilt over the vectors."""
    from mirrorbert.search.approximate import IVFIndex, ivf_from_parts

    parts = read_ivf_parts(folder, manifest.rows, manifest.dim, manifest.ivf, manifest.files)
    return IVFIndex(ivf_from_parts(vectors, parts), parts)


def read_saved_index(folder: str | Path, use_faiss: bool | None = None) -> StoredIndex:
    """`SearchIndex.load`: an index folder (`SearchIndex.save`, `mirrorbert index`), every file read and checked
    as `search --index` reads it, or a folder of the first `SearchIndex.save` format (`read_first_format`)."""
    confined = ConfinedFolder(folder, "folder", "index folder")
    if confined.exists(MANIFEST):
        return read_index(Path(folder), Manifest.read(Path(folder), "folder"), use_faiss, option="folder")
    if confined.exists(FIRST_FORMAT_META) and confined.exists("vectors.npy"):
        return read_first_format(confined, use_faiss)
    raise UserError(f"folder {folder}: not a search index (no {MANIFEST}; write one with SearchIndex.save or "
                    "`mirrorbert index`)")


def read_first_format(confined: ConfinedFolder, use_faiss: bool | None) -> StoredIndex:
    """A folder of the first `SearchIndex.save` format (`index.json`, `vectors.npy`, `texts.jsonl`; no manifest,
    no checksums), read whole through the confined reader: index.json bounded and shallow, the vectors without
    pickles and finite, each text a JSON string. The vectors are L2-normalised again here (nothing recorded
    their lengths: a row made longer would win every query). Saving the index again writes the folder format."""
    import numpy as np

    logger.warning("%s: a search index of the first SearchIndex.save format (index.json, no checksums); save it "
                   "again to write the index folder format", confined.given)
    meta = confined.read_json(FIRST_FORMAT_META, expect=dict, limit=1 << 20)
    texts = _first_format_texts(confined) if confined.exists("texts.jsonl") else None
    fd = confined.open("vectors.npy")  # refused in its own words, outside the `except ValueError` below
    try:
        with os.fdopen(fd, "rb") as fh:  # the .npy reader alone: no pickle, no .npz
            vectors = np.lib.format.read_array(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise damaged(confined, "vectors.npy", str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__)
    if vectors.ndim != 2 or vectors.dtype.kind not in "fiu" or vectors.dtype == np.bool_ or not vectors.shape[1]:
        raise damaged(confined, "vectors.npy", f"expected a matrix of numbers, found {vectors.dtype} {vectors.shape}")
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise damaged(confined, "vectors.npy", f"row {int(np.flatnonzero(~finite)[0])} is not finite (NaN or infinity)")
    if texts is not None and len(texts) != len(vectors):
        raise damaged(confined, "texts.jsonl", f"{len(texts)} texts for {len(vectors)} vectors")
    vectors = l2_normalize(vectors)
    kept = {k: v for k, v in meta.items() if k not in ("format_version", "size", "dim", "normalized")}
    return StoredIndex(vectors, texts, np.arange(len(vectors), dtype=np.int64), kept,
                       faiss_index=build_faiss_index(vectors) if len(vectors) and wants_faiss(use_faiss) else None)


def _first_format_texts(confined: ConfinedFolder) -> list[str]:
    """texts.jsonl of the first format: one JSON string a line, read whole."""
    import json

    texts = []
    lines = confined.read_bytes("texts.jsonl", 1 << 34).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for lineno, line in enumerate(lines, 1):
        try:
            text = json.loads(line.decode("utf-8")) if line.startswith(b'"') else None
        except ValueError:  # UnicodeDecodeError and JSONDecodeError
            text = None
        if not isinstance(text, str):
            raise damaged(confined, f"texts.jsonl:{lineno}", "expected a JSON string")
        texts.append(text)
    return texts


# ----------------------------------------------------------------------------- the vectors against the model
def check_vectors_match_model(encoder, index, folder: Path, option: str = "--index") -> None:
    """Re-encode a few stored texts (the longest, where max_length bites, and some spread over the index) with
    the loaded model as the manifest configured it; each must give its stored vector (cosine >= SPOT_MIN_COSINE).
    The model's fingerprint says the weights are the same; this says the vectors are what these weights, this
    pooling and this maximum length make of these texts, which no manifest field alone can."""
    import numpy as np

    texts = index.texts
    if texts is None or not len(texts):
        return
    rows = _spot_rows(texts)
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
    """Up to SPOT_ROWS rows of at most SPOT_MAX_BYTES each: the longest half (by stored length) and the rest
    spread evenly over the index."""
    import numpy as np

    lengths = texts.lengths() if isinstance(texts, StoredTexts) else np.array([len(t) for t in texts])
    eligible = np.flatnonzero(lengths <= SPOT_MAX_BYTES)
    longest = eligible[np.argsort(-lengths[eligible], kind="stable")[:SPOT_ROWS // 2]]
    picks = np.linspace(0, len(eligible) - 1, num=min(len(eligible), SPOT_ROWS - len(longest))).astype(int)
    return sorted(set(longest.tolist()) | set(eligible[picks].tolist()))


__all__ = ["StoredIndex", "check_vectors_match_model", "read_first_format", "read_index", "read_saved_index",
           "save_search_index", "write_index"]
