"""The manifest of an index folder, and the checks of what it claims before an answer comes from it.

`manifest.json` records the model's fingerprint (SHA-256 of its config, tokenizer and weight files:
search/fingerprints.py), the pooling and maximum length used, and the corpus's path, SHA-256, size and line
count, besides the folder's own shape (rows, dimension, index type) and each file's SHA-256. Answers are
refused, in one line, when the model or the corpus has changed since: hits from another model's vectors, or
ids pointing into an edited file, would be silently wrong.

Every field of a manifest is type-checked when it is read (a folder may come from someone else). An index
saved from Python (`SearchIndex.save`) has no corpus file and no model fingerprint to record (an encoder may
have been trained since it was loaded): those fields are null, and `search --index` then needs `--model` and
checks the stored vectors against it instead (`index_store.check_vectors_match_model`).
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
from mirrorbert.safeguards.readback import open_regular
from mirrorbert.search.fingerprints import corpus_sha256, corpus_size, is_corpus_folder, model_fingerprint
from mirrorbert.search.index_files import IVF_FILES
from mirrorbert.settings.choices import POOLINGS

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "mirrorbert-index/2"  # /2: ids.npy instead of ids.json, the index kind and an IVF index's parts
FORMATS_READ = ("mirrorbert-index/1", FORMAT)
INDEX_FILES = ("vectors.npy", "texts.jsonl", "ids.json", "ids.npy", "faiss.index", *IVF_FILES)
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
    faiss: bool = False
    format: str = FORMAT
    corpus_bytes: int | None = None  # size of the corpus when built: checked before hashing it
    files: dict[str, str] | None = None  # SHA-256 of each index file (None: none recorded)
    index_type: str = "exact"  # exact | ivf (search/approximate.py)
    ivf: dict | None = None  # an IVF index's nlist, nprobe, codes, metric and seed
    normalized: bool = True  # the vectors are L2-normalised (search ranks by inner product); never False
    texts: bool = True  # texts.jsonl holds each row's text (a SearchIndex saved without texts has none)
    meta: dict[str, Any] | None = None  # SearchIndex.meta entries besides model, pooling and max_length

    @property
    def ids_file(self) -> str:
        return "ids.json" if self.format == FORMATS_READ[0] else "ids.npy"

    @classmethod
    def read(cls, folder: Path, option: str = "--index") -> "Manifest":
        path = Path(folder) / MANIFEST
        if not os.path.exists(folder):
            raise UserError(f"{option} {folder}: no such folder (build one with `mirrorbert index`)")
        confined = ConfinedFolder(folder, option, "index folder")  # a file or FIFO there: refused, named
        if not confined.exists(MANIFEST):
            raise UserError(f"{option} {folder}: not a mirrorbert index (no {MANIFEST}; build one with `mirrorbert index`)")
        data = confined.read_json(MANIFEST, expect=dict, limit=MAX_MANIFEST_BYTES)
        if data.get("format") not in FORMATS_READ:
            raise UserError(f"{option} {path}: damaged (format {str(data.get('format'))[:40]!r}, expected one of "
                            f"{', '.join(map(repr, FORMATS_READ))})")
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


_OPTIONAL_STR = (str, type(None))
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
    "column": (lambda v: isinstance(v, _OPTIONAL_STR), False),
    "field": (lambda v: isinstance(v, _OPTIONAL_STR), False),
    "faiss": (lambda v: isinstance(v, bool), False),
    "corpus_bytes": (lambda v: v is None or _is_int(v, 0), False),
    "files": (lambda v: v is None or (isinstance(v, dict) and set(v) <= set(INDEX_FILES)
                                      and all(isinstance(h, str) and _HEX64.match(h) for h in v.values())), False),
    "index_type": (lambda v: v in ("exact", "ivf"), False),
    "ivf": (lambda v: v is None or _ivf_ok(v), False),
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
    kind, ivf = data.get("index_type", "exact"), data.get("ivf")
    if kind == "ivf" and (ivf is None or data["format"] != FORMAT):
        return f"index_type 'ivf' needs an 'ivf' description and format {FORMAT!r}"
    if kind == "exact" and ivf is not None:
        return "an 'ivf' description for an exact index"
    if ivf is not None and ivf["nlist"] > data["rows"]:
        return f"nlist {ivf['nlist']} is more than the {data['rows']} rows"
    return None


def check_index(folder: Path, model: str | None, corpus: str | None = None, option: str = "--index") -> Manifest:
    """The manifest, after checking that `model` (--model; None: the model the manifest names) is the model that
    built the index and the corpus file is unchanged (the one given, or the one the manifest names when it is
    still there). Before any weight loads.

    The corpus is hashed only when it is a regular file (or a dataset folder) of the size the manifest
    recorded: a manifest naming /dev/zero, a FIFO or a huge file is refused at once, not read forever."""
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
        logger.warning("%s: the corpus %s is gone; answering from the texts stored in the index", folder,
                       shown(manifest.corpus))
        return manifest
    if not os.path.lexists(path):
        raise UserError(f"--corpus {path}: no such file")
    if not is_corpus_folder(path):
        os.close(open_regular(path, what))  # a device, FIFO, folder, dangling link: one line, no read
    if manifest.corpus_bytes is not None and corpus_size(path, what) != manifest.corpus_bytes:
        raise UserError(f"{option} {folder}: the corpus {path} changed since the index was built "
                        f"({corpus_size(path, what)} bytes, {manifest.corpus_bytes} when built): rebuild it with "
                        "`mirrorbert index`")
    if corpus_sha256(path, what) != manifest.corpus_sha256:
        raise UserError(f"{option} {folder}: the corpus {path} changed since the index was built "
                        f"(SHA-256 differs; the index has {manifest.corpus_lines} lines): rebuild it with "
                        "`mirrorbert index`")
    return manifest


def _check_named_model(manifest: Manifest, folder: Path, option: str) -> None:
    """The model the manifest names, for a search without --model: a folder whose files have the recorded
    fingerprint, or a Hub id (a name no folder here has). Anything else that exists there (a file, /dev/zero,
    a FIFO) is refused unopened: the manifest names its fingerprint too, so only a folder's own files check it."""
    named, where = manifest.model, f"{option} {folder}: {MANIFEST} names the model {shown(manifest.model)}"
    if os.path.lexists(named) and not os.path.isdir(named):
        raise UserError(f"{where}, which is not a folder: give the model with --model")
    if not os.path.lexists(named) and looks_like_path(named):
        raise UserError(f"{where}, which is not here (no such folder): give the model with --model")
    if model_fingerprint(named) != manifest.model_sha256:
        raise UserError(f"{option} {folder}: the model it names ({shown(named)}) changed since the index was built "
                        "(its files' SHA-256 do not match): rebuild the index with `mirrorbert index`")


def _check_unfingerprinted(manifest: Manifest, folder: Path, model: str | None, option: str) -> None:
    """An index without its model's fingerprint (saved from Python) is searched only with --model, and only when
    its stored texts, pooling and maximum length let the stored vectors be checked against that model."""
    where = f"{option} {folder}: saved without its model's fingerprint (SearchIndex.save)"
    if model is None:
        raise UserError(f"{where}; give the model that encoded it with --model")
    missing = [name for name, absent in (("its texts", not manifest.texts), ("its pooling", manifest.pooling is None),
                                         ("its max_length", manifest.max_length is None)) if absent]
    if missing:
        raise UserError(f"{where} and without {' and '.join(missing)}, so its vectors cannot be checked against "
                        "--model: build it with `mirrorbert index`")


def check_settings(manifest: Manifest, folder: Path, pooling: str | None, max_length: int | None) -> None:
    """--pooling/--max-length given with an index must be the manifest's: its vectors were encoded so, and
    queries encoded otherwise would be ranked against them without a word."""
    for option, field, given, recorded in (("--pooling", "pooling", pooling, manifest.pooling),
                                           ("--max-length", "max_length", max_length, manifest.max_length)):
        if given is not None and given != recorded:
            raise UserError(f"{option} {given}: the index {folder} was built with {field} {recorded!r} "
                            f"({MANIFEST}); leave {option} out to search it, or rebuild it with `mirrorbert index`")


__all__ = ["FORMAT", "INDEX_FILES", "MANIFEST", "Manifest", "check_index", "check_settings", "manifest_problem"]
