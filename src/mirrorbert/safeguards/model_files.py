"""A model folder from a stranger, checked file by file through `ConfinedFolder`, once (`check_model_folder`):
regular files inside it; JSON and text UTF-8, bounded and shallow; safetensors as their headers promise; pickles
naming no globals beyond tensors; modules.json's folders inside and of sentence-transformers' classes; no code
run without trust. The result's bytes and descriptors feed `safeguards.snapshot`. A refusal names the file.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Any

from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.confined import JSON_LIMIT, TEXT_LIMIT, ConfinedFolder, describe_kind
from mirrorbert.safeguards.readback import loads_untrusted

# Text files a tokenizer reads as UTF-8 (a bad byte would be a parser's traceback).
TEXT_FILES = ("vocab.txt", "merges.txt")
# Files a library reads whole and small enough to keep as the checked bytes; larger ones stay open descriptors.
COPIED_LIMIT = 64 << 20
# Files of a model folder in which transformers looks for classes to import from the folder's own .py files.
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")
# Folders of an exported model (encoder/export.py) the runtimes read from.
EXPORT_FOLDERS = ("onnx", "openvino")
# Module packages of sentence-transformers whose classes modules.json may name (at most one submodule below).
SENTENCE_TRANSFORMERS_MODULES = (
    "sentence_transformers.models", "sentence_transformers.base.modules",
    "sentence_transformers.sentence_transformer.modules", "sentence_transformers.sparse_encoder.models",
    "sentence_transformers.sparse_encoder.modules", "sentence_transformers.cross_encoder.modules",
    "sentence_transformers.multi_vector_encoder.modules",
)
_SUBMODULE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]{0,63}$")
TRUST_OPTION = "--trust-remote-code"
POOLING_MODES = ("cls", "lasttoken", "max", "mean", "mean_sqrt_len_tokens", "weightedmean")
SAFETENSORS_HEADER_LIMIT = 100 << 20  # safetensors itself refuses headers over 100 MB
# Files of which a model folder needs at least one to have a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "merges.txt")
CHECKS = {"model folders": 0}  # folders checked in this process (a test counts the checks of one load)


def summary(auto_map: Any) -> str:
    """An auto_map as one short line, for a refusal."""
    import mirrorbert.jsonio as jsonio

    text = jsonio.dumps(auto_map, ensure_ascii=True, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


def module_type_allowed(kind: Any) -> bool:
    """`sentence_transformers.models.Pooling` and the like: a class of sentence-transformers' module packages."""
    if not isinstance(kind, str):
        return False
    package, _, name = kind.rpartition(".")
    parent, _, submodule = package.rpartition(".")
    inside = package in SENTENCE_TRANSFORMERS_MODULES or (
        parent in SENTENCE_TRANSFORMERS_MODULES and bool(_SUBMODULE.match(submodule)))
    return inside and bool(_CLASS_NAME.match(name))


@dataclass
class CheckedModel:
    """The checked files of a model folder: what a loader may read, what they say, and how to hand them over."""

    folder: ConfinedFolder
    trust_remote_code: bool = False
    json: dict[str, Any] = field(default_factory=dict)  # relative name -> parsed value, of every JSON file
    modules: list[dict[str, Any]] = field(default_factory=list)  # modules.json entries, `_folder` checked
    copied: dict[str, bytes] = field(default_factory=dict)  # relative name -> the checked bytes (small files)
    opened: dict[str, int] = field(default_factory=dict)  # relative name -> open descriptor (large files)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)  # safetensors file -> its header's table

    def get(self, name: str, default: Any = None) -> Any:
        return self.json.get(name, default)

    def files(self) -> list[str]:
        return sorted([*self.copied, *self.opened])

    def close(self) -> None:
        for fd in self.opened.values():
            os.close(fd)
        self.opened.clear()


def _keep_weights(model: CheckedModel, rel: str, fd: int) -> None:
    """A safetensors file: its header parses and the file holds what it promises; the header's table is kept."""
    size = os.fstat(fd).st_size
    try:
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, SAFETENSORS_HEADER_LIMIT):
            raise ValueError("header longer than the file or 100 MB")
        header = loads_untrusted(os.pread(fd, n, 8))
        if not isinstance(header, dict):
            raise ValueError("the header is not a table of tensors")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        needed = 8 + n + max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
        for v in tensors.values():
            [int(d) for d in v["shape"]]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise model.folder.refuse(rel, f"damaged (not a valid safetensors file: {first_line(exc)[:120]})") from None
    if needed > size:
        raise model.folder.refuse(rel, f"truncated ({size} bytes, its header needs {needed}); copy or download it "
                                       f"again")
    model.tensors[rel] = tensors


def _check_pickle(model: CheckedModel, rel: str, fd: int) -> None:
    """Pickle weights name no globals beyond tensors and plain containers (scanned, never unpickled)."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    try:
        with os.fdopen(os.dup(fd), "rb") as fh:
            unsafe = get_unsafe_globals_in_checkpoint(fh)
    except Exception:  # noqa: BLE001  not torch's zip format: the weights-only load refuses or reads it
        return
    if unsafe:
        folder = model.folder
        raise UserError(f"{folder.option} {folder.given}: {folder.given / rel} is a pickle that names "
                        f"{', '.join(unsafe[:3])} (code that loading it would run); refused, not loaded (ask for "
                        "model.safetensors)")


def _check_file(model: CheckedModel, rel: str) -> None:
    folder = model.folder
    base = rel.rsplit("/", 1)[-1]
    if base.endswith(".json"):
        raw = folder.read_bytes(rel, JSON_LIMIT)
        model.json[rel] = folder.parse_json(rel, raw, expect=None)
        model.copied[rel] = raw
        return
    if base in TEXT_FILES:
        model.copied[rel] = folder.read_text(rel, TEXT_LIMIT).encode("utf-8")
        return
    fd = folder.open(rel)
    try:
        if base.endswith(".safetensors"):
            _keep_weights(model, rel, fd)
        if os.fstat(fd).st_size <= COPIED_LIMIT and not base.endswith((".safetensors", ".bin")):
            with os.fdopen(fd, "rb") as fh:
                model.copied[rel] = fh.read(COPIED_LIMIT + 1)
            return
    except BaseException:
        os.close(fd)
        raise
    model.opened[rel] = fd


def _check_entries(model: CheckedModel, sub: str) -> list[str]:
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


def _check_remote_code(model: CheckedModel, sub: str) -> None:
    for name in REMOTE_CODE_FILES:
        rel = name if sub == "." else f"{sub}/{name}"
        data = model.json.get(rel)
        if isinstance(data, dict) and data.get("auto_map") and not model.trust_remote_code:
            raise UserError(f"{model.folder.option} {model.folder.given}: its {rel} asks to run code from the folder "
                            f"(auto_map: {summary(data['auto_map'])}); pass {TRUST_OPTION} if you trust its author")


def _module_folder(model: CheckedModel, module: dict) -> str:
    """The checked folder of one modules.json entry, relative to the model folder ('.' for the folder)."""
    folder = model.folder
    kind, path = module.get("type"), module.get("path", "")
    if not module_type_allowed(kind) and not model.trust_remote_code:
        raise UserError(f"{folder.option} {folder.given}: its modules.json names a module type from outside "
                        f"sentence-transformers ({str(kind)[:120]!r}), whose code would run; pass "
                        f"{TRUST_OPTION} if you trust its author")
    if not isinstance(path, str):
        raise folder.refuse("modules.json", f"damaged (a module path that is not text: {str(path)[:60]!r})")
    if path in ("", "."):
        return "."
    real = folder.resolve(path, named_in="modules.json")
    if not os.path.lexists(real):
        return path.strip("/")  # a module without settings has no folder
    sub = folder.subfolder(path, named_in="modules.json")
    return os.path.relpath(sub.root, folder.root).replace(os.sep, "/")


def _check_modules(model: CheckedModel) -> None:
    folder = model.folder
    if "modules.json" not in model.json:
        return
    modules = model.json["modules.json"]
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise folder.refuse("modules.json", "damaged (not the sentence-transformers layout: a list of modules)")
    for module in modules:
        rel = _module_folder(model, module)
        if rel != "." and folder.is_dir(rel) and not any(f.startswith(rel + "/") for f in model.files()):
            for inner in _check_entries(model, rel):  # a module's own subfolders (rare): the same rules
                _check_entries(model, inner)
            _check_remote_code(model, rel)
        _check_pooling(model, module, rel)
        model.modules.append({**module, "_folder": rel})


def _check_pooling(model: CheckedModel, module: dict, rel: str) -> None:
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


def _check_kinds(model: CheckedModel, need_config: bool, need_tokenizer: bool) -> None:
    folder = model.folder
    if need_config and "config.json" not in model.json:
        raise UserError(f"{folder.option} {folder.given}: folder has no config.json (not a Hugging Face model folder)")
    if need_tokenizer and not any(name in model.copied or name in model.opened for name in TOKENIZER_FILES):
        raise UserError(f"{folder.option} {folder.given}: no tokenizer files in this folder (expected one of "
                        f"{', '.join(TOKENIZER_FILES[:4])}, ...)")
    weights = [name for name in model.files() if name.endswith(".safetensors") and "/" not in name]
    pickles = [name for name in model.opened if name.startswith("pytorch_model") and name.endswith(".bin")]
    for name in pickles:  # a loader reads safetensors where there are any: then the pickles stay closed
        if weights:
            os.close(model.opened.pop(name))
        else:
            _check_pickle(model, name, model.opened[name])


def check_model_folder(root: str | os.PathLike, option: str = "--model", *, trust_remote_code: bool = False,
                       need_config: bool = True, need_tokenizer: bool = True) -> CheckedModel:
    """Check every file a loader may open in a local model folder; the caller closes the result."""
    CHECKS["model folders"] += 1
    model = CheckedModel(ConfinedFolder(root, option, kind="model folder"), trust_remote_code)
    try:
        nested = _check_entries(model, ".")
        _check_remote_code(model, ".")
        _check_modules(model)
        for sub in nested:
            if sub in EXPORT_FOLDERS:
                _check_entries(model, sub)
        _check_kinds(model, need_config, need_tokenizer)
    except BaseException:
        model.close()
        raise
    return model
