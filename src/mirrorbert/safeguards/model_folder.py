"""A model folder checked through the confined reader before any library opens a file of it.

transformers, tokenizers and sentence-transformers open a folder's files themselves (config.json,
tokenizer.json, vocab/merges, modules.json and each module's folder, the weights). Before any of them is
handed a local folder, `vet_model_folder` has passed every file they may open through
`mirrorbert.safeguards.confined.ConfinedFolder`: each top-level entry is a regular file or a folder inside
the folder (a FIFO, device, socket or link leading out is refused), every JSON file is UTF-8 and shallow,
text files are UTF-8, all of bounded size; each module folder named in modules.json lies inside the folder,
names a sentence-transformers module class, and is checked the same way. So a hostile folder is one line
naming the file, never a hang, a traceback from a parser, or a read of a file elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import struct
from pathlib import Path
from typing import Any, BinaryIO

from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import JSON_LIMIT, TEXT_LIMIT, ConfinedFolder, describe_kind
from mirrorbert.safeguards.readback import json_depth_ok

logger = logging.getLogger(__name__)

# Text files a tokenizer reads as UTF-8 (a bad byte would be a parser's traceback).
TEXT_FILES = ("vocab.txt", "merges.txt")
# Binary files of bounded size (sentencepiece models).
BOUNDED_SUFFIXES = (".model",)
# Files of a model folder in which transformers looks for classes to import from the folder's own .py files.
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")
# Module packages of sentence-transformers whose classes modules.json may name (with at most one submodule
# below them: `sentence_transformers.base.modules.transformer.Transformer`, as 6.x writes); anything else,
# even a function elsewhere in sentence-transformers (`sentence_transformers.util.misc.import_from_string`), is
# code a folder must not get imported.
SENTENCE_TRANSFORMERS_MODULES = (
    "sentence_transformers.models", "sentence_transformers.base.modules",
    "sentence_transformers.sentence_transformer.modules", "sentence_transformers.sparse_encoder.models",
    "sentence_transformers.sparse_encoder.modules", "sentence_transformers.cross_encoder.modules",
    "sentence_transformers.multi_vector_encoder.modules",
)
_SUBMODULE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]{0,63}$")
TRUST_OPTION = "--trust-remote-code"
# Pooling modes of sentence-transformers' Pooling module.
POOLING_MODES = ("cls", "lasttoken", "max", "mean", "mean_sqrt_len_tokens", "weightedmean")
SAFETENSORS_HEADER_LIMIT = 100 << 20  # safetensors itself refuses headers over 100 MB


def summary(auto_map: Any) -> str:
    """An auto_map as one short line, for a refusal."""
    import mirrorbert.jsonio as jsonio

    text = jsonio.dumps(auto_map, ensure_ascii=True, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


def is_local_folder(name: Any) -> bool:
    try:
        return isinstance(name, (str, os.PathLike)) and Path(name).is_dir()
    except (OSError, ValueError):
        return False


def module_type_allowed(kind: Any) -> bool:
    """`sentence_transformers.models.Pooling` and the like: a class of sentence-transformers' module packages."""
    if not isinstance(kind, str):
        return False
    package, _, name = kind.rpartition(".")
    parent, _, submodule = package.rpartition(".")
    inside = package in SENTENCE_TRANSFORMERS_MODULES or (
        parent in SENTENCE_TRANSFORMERS_MODULES and bool(_SUBMODULE.match(submodule)))
    return inside and bool(_CLASS_NAME.match(name))


class ModelFolder:
    """The checked files of a local model folder: what a loader may read, and what they say."""

    def __init__(self, folder: ConfinedFolder):
        self.folder = folder
        self.json: dict[str, Any] = {}  # relative name -> parsed value, of every JSON file checked
        self.modules: list[dict[str, Any]] = []  # modules.json entries, paths checked

    def get(self, name: str, default: Any = None) -> Any:
        return self.json.get(name, default)


def safetensors_table(fh: BinaryIO) -> tuple[dict[str, Any], int]:
    """(the tensor table: name -> dtype, shape, offsets; the bytes the file must hold for it) of an open
    safetensors file, read from its header only; a ValueError (or the parser's KeyError, TypeError, ...:
    `SAFETENSORS_DAMAGE`) says what is wrong. A file shorter than its table needs is truncated."""
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(8)
    if len(head) < 8:
        raise ValueError("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > min(size - 8, SAFETENSORS_HEADER_LIMIT):
        raise ValueError("header longer than the file or 100 MB")
    raw = fh.read(n)
    if not json_depth_ok(raw):
        raise ValueError("header nested too deep")
    header = json.loads(raw.decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a table of tensors")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    for v in tensors.values():
        [int(d) for d in v["shape"]]
    return tensors, 8 + n + end


# What `safetensors_table` raises for a damaged header.
SAFETENSORS_DAMAGE = (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, RecursionError)


def _check_safetensors(folder: ConfinedFolder, name: str) -> None:
    """The header of a weight file parses (truncation is the preflight's to word, with the sizes)."""
    with os.fdopen(folder.open(name), "rb") as fh:
        try:
            safetensors_table(fh)
        except SAFETENSORS_DAMAGE as exc:
            reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise folder.refuse(name, f"damaged (not a valid safetensors file: {reason})") from None


def _check_file(model: ModelFolder, rel: str) -> None:
    folder = model.folder
    base = rel.rsplit("/", 1)[-1]
    if base.endswith(".json"):
        model.json[rel] = folder.read_json(rel, expect=None, limit=JSON_LIMIT)
    elif base in TEXT_FILES:
        folder.read_text(rel, limit=TEXT_LIMIT)
    elif base.endswith(BOUNDED_SUFFIXES):
        folder.check_file(rel, limit=TEXT_LIMIT)
    elif base.endswith(".safetensors"):
        _check_safetensors(folder, rel)
    else:
        folder.check_file(rel)


def _check_entries(model: ModelFolder, sub: str) -> list[str]:
    """Every entry of one folder level (the folder, or a module folder): files checked, folders returned."""
    folder = model.folder
    folders = []
    for name, st in folder.entries(sub):
        rel = name if sub == "." else f"{sub}/{name}"
        if name.startswith(".") and not stat.S_ISLNK(st.st_mode):
            continue  # bookkeeping of mirrorbert's or of git; no loader opens it
        if stat.S_ISLNK(st.st_mode):
            real = folder.resolve(rel)  # a link must stay inside
            try:
                st = os.stat(real)
            except FileNotFoundError:
                raise folder.refuse(rel, "a symlink to nothing") from None
        if stat.S_ISDIR(st.st_mode):
            folders.append(rel)
        elif stat.S_ISREG(st.st_mode):
            _check_file(model, rel)
        else:
            raise folder.refuse(rel, f"is {describe_kind(st.st_mode)}, expected a regular file")
    return folders


def _check_remote_code(model: ModelFolder, sub: str, trust_remote_code: bool) -> None:
    for name in REMOTE_CODE_FILES:
        rel = name if sub == "." else f"{sub}/{name}"
        data = model.json.get(rel)
        if isinstance(data, dict) and data.get("auto_map") and not trust_remote_code:
            raise UserError(f"{model.folder.option} {model.folder.given}: its {rel} asks to run code from the folder "
                            f"(auto_map: {summary(data['auto_map'])}); pass {TRUST_OPTION} if you trust its author")


def _check_modules(model: ModelFolder, trust_remote_code: bool) -> None:
    folder = model.folder
    if "modules.json" not in model.json:
        return
    modules = model.json["modules.json"]
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise folder.refuse("modules.json", "damaged (not the sentence-transformers layout: a list of modules)")
    for module in modules:
        kind = module.get("type")
        if not module_type_allowed(kind) and not trust_remote_code:
            raise UserError(f"{folder.option} {folder.given}: its modules.json names a module type from outside "
                            f"sentence-transformers ({str(kind)[:120]!r}), whose code would run; pass "
                            f"{TRUST_OPTION} if you trust its author")
        path = module.get("path", "")
        if not isinstance(path, str):
            raise folder.refuse("modules.json", f"damaged (a module path that is not text: {str(path)[:60]!r})")
        rel = "."
        if path not in ("", ".") and os.path.lexists(folder.resolve(path, named_in="modules.json")):
            sub = folder.subfolder(path, named_in="modules.json")  # a module without settings has no folder
            rel = os.path.relpath(sub.root, folder.root).replace(os.sep, "/")
        elif path not in ("", "."):
            rel = path.strip("/")
        if rel != "." and folder.is_dir(rel):
            nested = _check_entries(model, rel)
            _check_remote_code(model, rel, trust_remote_code)
            for inner in nested:  # a module's own subfolders (rare): the same rules
                _check_entries(model, inner)
        _check_pooling(model, module, rel)
        model.modules.append({**module, "_folder": rel})


_VETTED: dict[tuple, ModelFolder] = {}  # a folder is checked once per state of its entries, not per loader call


def _signature(folder: ConfinedFolder) -> tuple:
    """What a re-check would see change: each entry's name, kind, identity, size and time, to one level down."""
    seen = []
    for name, st in folder.entries():
        seen.append((name, st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns))
        if stat.S_ISDIR(st.st_mode) and not name.startswith("."):
            seen.extend((f"{name}/{inner}", s.st_mode, s.st_ino, s.st_size, s.st_mtime_ns)
                        for inner, s in folder.entries(name))
    return tuple(sorted(seen))


def _check_pooling(model: ModelFolder, module: dict, rel: str) -> None:
    """A Pooling module's config names a mode sentence-transformers knows, with true/false switches."""
    if not str(module.get("type", "")).endswith(".Pooling"):
        return
    name = "config.json" if rel == "." else f"{rel}/config.json"
    cfg = model.json.get(name, {})
    if not isinstance(cfg, dict):
        raise model.folder.refuse(name, "damaged (expected a JSON object)")
    mode = cfg.get("pooling_mode")
    if mode is not None and mode not in POOLING_MODES:
        raise model.folder.refuse(name, f"names an unknown pooling mode {str(mode)[:40]!r} (sentence-transformers "
                                        f"knows {', '.join(POOLING_MODES)})")
    for key, value in cfg.items():
        if str(key).startswith("pooling_mode_") and not isinstance(value, bool):
            raise model.folder.refuse(name, f"damaged ({key} is {str(value)[:30]!r}, expected true or false)")


def vet_model_folder(name: str | os.PathLike, option: str = "--model",
                     trust_remote_code: bool = False) -> ModelFolder:
    """Check every file a loader may open in a local model folder; one `UserError` naming the file otherwise."""
    folder = ConfinedFolder(name, option, kind="model folder")
    key = (str(folder.root), str(name), option, trust_remote_code, _signature(folder))
    if key in _VETTED:
        return _VETTED[key]
    model = ModelFolder(folder)
    _check_entries(model, ".")
    _check_remote_code(model, ".", trust_remote_code)
    _check_modules(model, trust_remote_code)
    if len(_VETTED) > 64:
        _VETTED.clear()
    _VETTED[key] = model
    return model


def vet_if_local(name: Any, option: str = "--model", trust_remote_code: bool = False) -> ModelFolder | None:
    """`vet_model_folder` for a local folder; None for a Hub id (its files arrive through the Hub's cache)."""
    return vet_model_folder(name, option, trust_remote_code) if is_local_folder(name) else None


__all__ = ["SAFETENSORS_DAMAGE", "ModelFolder", "is_local_folder", "module_type_allowed", "safetensors_table", "vet_if_local",
           "vet_model_folder"]
