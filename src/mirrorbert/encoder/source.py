"""Where every model comes in: `open_model` opens a model from a name or a folder, checks it once, and returns
the `ModelHandle` every loader of mirrorbert takes (the encoder, the trainers, export, evaluation, MTEB).

* A local folder is checked file by file (safeguards/model_files.py); a Hub id is first fetched into the Hugging
  Face cache (only the files a loader reads) and its snapshot checked the same way.
* Libraries are handed only the handle's private snapshot (safeguards/snapshot.py), written from the checked
  files: a file of the folder swapped after the check is never read.
* No code from files: `trust_remote_code` is passed explicitly (False unless the user said so), so transformers
  never prompts; pickle weights are scanned for globals before a weights-only load.
* The config is checked against the weights' headers before a model is built; the tokenizer against empty
  vocabularies and patterns that panic; the type against what this transformers can run.
* Every model the handle builds passes `architectures.prepare_model`: a fresh start, a checkpoint and a saved
  folder are prepared alike.

`tests/safeguards/test_remote_code.py` checks that no other module calls `from_pretrained`, `from_config` or
`torch.load`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.model_files import TRUST_OPTION, CheckedModel, check_model_folder, summary
from mirrorbert.safeguards.preflight import check_max_length, check_model_exists, hub_reachable, is_decoder_config
from mirrorbert.safeguards.snapshot import Snapshot

logger = logging.getLogger(__name__)

# What a Hub download fetches: what transformers, tokenizers and sentence-transformers read.
HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors"]
HUB_PICKLES = ["pytorch_model*.bin"]
MODEL_CLASSES = ("AutoModel", "AutoModelForMaskedLM")
# Bounds no real model comes near: a config.json beyond them would take minutes or all memory to build.
CONFIG_SIZE_LIMITS = {
    "num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024,
    "hidden_size": 1 << 17, "n_embd": 1 << 17, "d_model": 1 << 17,
    "intermediate_size": 1 << 20, "n_inner": 1 << 20,
    "num_attention_heads": 1 << 12, "n_head": 1 << 12,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 24, "n_positions": 1 << 24,
    "type_vocab_size": 1 << 16,
}
# A real vocabulary has thousands of entries; a handful of non-special tokens means an empty tokenizer.
MIN_REAL_TOKENS = 8
# Strings that make a backtracking pattern in a crafted tokenizer.json blow its match budget (tokenizers then
# panics): long runs of one character, of a pair, of spaces and digits, each ended by an odd one out.
TOKENIZER_PROBES = tuple(run * n + end for run in ("a", "ab", " ", "0", "é", ".") for n in (64, 512)
                         for end in ("!", "c", ""))


def open_model(name: str | os.PathLike, *, option: str = "--model", trust_remote_code: bool = False,
               need_config: bool = True, need_tokenizer: bool = True) -> "ModelHandle":
    """The model `name` (a folder or a Hub id) opened and checked once; close it (or use `with`) when loaded.
    `need_config=False` opens a tokenizer's folder (`pretrain-mlm --tokenizer`)."""
    if not isinstance(trust_remote_code, bool):
        raise UserError(f"trust_remote_code: must be true or false, not {trust_remote_code!r}")
    text = os.fsdecode(name) if isinstance(name, bytes) else str(name)
    folder = local_folder(text, option, trust_remote_code)
    checked = check_model_folder(folder, option, trust_remote_code=trust_remote_code, need_config=need_config,
                                 need_tokenizer=need_tokenizer)
    checked.folder.given = Path(text)  # messages name the folder as the user gave it, or the Hub id
    try:
        return ModelHandle(text, option, checked)
    except BaseException:
        checked.close()
        raise


def local_folder(name: str, option: str = "--model", trust_remote_code: bool = False) -> Path:
    """`name` as a local folder: itself, or a Hub id's snapshot in the Hugging Face cache (fetched if needed)."""
    check_model_exists(name, option)
    if os.path.isdir(name):
        return Path(name)
    cached = cached_snapshot(name, option)
    if cached is not None:
        return cached
    if not hub_reachable():  # False under HF_HUB_OFFLINE
        raise UserError(f"{option} {name}: not a local folder and the Hugging Face hub is unreachable from this "
                        f"machine; {option} also takes a local folder holding a saved model (e.g. {option} "
                        "path/to/model)")
    from huggingface_hub import snapshot_download

    patterns = HUB_FILES + (["*.py"] if trust_remote_code else [])
    try:
        folder = Path(snapshot_download(name, allow_patterns=patterns))
        if not any(folder.glob("*.safetensors")):
            snapshot_download(name, allow_patterns=patterns + HUB_PICKLES)
    except Exception as exc:  # noqa: BLE001  huggingface_hub raises its own types (not found, gated, network)
        raise UserError(f"{option} {name}: no such local folder or hub model ({type(exc).__name__}: "
                        f"{first_line(exc)[:160]})") from None
    return cached_snapshot(name, option) or folder


def cached_snapshot(name: str, option: str = "--model") -> Path | None:
    """The Hugging Face cache's snapshot of the Hub model `name` at its `main` ref, or None when not cached; the
    ref is read through the confined reader and must name a snapshot folder of that repository."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    from mirrorbert.safeguards.confined import ConfinedFolder

    repo = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model")
    if not os.path.isdir(repo / "refs") or not os.path.exists(repo / "refs" / "main"):
        return None
    revision = ConfinedFolder(repo, option, "Hugging Face cache").read_text("refs/main", limit=256).strip()
    if not re.fullmatch(r"[0-9a-f]{6,64}", revision):
        raise UserError(f"{option} {name}: the Hugging Face cache's {repo / 'refs' / 'main'} names no revision "
                        f"({revision[:40]!r}); damaged")
    snapshot = repo / "snapshots" / revision
    return snapshot if os.path.isdir(snapshot) else None


class ModelHandle:
    """A model opened and checked once (`open_model`): its checked files, and the loaders that read them."""

    def __init__(self, name: str, option: str, checked: CheckedModel):
        self.name, self.option, self.files = name, option, checked
        self.trust_remote_code = checked.trust_remote_code
        self.snapshot = Snapshot(checked.copied, checked.opened)
        self._config: Any = None
        self._tokenizer: Any = None

    def close(self) -> None:
        self.snapshot.close()
        self.files.close()

    def __enter__(self) -> "ModelHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def path(self) -> Path:
        """The private snapshot: the only path a library is given."""
        return self.snapshot.path

    def json(self, name: str, default: Any = None) -> Any:
        """A JSON file of the folder as the check parsed it."""
        return self.files.get(name, default)

    def config(self, overrides: dict[str, Any] | None = None):
        """The model's config (with `overrides` applied), checked against its weights before anything is built."""
        if self._config is None:
            self._config = self._load_config({})
            _check_config_sizes(self, self._config)
            _check_weights_match(self, self._config)
            from mirrorbert.encoder.architectures import check_supported

            check_supported(self._config, self.name, self.option)
        return self._config if not overrides else self._load_config(overrides)

    def _load_config(self, overrides: dict[str, Any]):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.path, trust_remote_code=self.trust_remote_code, **overrides)
        except Exception as exc:  # noqa: BLE001  transformers raises KeyError/TypeError/its own types for bad files
            raise self._failure("model configuration (config.json)", exc) from None
        if getattr(config, "auto_map", None) and not self.trust_remote_code:
            raise self._refusal(f"its config.json asks to run code shipped with the model (auto_map: "
                                f"{summary(config.auto_map)})")
        return config

    def check_max_length(self, max_length: int | None, option: str = "--max-length") -> None:
        check_max_length(max_length, self.config(), option, self.name)

    def warn_if_decoder(self) -> None:
        config = self.config()
        if is_decoder_config(config):
            logger.warning("%s %s is a causal (decoder-only) language model (%s); Mirror-BERT expects an "
                           "encoder-style masked LM (BERT, RoBERTa, ...), so its vectors may be poor", self.option,
                           self.name, getattr(config, "model_type", "?"))

    def tokenizer(self):
        """The model's tokenizer, checked on ordinary text (an empty vocabulary, a pattern that panics)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
            except BaseException as exc:  # noqa: BLE001  a damaged tokenizer.json raises KeyError/Exception/a panic
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                raise self._failure("tokenizer files", exc) from None
            _check_tokenizer(tokenizer, self.name, self.option)
            self._tokenizer = tokenizer
        return self._tokenizer

    def need_mask(self, option: str = "--mask-span") -> None:
        if getattr(self.tokenizer(), "mask_token_id", None) is None:
            raise UserError(f"{option}: the tokenizer of {self.name} has no mask token; masking needs one "
                            "([MASK] or <mask>)")

    def load(self, kind: str = "AutoModel", config: Any = None):
        """The model's weights in `kind` (AutoModel or AutoModelForMaskedLM), weights-only, prepared."""
        import transformers

        from mirrorbert.compat import from_pretrained_takes_weights_only
        from mirrorbert.encoder.architectures import prepare_model

        if kind not in MODEL_CLASSES:
            raise ValueError(f"unknown model class {kind}")
        kwargs: dict[str, Any] = {"config": config if config is not None else self.config()}
        if from_pretrained_takes_weights_only():  # 4.x has no such argument and always loads weights-only
            kwargs["weights_only"] = True
        try:
            with quiet_transformers():
                model = getattr(transformers, kind).from_pretrained(self.path, trust_remote_code=self.trust_remote_code,
                                                                    **kwargs)
        except Exception as exc:  # noqa: BLE001  the loader's own types for damaged weights
            raise self._weights_failure(exc) from None
        return prepare_model(model)

    def sentence_transformer(self, device: str | None = None, **kwargs: Any):
        """The folder as sentence-transformers loads it (its modules, checked), for the comparison backend."""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise UserError("this model needs sentence-transformers (pip install 'mirrorbert[st]')") from None
        try:
            return SentenceTransformer(str(self.path), device=device, trust_remote_code=self.trust_remote_code,
                                       **kwargs)
        except Exception as exc:  # noqa: BLE001  only the loader's refusals are worded here
            raise self._weights_failure(exc) from None

    def _refusal(self, reason: str) -> UserError:
        return UserError(f"{self.option} {self.name}: {reason}; pass {TRUST_OPTION} if you trust its author")

    def _failure(self, what: str, exc: BaseException) -> UserError:
        if isinstance(exc, UserError):
            return exc
        if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
            return self._refusal("it needs to run code shipped with the model (custom classes)")
        if is_tokenizer_panic(exc):
            return UserError(f"{self.option} {self.name}: its tokenizer fails to load ({first_line(exc)[:160]}); "
                             "tokenizer.json is damaged or crafted")
        detail = f"no entry {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())[:300] or \
            type(exc).__name__
        return UserError(f"{self.option} {self.name}: cannot read the {what} in this folder: {detail}")

    def _weights_failure(self, exc: BaseException) -> UserError:
        seen: BaseException | None = exc  # transformers 4.x wraps the unpickler's error in an OSError
        while seen is not None and not isinstance(seen, pickle.UnpicklingError):
            seen = seen.__cause__ or seen.__context__
        if seen is not None:
            which = ", ".join(sorted(n for n in self.files.opened if n.endswith(".bin"))) or "weights"
            return UserError(f"{self.option} {self.name}: its {which} is a pickle that asks for more than tensors "
                             "(it could run code); refused, not loaded (ask for model.safetensors)")
        if isinstance(exc, UserError):
            return exc
        if type(exc).__name__ == "SafetensorError" or "safetensors" in type(exc).__module__:
            return UserError(f"{self.option} {self.name}: cannot read the weights (model.safetensors damaged or "
                             f"truncated: {first_line(exc)})")
        if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
            return self._refusal("it needs to run code shipped with the model (custom classes)")
        if isinstance(exc, (OSError, ValueError, KeyError, RuntimeError)):
            return UserError(f"{self.option} {self.name}: cannot load the model in this folder: {first_line(exc)}")
        raise exc


def fresh_model(config, kind: str = "AutoModelForMaskedLM", *, trust_remote_code: bool = False,
                option: str = "--model"):
    """A model of `config` with fresh weights (transformers' own classes unless trusted), prepared."""
    import transformers

    from mirrorbert.encoder.architectures import prepare_model

    if getattr(config, "auto_map", None) and not trust_remote_code:
        raise UserError(f"{option}: the configuration asks to run code shipped with the model (auto_map: "
                        f"{summary(config.auto_map)}); pass {TRUST_OPTION} if you trust its author")
    if kind not in MODEL_CLASSES:
        raise ValueError(f"unknown model class {kind}")
    return prepare_model(getattr(transformers, kind).from_config(config, trust_remote_code=trust_remote_code))


def config_for_model(model_type: str, **values):
    """`AutoConfig.for_model`: transformers' own classes only (it never imports code from a file)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **values)


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings (unused MLM-head weights, load reports) off inside the block, unless mirrorbert
    logs at DEBUG (-v)."""
    if logging.getLogger("mirrorbert").isEnabledFor(logging.DEBUG):
        yield
        return
    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)


def _check_config_sizes(handle: ModelHandle, config) -> None:
    """Every size a positive whole number under CONFIG_SIZE_LIMITS, and the layer count the weights' names imply
    equal to config.json's: before anything, even on the meta device, is built from config.json."""
    for key, limit in CONFIG_SIZE_LIMITS.items():
        value = getattr(config, key, None)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > limit:
            raise UserError(f"{handle.option} {handle.name}: config.json has {key} = {str(value)[:30]}, outside "
                            f"0..{limit}; damaged or not a model mirrorbert can build")
    counts: dict[str, tuple[int, str]] = {}  # layers per stack (an encoder-decoder has two): (count, its prefix)
    for name in _header_shapes(handle):
        match = _LAYER_INDEX.search(name)
        if match:
            stack, prefix = name[:match.start()], name[:match.start(1)]
            counts[stack] = max(counts.get(stack, (0, prefix)), (int(match.group(1)) + 1, prefix))
    layers = next((getattr(config, k) for k in ("num_hidden_layers", "n_layer", "num_layers")
                   if isinstance(getattr(config, k, None), int)), None)
    if not counts or layers is None or layers in [n for n, _ in counts.values()]:
        return
    held, prefix = max(counts.values())
    where = f"{handle.option} {handle.name}"
    if layers > held:
        raise UserError(f"{where}: config.json asks for parameters the weights do not hold ({layers} layers, the "
                        f"weights hold {held}: {prefix}{held} and after are missing); does num_hidden_layers in "
                        "config.json match the weights?")
    raise UserError(f"{where}: the weights hold parameters config.json has no place for ({held} layers, config.json "
                    f"asks for {layers}: {prefix}{layers} and after); does num_hidden_layers in config.json match "
                    "the weights?")


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")


def _header_shapes(handle: ModelHandle) -> dict[str, list[int]]:
    return {k: [int(d) for d in v["shape"]] for table in handle.files.tensors.values() for k, v in table.items()}


def _check_weights_match(handle: ModelHandle, config) -> None:
    """The shapes config.json builds (on the meta device: no memory) equal the shapes in the safetensors
    headers; the first mismatch named, before the loader spends seconds failing on it."""
    shapes = _header_shapes(handle)
    if not shapes or getattr(config, "auto_map", None):  # a trusted model's own classes: its loader checks
        return
    import torch

    try:
        with torch.device("meta"):
            model = fresh_model(config, "AutoModel", option=handle.option)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  any error here means config.json does not describe a model
        raise UserError(f"{handle.option} {handle.name}: config.json does not describe a model transformers can "
                        f"build: {first_line(exc)}") from None
    prefix = getattr(model, "base_model_prefix", "") or ""
    params = {name: list(p.shape) for name, p in model.named_parameters()}
    found: set[str] = set()
    for name, shape in params.items():
        key = name if name in shapes else f"{prefix}.{name}" if f"{prefix}.{name}" in shapes else None
        if key is None:
            continue
        found.add(key)
        if shape != shapes[key]:
            raise UserError(f"{handle.option} {handle.name}: config.json and the weights disagree: {key} is "
                            f"{'x'.join(map(str, shapes[key]))} in the weights, config.json makes it "
                            f"{'x'.join(map(str, shape))} (was config.json edited or copied from another model?)")
    if not found:
        return
    missing = [n for n in params if n not in shapes and f"{prefix}.{n}" not in shapes and not _renamed_or_pooler(n)]
    tops = {n.split(".")[0] for n in params}
    unused = [k for k in shapes if k not in found and not _renamed_or_pooler(k)
              and (k.split(".")[0] in tops or (prefix and k.startswith(prefix + ".")))]
    if missing or unused:
        which, names = ("config.json asks for parameters the weights do not hold", missing) if missing else (
            "the weights hold parameters config.json has no place for", unused)
        raise UserError(f"{handle.option} {handle.name}: {which} ({len(names)}, e.g. {names[0]}); does "
                        "num_hidden_layers or another size in config.json match the weights?")


def _renamed_or_pooler(name: str) -> bool:
    parts = name.split(".")
    module = parts[-2].lower() if len(parts) > 1 else ""
    return "pooler" in parts or parts[-1] in ("gamma", "beta", "position_ids") or module in (
        "layernorm", "layer_norm", "ln")


def is_tokenizer_panic(exc: BaseException) -> bool:
    """tokenizers' Rust panics arrive as pyo3's PanicException, a BaseException of no importable type."""
    return type(exc).__name__ == "PanicException"


def probe_tokenizer(encode, name: str, option: str = "--model") -> None:
    """Run `encode` (a tokenizer's batch call) on TOKENIZER_PROBES: a panic inside tokenizers is one line (the
    panic's own report, which Rust writes straight to the standard error, is held back)."""
    try:
        with native_stderr_held():
            encode(list(TOKENIZER_PROBES))
    except BaseException as exc:  # noqa: BLE001  a PanicException is no Exception
        if not is_tokenizer_panic(exc):
            raise
        raise UserError(f"{option} {name}: its tokenizer fails on ordinary text ({first_line(exc)[:160]}); "
                        "tokenizer.json is damaged or crafted") from None


@contextlib.contextmanager
def native_stderr_held():
    """Inside the block, what native code writes to file descriptor 2 (a Rust panic's report) is held back; it is
    written out after the block unless it is a panic's report (which the caller words as one line)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no standard error to redirect: nothing to hold back
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            if text and "panicked at" not in text:
                sys.stderr.write(text)


def _check_tokenizer(tokenizer, name: str, option: str) -> None:
    """A folder without tokenizer files loads as a 5-token tokenizer that maps every word to [UNK]; a crafted
    one whose patterns exhaust their match budget panics inside tokenizers; a model_max_length that is no
    positive length is the tokenizer's own limit left unset: all settled before any work."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if len(tokenizer) - len(special) < MIN_REAL_TOKENS:
        raise UserError(f"{option} {name}: the tokenizer is empty ({len(tokenizer)} tokens); the folder needs "
                        "its tokenizer files (one of tokenizer.json, vocab.txt, vocab.json, spiece.model, ...)")
    limit = getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        logger.info("%s %s: tokenizer_config.json's model_max_length %r is no length; the model's positions "
                    "decide", option, name, limit)
        tokenizer.model_max_length = int(1e30)
    probe_tokenizer(lambda texts: tokenizer(texts, add_special_tokens=True, truncation=True), name, option)


__all__ = ["ModelHandle", "config_for_model", "fresh_model", "is_tokenizer_panic", "local_folder", "open_model",
           "probe_tokenizer", "quiet_transformers"]
