"""The manifest of an index folder, every field type-checked when read, and the checks of what it claims before an
answer comes from it: the corpus's hash and line count against the corpus, the model's fingerprint against its
files (an index saved from Python has none: `search --index` then needs `--model`, and checks the stored vectors
by re-encoding, `index_store.check_vectors_match_model`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirrorbert.data.readers import UNSAFE_CHARS, shown
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.preflight import looks_like_path
from mirrorbert.search.fingerprints import corpus_digest, corpus_size, model_fingerprint
from mirrorbert.settings.choices import POOLINGS

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "mirrorbert-index/2"
IVF_FILES = ("ivf_centroids.npy", "ivf_sq.npy", "ivf_lists.npy")
INDEX_FILES = ("vectors.npy", "texts.jsonl", "ids.npy", "faiss.index", *IVF_FILES)
IVF_KEYS = {"nlist", "nprobe", "codes", "metric", "seed"}
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; a bigger one is not ours
MAX_META_ENTRIES = 64  # SearchIndex.meta entries kept in a manifest
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Manifest:
    model: str | None  # as given to `mirrorbert index` (a folder by its absolute path); None: not recorded
    model_sha256: str | None  # search/fingerprints.py; None: saved from Python, checked by re-encoding instead
    pooling: str | None
    max_length: int | None
    corpus: str | None  # the corpus file; None: saved from Python from a list of strings
    corpus_sha256: str | None
    corpus_lines: int
    rows: int
    dim: int
    column: str | None = None
    field: str | None = None
    header: bool = True  # a .csv/.tsv corpus's first line is its header (False: `index --no-header`)
    faiss: bool = False
    format: str = FORMAT
    corpus_bytes: int | None = None  # size of the corpus when built: checked before hashing it
    files: dict[str, str] | None = None  # SHA-256 of each index file (None only while it is being written)
    index_type: str = "exact"  # exact | ivf (search/approximate.py)
    ivf: dict | None = None  # an IVF index's nlist, nprobe, codes, metric and seed
    normalized: bool = True  # the vectors are L2-normalised (search ranks by inner product); never False
    texts: bool = True  # texts.jsonl holds each row's text (a SearchIndex saved without texts has none)
    meta: dict[str, Any] | None = None  # SearchIndex.meta entries besides model, pooling and max_length

    @classmethod
    def read(cls, folder: Path, option: str = "--index") -> "Manifest":
        path = Path(folder) / MANIFEST
        if not os.path.exists(folder):
            raise UserError(f"{option} {folder}: no such folder (build one with `mirrorbert index`)")
        confined = ConfinedFolder(folder, option, "index folder")  # a file or FIFO there: refused, named
        if not confined.exists(MANIFEST):
            raise UserError(f"{option} {folder}: not a mirrorbert index (no {MANIFEST}; build one with `mirrorbert index`)")
        data = confined.read_json(MANIFEST, expect=dict, limit=MAX_MANIFEST_BYTES)
        if data.get("format") != FORMAT:
            raise UserError(f"{option} {path}: damaged (format {str(data.get('format'))[:40]!r}, expected "
                            f"{FORMAT!r})")
        problem = manifest_problem(data)
        if problem:
            raise UserError(f"{option} {path}: damaged ({problem}); rebuild the index with `mirrorbert index`")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _plain_str(value: Any) -> bool:
    """A non-empty string a message may print: no control character (a terminal would act on it) and no NUL."""
    return isinstance(value, str) and bool(value) and not UNSAFE_CHARS.search(value)


def _ivf_ok(value: Any) -> bool:
    """An IVF description: exactly IVF_KEYS; 1 <= nprobe <= nlist; 8-bit codes on inner product."""
    return (isinstance(value, dict) and set(value) == IVF_KEYS and _is_int(value["nlist"], 1)
            and _is_int(value["nprobe"], 1) and value["nprobe"] <= value["nlist"] and _is_int(value["seed"])
            and value["codes"] == "sq8" and value["metric"] == "inner_product")


def _meta_ok(value: Any) -> bool:
    """Flat: at most MAX_META_ENTRIES plain-string keys, each a string, whole number, finite number, bool or null."""
    return value is None or (
        isinstance(value, dict) and len(value) <= MAX_META_ENTRIES and all(_plain_str(k) for k in value)
        and all(v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))
                for v in value.values()))


def _or_none(check):
    return lambda v: v is None or check(v)


_FIELDS: dict[str, tuple[Any, bool]] = {  # name: (check, required)
    "model": (_or_none(_plain_str), True),
    "model_sha256": (_or_none(lambda v: isinstance(v, str) and bool(v)), True),
    "pooling": (_or_none(lambda v: v in POOLINGS), True),
    "max_length": (_or_none(lambda v: _is_int(v, 1)), True),
    "corpus": (_or_none(_plain_str), True),
    "corpus_sha256": (_or_none(lambda v: isinstance(v, str) and bool(_HEX64.match(v))), True),
    "corpus_lines": (lambda v: _is_int(v, 1), True),
    "rows": (lambda v: _is_int(v, 1), True),
    "dim": (lambda v: _is_int(v, 1) and v <= 1 << 16, True),
    "column": (_or_none(lambda v: isinstance(v, str)), False),
    "field": (_or_none(lambda v: isinstance(v, str)), False),
    "header": (lambda v: isinstance(v, bool), False),
    "faiss": (lambda v: isinstance(v, bool), False),
    "corpus_bytes": (_or_none(_is_int), False),
    "files": (lambda v: v is None or (isinstance(v, dict) and set(v) <= set(INDEX_FILES)
                                      and all(isinstance(h, str) and _HEX64.match(h) for h in v.values())), False),
    "index_type": (lambda v: v in ("exact", "ivf"), False),
    "ivf": (_or_none(_ivf_ok), False),
    "normalized": (lambda v: v is True, False),
    "texts": (lambda v: isinstance(v, bool), False),
    "meta": (_meta_ok, False),
}


def manifest_problem(data: dict) -> str | None:
    """The first field of a manifest that is missing or of the wrong type or range, as a phrase."""
    for name, (check, required) in _FIELDS.items():
        if name not in data:
            if required:
                return f"no field {name!r}"
            continue
        if not check(data[name]):
            return f"field {name!r} has a wrong type or value ({str(data[name])[:40]!r})"
    if data["rows"] > data["corpus_lines"]:
        return f"{data['rows']} rows but the corpus has {data['corpus_lines']} lines"
    if (data["corpus"] is None) != (data["corpus_sha256"] is None):
        return "a corpus without its SHA-256, or a SHA-256 without its corpus"
    if data["model_sha256"] is not None and None in (data["model"], data["pooling"], data["max_length"]):
        return "a model fingerprint without the model's name, pooling or max_length"
    if data.get("texts") is False and (data["model_sha256"], data["corpus"]) != (None, None):
        return ("'texts' false, but `mirrorbert index` (a model fingerprint, a corpus) always stores the texts its "
                "vectors are checked against")
    kind, ivf = data.get("index_type", "exact"), data.get("ivf")
    if kind == "ivf" and ivf is None:
        return "index_type 'ivf' needs an 'ivf' description"
    if kind == "exact" and ivf is not None:
        return "an 'ivf' description for an exact index"
    if ivf is not None and ivf["nlist"] > data["rows"]:
        return f"nlist {ivf['nlist']} is more than the {data['rows']} rows"
    return None


def check_index(folder: Path, model: str | None, corpus: str | None = None, option: str = "--index") -> Manifest:
    """The manifest, once `model` (--model; None: the one the manifest names) is the model that built the index
    and the corpus (the one given, or the one named while it is there) is unchanged; before any weight loads.
    The corpus is hashed only when it is a regular file or dataset folder of the recorded size, and its lines,
    counted in the same pass, must be the manifest's `corpus_lines`."""
    manifest = Manifest.read(folder, option)
    if manifest.model_sha256 is None:
        _check_unfingerprinted(manifest, folder, model, option)
    elif model is None:
        _check_named_model(manifest, folder, option)
    elif model_fingerprint(model) != manifest.model_sha256:
        raise UserError(f"{option} {folder}: built by another model ({shown(manifest.model)}); --model {model} "
                        "differs (its files' SHA-256 do not match): rebuild the index with `mirrorbert index`")
    if manifest.corpus is None:
        if corpus is not None:
            raise UserError(f"--corpus {corpus}: the index {folder} was saved from a list of strings "
                            "(SearchIndex.save), not built from a corpus file: leave --corpus out (its hits are "
                            "its stored texts)")
        return manifest
    path = Path(corpus) if corpus is not None else Path(manifest.corpus)
    what = "--corpus" if corpus is not None else f"{option} {folder}: {MANIFEST} names the corpus"
    if corpus is None and not os.path.lexists(path):
        logger.warning("%s: the corpus %s is gone; answering from the texts stored in the index (their line ids "
                       "can no longer be checked against it)", folder, shown(manifest.corpus))
        return manifest
    if not os.path.lexists(path):
        raise UserError(f"--corpus {path}: no such file")
    if manifest.corpus_bytes is not None and corpus_size(path, what) != manifest.corpus_bytes:
        raise _not_the_corpus(manifest, folder, option, path, corpus is not None,
                              f"{corpus_size(path, what)} bytes, {manifest.corpus_bytes} when built")
    sha256, lines = corpus_digest(path, what)
    if sha256 != manifest.corpus_sha256:
        raise _not_the_corpus(manifest, folder, option, path, corpus is not None,
                              f"SHA-256 differs; the index has {manifest.corpus_lines} lines")
    if lines != manifest.corpus_lines:  # its ids are bounded by this count: it must be the corpus's own
        raise UserError(f"{option} {folder / MANIFEST}: damaged (corpus_lines {manifest.corpus_lines}, but the corpus "
                        f"{path} has {lines}); rebuild the index with `mirrorbert index`")
    return manifest


def _not_the_corpus(manifest: Manifest, folder: Path, option: str, path: Path, given: bool, detail: str) -> UserError:
    """A corpus that is not the index's: another file than the one it was built from, or that file changed."""
    if given and path.resolve() != Path(manifest.corpus):
        return UserError(f"--corpus {path}: not the corpus {option} {folder} was built from, which is "
                         f"{shown(manifest.corpus)} ({detail}): give that file, or index this one with "
                         "`mirrorbert index`")
    return UserError(f"{option} {folder}: the corpus {path} changed since the index was built ({detail}): rebuild "
                     "it with `mirrorbert index`")


def _check_named_model(manifest: Manifest, folder: Path, option: str) -> None:
    """The model the manifest names, for a search without --model: a folder whose files have the recorded
    fingerprint, or a Hub id; anything else there (a file, /dev/zero, a FIFO) is refused unopened."""
    named, where = manifest.model, f"{option} {folder}: {MANIFEST} names the model {shown(manifest.model)}"
    if os.path.lexists(named) and not os.path.isdir(named):
        raise UserError(f"{where}, which is not a folder: give the model with --model")
    if not os.path.lexists(named) and looks_like_path(named):
        raise UserError(f"{where}, which is not here (no such folder): give the model with --model")
    if model_fingerprint(named) != manifest.model_sha256:
        raise UserError(f"{option} {folder}: the model it names ({shown(named)}) changed since the index was built "
                        "(its files' SHA-256 do not match): rebuild the index with `mirrorbert index`")


def _check_unfingerprinted(manifest: Manifest, folder: Path, model: str | None, option: str) -> None:
    """An index without its model's fingerprint is searched only with --model, and only when its texts, pooling
    and maximum length let its vectors be checked against that model."""
    where = f"{option} {folder}: saved without its model's fingerprint (SearchIndex.save)"
    if model is None:
        raise UserError(f"{where}; give the model that encoded it with --model")
    missing = [name for name, absent in (("its texts", not manifest.texts), ("its pooling", manifest.pooling is None),
                                         ("its max_length", manifest.max_length is None)) if absent]
    if missing:
        raise UserError(f"{where} and without {' and '.join(missing)}, so its vectors cannot be checked against "
                        "--model: build it with `mirrorbert index`")


def check_settings(manifest: Manifest, folder: Path, pooling: str | None, max_length: int | None) -> None:
    """--pooling/--max-length given with an index must be the manifest's (its vectors were encoded so)."""
    for option, field, given, recorded in (("--pooling", "pooling", pooling, manifest.pooling),
                                           ("--max-length", "max_length", max_length, manifest.max_length)):
        if given is not None and given != recorded:
            raise UserError(f"{option} {given}: the index {folder} was built with {field} {recorded!r} "
                            f"({MANIFEST}); leave {option} out to search it, or rebuild it with `mirrorbert index`")


__all__ = ["FORMAT", "INDEX_FILES", "MANIFEST", "Manifest", "check_index", "check_settings", "manifest_problem"]
