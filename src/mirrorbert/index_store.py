"""A search index on disk: encode a corpus once, answer `search --index` from it afterwards.

The folder holds the L2-normalised vectors (`vectors.npy`), the texts (`texts.jsonl`), each row's id in the
corpus file (`ids.json`: the line or record number, as `search --corpus` reports it), a faiss index when faiss
is installed (`faiss.index`, an exact IndexFlatIP), and `manifest.json`: the model's fingerprint (SHA-256 of
its config, tokenizer and weight files), the pooling and maximum length used, and the corpus's path, SHA-256
and line count. Answers are refused, in one line, when the model or the corpus has changed since: hits from
another model's vectors, or ids pointing into an edited file, would be silently wrong.

Why not only `SearchIndex.save`: that keeps the vectors for Python users; this adds the identity checks a
command line needs (a folder outlives the shell session that knew which model built it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mirrorbert import jsonio
from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "mirrorbert-index/1"
# Files whose bytes decide what a model computes; the rest (README, mirrorbert.json, training logs) do not.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
IGNORED_MODEL_FILES = {"README.md", "mirrorbert.json", "manifest.json", ".mirrorbert-output"}


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes; of a folder (a saved dataset), over its files' names and checksums."""
    path = Path(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for member in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(member.relative_to(path).as_posix().encode("utf-8") + b"\0"
                          + file_sha256(member).encode("ascii") + b"\n")
        return digest.hexdigest()
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def model_fingerprint(model: str) -> str:
    """SHA-256 over the model folder's weight, config and tokenizer files (names and bytes), or `hub:<id>` for
    a hub id (its local files are not ours to hash; the id names the model)."""
    folder = Path(model)
    if not folder.is_dir():
        return f"hub:{model}"
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if path.name in IGNORED_MODEL_FILES or path.suffix not in MODEL_FILE_SUFFIXES or rel.startswith("."):
            continue
        digest.update(rel.encode("utf-8") + b"\0" + file_sha256(path).encode("ascii") + b"\n")
    return digest.hexdigest()


def count_lines(path: Path) -> int:
    """Lines as every reader counts them (LF, CRLF or CR), whatever their encoding; rows of tabular data."""
    from mirrorbert.data import split_lines
    from mirrorbert.tabular import count_rows, is_table

    if is_table(Path(path)):
        return count_rows(path)

    with open(path, "rb") as fh:
        return sum(len(split_lines(raw)) for raw in fh)


@dataclass
class Manifest:
    model: str
    model_sha256: str
    pooling: str
    max_length: int
    corpus: str
    corpus_sha256: str
    corpus_lines: int
    rows: int
    dim: int
    column: str | None = None
    field: str | None = None
    faiss: bool = False
    format: str = FORMAT

    @classmethod
    def read(cls, folder: Path, option: str = "--index") -> "Manifest":
        path = folder / MANIFEST
        if not folder.is_dir():
            raise UserError(f"{option} {folder}: no such folder (build one with `mirrorbert index`)")
        if not path.is_file():
            raise UserError(f"{option} {folder}: not a mirrorbert index (no {MANIFEST}; build one with `mirrorbert index`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise UserError(f"{option} {folder}: {MANIFEST} is damaged ({exc})") from None


def write_index(folder: Path, vectors, texts: list[str], ids: list[int], manifest: Manifest) -> None:
    """Everything into `folder` (a temporary folder of the write policy, renamed into place by the caller)."""
    import numpy as np

    from mirrorbert.search import build_faiss_index, faiss_available

    np.save(folder / "vectors.npy", vectors.astype(np.float32))
    with open(folder / "texts.jsonl", "w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(jsonio.dumps(text, ensure_ascii=False) + "\n")
    (folder / "ids.json").write_text(jsonio.dumps(ids) + "\n", encoding="utf-8")
    if faiss_available():
        import faiss

        faiss.write_index(build_faiss_index(vectors), str(folder / "faiss.index"))
        manifest.faiss = True
    (folder / MANIFEST).write_text(jsonio.dumps(manifest.__dict__, indent=2) + "\n", encoding="utf-8")


def check_index(folder: Path, model: str, corpus: str | None = None, option: str = "--index") -> Manifest:
    """The manifest, after checking that `model` is the model that built the index and the corpus file is
    unchanged (the one given, or the one the manifest names when it is still there). Before any weight loads."""
    manifest = Manifest.read(folder, option)
    if model_fingerprint(model) != manifest.model_sha256:
        raise UserError(f"{option} {folder}: built by another model ({manifest.model}); --model {model} differs "
                        "(its files' SHA-256 do not match): rebuild the index with `mirrorbert index`")
    path = Path(corpus) if corpus is not None else Path(manifest.corpus)
    if corpus is not None or path.exists():
        if not path.exists():
            raise UserError(f"--corpus {path}: no such file")
        if file_sha256(path) != manifest.corpus_sha256:
            raise UserError(f"{option} {folder}: the corpus {path} changed since the index was built "
                            f"(SHA-256 differs; the index has {manifest.corpus_lines} lines): rebuild it with "
                            "`mirrorbert index`")
    else:
        logger.warning("%s: the corpus %s is gone; answering from the texts stored in the index", folder,
                       manifest.corpus)
    return manifest


def load_index(folder: Path, manifest: Manifest, use_faiss: bool | None):
    """(SearchIndex, ids) from the folder; the stored faiss index is used when faiss is wanted and present."""
    import numpy as np

    from mirrorbert.search import SearchIndex, wants_faiss

    try:
        vectors = np.load(folder / "vectors.npy")
        with open(folder / "texts.jsonl", encoding="utf-8") as fh:
            texts = [json.loads(line) for line in fh]
        ids = json.loads((folder / "ids.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--index {folder}: damaged ({exc}); rebuild it with `mirrorbert index`") from None
    if not (len(vectors) == len(texts) == len(ids) == manifest.rows) or vectors.shape[1] != manifest.dim:
        raise UserError(f"--index {folder}: damaged (rows and manifest disagree); rebuild it with `mirrorbert index`")
    index = SearchIndex(vectors, texts, meta={"model": manifest.model, "pooling": manifest.pooling})
    faiss_file = folder / "faiss.index"
    if wants_faiss(use_faiss) and faiss_file.is_file():
        import faiss

        index.faiss_index = faiss.read_index(os.fspath(faiss_file))
    return index, ids


__all__ = ["Manifest", "check_index", "file_sha256", "load_index", "model_fingerprint", "write_index"]
