"""Cheap checks of inputs before the expensive work: model folders, tokenizers, lengths, readable files.

Why a module of its own: loading weights takes seconds to minutes and a wrong `--max-length` would
crash mid-run, so every command reads the small files (config.json, tokenizer files, the safetensors
header) first and refuses a bad input with one `UserError` line before any weights are loaded.
Nothing here imports torch; transformers is imported only when a config or tokenizer is read.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

# Models whose position ids start after the padding index, so pad_token_id + 1 positions are unusable.
OFFSET_POSITION_MODEL_TYPES = ("roberta", "xlm-roberta", "camembert", "longformer")
# Decoder-only families: Mirror-BERT expects a bidirectional encoder; these still run but pool poorly.
DECODER_MODEL_TYPES = (
    "gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "llama", "mistral", "mixtral", "qwen2", "qwen3",
    "opt", "bloom", "falcon", "phi", "phi3", "gemma", "gemma2", "codegen", "ctrl", "xglm", "olmo",
)
# Files of which a model folder needs at least one to have a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "merges.txt")
# A real vocabulary has thousands of entries; a handful of non-special tokens means an empty tokenizer.
MIN_REAL_TOKENS = 8


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# What a Hugging Face Hub id looks like: `name` or `org/name`, of letters, digits, `.`, `_` and `-`.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def looks_like_path(name: str) -> bool:
    """Whether a model name means a folder rather than a Hub id, so that a mistyped folder is "no such folder",
    not a Hub lookup and "the hub is unreachable". Only `name` and `org/name` are Hub ids; a path is a value
    that starts with `.`, `/` or `~`, ends with a separator, has more than one slash, holds a character no Hub
    id has (a backslash, a space), or whose first part is a local folder (`runs/minilm-mirorr` beside `runs/`)."""
    if name.startswith((".", "/", "~")) or name.endswith(("/", os.sep)) or name.count("/") > 1:
        return True
    if not _HUB_ID.fullmatch(name):
        return True
    head, slash, _ = name.partition("/")
    return bool(slash) and os.path.isdir(head)


def check_model_exists(name: str, option: str = "--model") -> None:
    """A path-looking model name that is not there, or a file where a model folder belongs (a FIFO or a device
    would block or never end if read as a config): one line, before any Hub lookup or read (every command's
    model goes through `check_model_reachable` or `model_load_error`, which call this)."""
    if os.path.lexists(name) and not os.path.isdir(name):
        raise UserError(f"{option} {name}: not a folder (a model is a folder of config, tokenizer and weight "
                        "files, or a Hugging Face hub id)")
    if not os.path.lexists(name) and looks_like_path(name):
        raise UserError(f"{option} {name}: no such folder")


def model_load_error(name: str, exc: Exception) -> UserError:
    if Path(name).exists():
        first = first_line(exc)
        return UserError(f"--model {name}: cannot load the model in this folder: {first}")
    try:
        check_model_exists(name)
    except UserError as missing:
        return missing
    offline = os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True")
    text = str(exc).lower()
    unreachable = offline or any(
        hint in text for hint in ("connect", "offline", "resolve", "network", "couldn't reach", "cannot find the requested files", "local_files_only", "internet")
    )
    if unreachable:
        return UserError(
            f"--model {name}: not a local folder and the Hugging Face hub is unreachable from this machine; "
            "--model also takes a local folder holding a saved model (e.g. --model path/to/model)"
        )
    return UserError(f"--model {name}: no such local folder or hub model ({type(exc).__name__})")


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so an offline machine gets an answer in seconds instead of minutes of retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def check_model_reachable(name: str, trust_remote_code: bool = False, option: str = "--model") -> None:
    """A name that is neither a local folder nor in the local HF cache needs the hub: fail fast if offline.
    A path-looking name that is not there is "no such folder" (`check_model_exists`)."""
    check_model_exists(name, option)
    if Path(name).exists():
        return
    from mirrorbert.safeguards.model_loading import load_config as load_config_checked

    try:
        load_config_checked(name, trust_remote_code=trust_remote_code, local_files_only=True)
        return  # cached earlier: loads offline
    except (OSError, ValueError):  # a UserError (remote code) is a ValueError: the real load words it
        pass
    if not hub_reachable():
        raise UserError(
            f"{option} {name}: not a local folder and the Hugging Face hub is unreachable from this machine; "
            f"{option} also takes a local folder holding a saved model (e.g. {option} path/to/model)"
        )


def check_readable(path: str | os.PathLike, option: str) -> Path:
    """An existing, readable regular file, or one error line naming the option and the file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{option} {path}: no such file")
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder, expected a file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{option} {path}: permission denied (the file is not readable)")
    return path


def max_positions(config) -> int | None:
    """Usable positions of a model config (RoBERTa-style models lose pad_token_id + 1 of them)."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or isinstance(positions, bool) or positions <= 0:
        return None
    if getattr(config, "model_type", "") in OFFSET_POSITION_MODEL_TYPES:
        positions -= (getattr(config, "pad_token_id", None) or 0) + 1
    return positions


def check_max_length(max_length: int | None, config, option: str = "--max-length", model: str = "") -> None:
    """A length the position embeddings cannot hold fails on the first long batch: refuse it now."""
    if max_length is None:
        return
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
        raise UserError(f"{option} {max_length}: must be an integer >= 1")
    limit = max_positions(config)
    if limit is not None and max_length > limit:
        where = f" {model}" if model else ""
        raise UserError(f"{option} {max_length}: the model{where} takes at most {limit} positions")


def is_decoder_config(config) -> bool:
    architectures = getattr(config, "architectures", None) or []
    return bool(
        getattr(config, "is_decoder", False)
        or getattr(config, "model_type", "") in DECODER_MODEL_TYPES
        or any(str(a).endswith("ForCausalLM") or str(a).endswith("LMHeadModel") for a in architectures)
    )


def warn_if_decoder(config, name: str) -> bool:
    if not is_decoder_config(config):
        return False
    logger.warning("--model %s is a causal (decoder-only) language model (%s); Mirror-BERT expects an "
                   "encoder-style masked LM (BERT, RoBERTa, ...), so its vectors may be poor",
                   name, getattr(config, "model_type", "?"))
    return True


# Strings that make a backtracking pattern in a crafted tokenizer.json blow its match budget (tokenizers then
# panics): long runs of one character, of a pair, of spaces and digits, each ended by an odd one out.
TOKENIZER_PROBES = tuple(run * n + end for run in ("a", "ab", " ", "0", "é", ".") for n in (64, 512)
                         for end in ("!", "c", ""))


def is_tokenizer_panic(exc: BaseException) -> bool:
    """tokenizers' Rust panics arrive as pyo3's PanicException, a BaseException of no importable type."""
    return type(exc).__name__ == "PanicException"


def tokenizer_failure(exc: BaseException, name: str, option: str = "--model") -> UserError:
    return UserError(f"{option} {name}: its tokenizer fails on ordinary text ({first_line(exc)[:160]}); "
                     "tokenizer.json is damaged or crafted")


def check_tokenizer(tokenizer, name: str, option: str = "--model") -> None:
    """A folder without tokenizer files loads as a 5-token tokenizer that maps every word to [UNK]; a crafted
    one whose patterns exhaust their match budget panics inside tokenizers: both refused before any work."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if len(tokenizer) - len(special) < MIN_REAL_TOKENS:
        raise UserError(f"{option} {name}: the tokenizer is empty ({len(tokenizer)} tokens); the folder needs "
                        f"its tokenizer files (one of {', '.join(TOKENIZER_FILES[:4])}, ...)")
    probe_tokenizer(lambda texts: tokenizer(texts, add_special_tokens=True, truncation=True), name, option)


def probe_tokenizer(encode, name: str, option: str = "--model") -> None:
    """Run `encode` (a tokenizer's batch call) on TOKENIZER_PROBES: a panic inside tokenizers is one line."""
    try:
        encode(list(TOKENIZER_PROBES))
    except BaseException as exc:  # noqa: BLE001  a PanicException is no Exception
        if not is_tokenizer_panic(exc):
            raise
        raise tokenizer_failure(exc, name, option) from None


def check_tokenizer_files(folder: Path, option: str = "--model") -> None:
    if folder.is_dir() and not any((folder / f).exists() for f in TOKENIZER_FILES):
        raise UserError(f"{option} {folder}: no tokenizer files in this folder (expected one of "
                        f"{', '.join(TOKENIZER_FILES[:4])}, ...)")


def read_safetensors_header(path: Path, option: str = "--model") -> dict[str, Any]:
    """The tensor table of a safetensors file (name -> dtype, shape, offsets), read from its header only.

    Header-only integrity check: the data the header promises must be in the file (a truncated download or
    copy fails here, in milliseconds, instead of inside the loader)."""
    from mirrorbert.safeguards.model_folder import SAFETENSORS_DAMAGE, safetensors_table
    from mirrorbert.safeguards.readback import open_regular

    try:
        with os.fdopen(open_regular(path, option), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            tensors, needed = safetensors_table(fh)
    except PermissionError:
        raise UserError(f"{option}: {path}: permission denied (the file is not readable)") from None
    except SAFETENSORS_DAMAGE as exc:
        raise UserError(f"{option}: {path} is damaged (not a valid safetensors file: {first_line(exc)})") from None
    if needed > size:
        raise UserError(f"{option}: {path} is truncated ({size} bytes, its header needs {needed}); "
                        "copy or download it again")
    return tensors


# Bounds no real model comes near (the largest published encoders and LLMs stay well inside them): a config.json
# beyond them (300,000 layers, a hidden size of 10**9) would take minutes or all memory to build, even on the
# meta device, before any other check could refuse it.
CONFIG_SIZE_LIMITS = {
    "num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024,
    "hidden_size": 1 << 17, "n_embd": 1 << 17, "d_model": 1 << 17,
    "intermediate_size": 1 << 20, "n_inner": 1 << 20,
    "num_attention_heads": 1 << 12, "n_head": 1 << 12,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 24, "n_positions": 1 << 24,
    "type_vocab_size": 1 << 16,
}
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")
# Fields a config may carry for the width of its input embeddings, most specific first (RemBERT's
# input_embedding_size, ALBERT/ELECTRA/MobileBERT's embedding_size, XLM's emb_dim, DistilBERT's dim).
EMBEDDING_WIDTH_FIELDS = ("input_embedding_size", "embedding_size", "emb_dim", "hidden_size", "dim", "d_model")
_EMBEDDING_NAMES = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight")


def check_config_sizes(folder: str | os.PathLike, config, option: str = "--model") -> None:
    """Sizes in config.json checked before any model is built from it: every size a positive whole number
    under CONFIG_SIZE_LIMITS, and, when the folder has safetensors weights, the layer count, vocabulary and
    hidden size their header implies (tensor names and shapes only, no data read) equal to config.json's."""
    folder = Path(folder)
    for key, limit in CONFIG_SIZE_LIMITS.items():
        value = getattr(config, key, None)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > limit:
            raise UserError(f"{option} {folder}: config.json has {key} = {str(value)[:30]}, outside 0..{limit}; "
                            "damaged or not a model mirrorbert can build")
    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        try:
            tensors = read_safetensors_header(path, option)
        except UserError:  # a damaged weight file is check_weight_files' (and the loader's) error to report
            return
        shapes.update({k: [int(d) for d in v["shape"]] for k, v in tensors.items()})
    if not shapes:
        return
    counts: dict[str, tuple[int, str]] = {}  # layers per stack (an encoder-decoder has two): (count, its prefix)
    for name in shapes:
        match = _LAYER_INDEX.search(name)
        if match:
            stack = name[:match.start()]
            prefix = name[:match.start(1)]
            counts[stack] = max(counts.get(stack, (0, prefix)), (int(match.group(1)) + 1, prefix))
    layers = next((getattr(config, k) for k in ("num_hidden_layers", "n_layer", "num_layers")
                   if isinstance(getattr(config, k, None), int)), None)
    if counts and layers is not None and layers not in [n for n, _ in counts.values()]:
        held, prefix = max(counts.values())
        if layers > held:
            raise UserError(f"{option} {folder}: config.json asks for parameters the weights do not hold ({layers} "
                            f"layers, the weights hold {held}: {prefix}{held} and after are missing); does "
                            "num_hidden_layers in config.json match the weights?")
        raise UserError(f"{option} {folder}: the weights hold parameters config.json has no place for ({held} "
                        f"layers, config.json asks for {layers}: {prefix}{layers} and after); does "
                        "num_hidden_layers in config.json match the weights?")
    embedding = next(((name, shape) for name, shape in shapes.items() if name.endswith(_EMBEDDING_NAMES)), None)
    if embedding is not None and len(embedding[1]) == 2:
        # the input embedding's width: its own field where a type keeps one apart from the hidden size
        width = next((key for key in EMBEDDING_WIDTH_FIELDS if isinstance(getattr(config, key, None), int)),
                     "hidden_size")
        wanted = [getattr(config, "vocab_size", None), getattr(config, width, None)]
        if all(isinstance(w, int) for w in wanted) and wanted != embedding[1]:
            raise UserError(f"{option} {folder}: config.json and the weights disagree: {embedding[0]} is "
                            f"{'x'.join(map(str, embedding[1]))} in the weights, config.json makes it "
                            f"{'x'.join(map(str, wanted))} (was config.json edited or copied from another model?)")


def check_weights_match_config(folder: str | os.PathLike, config, option: str = "--model") -> None:
    """Weights that disagree with config.json (a hidden size or vocabulary edited, a config copied from another
    model) fail inside the loader after seconds of work: compare the shapes the config builds (on the meta
    device: no memory, no weights) with the shapes in the safetensors headers, and name the first mismatch."""
    folder = Path(folder)
    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        shapes.update({k: [int(d) for d in v["shape"]] for k, v in read_safetensors_header(path, option).items()})
    if not shapes or getattr(config, "auto_map", None):  # a trusted model's own classes: its loader checks
        return
    import torch

    from mirrorbert.safeguards.model_loading import model_from_config

    try:
        with torch.device("meta"):
            model = model_from_config(config, option=option)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  any error here means config.json does not describe a model
        raise UserError(f"{option} {folder}: config.json does not describe a model transformers can build: "
                        f"{first_line(exc)}") from None
    prefix = getattr(model, "base_model_prefix", "") or ""
    params = {name: list(p.shape) for name, p in model.named_parameters()}
    found: set[str] = set()
    for name, shape in params.items():
        key = name if name in shapes else f"{prefix}.{name}" if f"{prefix}.{name}" in shapes else None
        if key is None:
            continue
        found.add(key)
        if shape != shapes[key]:
            raise UserError(f"{option} {folder}: config.json and the weights disagree: {key} is "
                            f"{'x'.join(map(str, shapes[key]))} in the weights, config.json makes it "
                            f"{'x'.join(map(str, shape))} (was config.json edited or copied from another model?)")
    if not found:
        logger.debug("%s: no weight names in common with %s; shape check skipped", folder, type(model).__name__)
        return
    # Parameters the loader would fill with random numbers (config.json asks for more layers than the
    # weights hold) or silently drop (fewer): renamed norms (gamma/beta) and the unused pooler are not counted.
    missing = [n for n in params if n not in shapes and f"{prefix}.{n}" not in shapes and not _renamed_or_pooler(n)]
    tops = {n.split(".")[0] for n in params}
    unused = [k for k in shapes if k not in found and not _renamed_or_pooler(k)
              and (k.split(".")[0] in tops or (prefix and k.startswith(prefix + ".")))]
    if missing or unused:
        which, names = ("config.json asks for parameters the weights do not hold", missing) if missing else (
            "the weights hold parameters config.json has no place for", unused)
        raise UserError(f"{option} {folder}: {which} ({len(names)}, e.g. {names[0]}); does num_hidden_layers "
                        "or another size in config.json match the weights?")


def _renamed_or_pooler(name: str) -> bool:
    parts = name.split(".")
    module = parts[-2].lower() if len(parts) > 1 else ""
    return "pooler" in parts or parts[-1] in ("gamma", "beta", "position_ids") or module in (
        "layernorm", "layer_norm", "ln")


def check_weight_files(folder: str | os.PathLike, option: str = "--model") -> None:
    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.safetensors")):
        read_safetensors_header(path, option)
    for path in sorted(folder.glob("*.bin")) + [folder / "config.json"]:
        if path.exists() and not os.access(path, os.R_OK):
            raise UserError(f"{option}: {path}: permission denied (the file is not readable)")


def weights_load_error(name: str, exc: Exception, option: str = "--model") -> UserError | None:
    """The loader's own error for damaged weights, as one line; None if `exc` is not about the weights."""
    kind = type(exc).__name__
    if kind == "SafetensorError" or "safetensors" in type(exc).__module__:
        return UserError(f"{option} {name}: cannot read the weights (model.safetensors damaged or truncated: "
                         f"{first_line(exc)})")
    if isinstance(exc, PermissionError):
        return UserError(f"{option} {name}: permission denied: {exc.filename or first_line(exc)}")
    return None


def _load_failure(name: str, option: str, what: str, exc: Exception) -> UserError:
    detail = f"no entry {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())[:300] or type(exc).__name__
    if isinstance(exc, PermissionError):
        return UserError(f"{option} {name}: permission denied: {exc.filename or first_line(exc)}")
    if Path(name).is_dir():
        return UserError(f"{option} {name}: cannot read the {what} in this folder: {detail}")
    if isinstance(exc, (OSError, ValueError)):
        return UserError(str(model_load_error(name, exc)).replace("--model", option, 1))
    return UserError(f"{option} {name}: cannot read the {what}: {detail}")


def load_config(name: str, option: str = "--model", overrides: dict[str, Any] | None = None,
                trust_remote_code: bool = False):
    """AutoConfig of a folder or hub id; a config.json that is not JSON, or holds a value of the wrong type
    (`"hidden_size": "abc"`), is one error line naming the folder, not the loader's traceback. A folder that
    asks to run its own code is refused unless trusted (`model_loading`)."""
    from mirrorbert.safeguards.model_loading import load_config as load_config_checked

    try:
        return load_config_checked(name, trust_remote_code=trust_remote_code, option=option, **(overrides or {}))
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  transformers raises KeyError/TypeError/its own types for bad files
        raise _load_failure(name, option, "model configuration (config.json)", exc) from None


def load_tokenizer(name: str, option: str = "--model", trust_remote_code: bool = False):
    """AutoTokenizer of a folder or hub id; a damaged tokenizer file (`tokenizer.json` holding `{}`) is one
    error line naming the folder. A folder that asks to run its own code is refused unless trusted."""
    from mirrorbert.safeguards.model_loading import load_tokenizer as load_tokenizer_checked

    try:
        return load_tokenizer_checked(name, trust_remote_code=trust_remote_code, option=option)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  a damaged tokenizer.json raises KeyError/Exception in tokenizers
        raise _load_failure(name, option, "tokenizer files", exc) from None


# The options `inspect_model` names: the model, and a tokenizer taken from elsewhere (pretrain-mlm's --tokenizer).
MODEL_OPTION = "--model"
TOKENIZER_OPTION = "--tokenizer"


def inspect_model(name: str, max_length: int | None = None, max_length_option: str = "--max-length",
                  need_mask: bool = False, mask_option: str = "--mask-span", tokenizer_source: str | None = None,
                  config_overrides: dict[str, Any] | None = None, warn_decoder: bool = True,
                  trust_remote_code: bool = False) -> tuple[Any, Any]:
    """(config, tokenizer) of a model folder or hub id (`--model`), checked, without loading any weights.

    Raises UserError for: a folder without config.json or tokenizer files, a config.json or tokenizer file
    that does not load (bad JSON, a wrong type), weights whose shapes disagree with config.json, damaged
    weight files, an empty tokenizer, `max_length` beyond the model's positions, no mask token where masking is asked.
    `tokenizer_source`: the tokenizer's own folder or hub id (`--tokenizer`), where it is not the model's.
    Warns for a decoder-only model unless `warn_decoder` is False.
    """
    from mirrorbert.safeguards.model_loading import check_pickle_weights, check_remote_code

    option = MODEL_OPTION
    tokenizer_option = TOKENIZER_OPTION if tokenizer_source is not None else MODEL_OPTION
    folder = Path(name)
    if folder.is_dir():
        if not (folder / "config.json").exists():
            raise UserError(f"{option} {name}: folder has no config.json (not a Hugging Face model folder)")
        check_remote_code(name, trust_remote_code, option)  # before any file of the folder is loaded
        check_weight_files(folder, option)
        check_pickle_weights(folder, option)
        if tokenizer_source is None:
            check_tokenizer_files(folder, option)
    if tokenizer_source is not None:
        check_remote_code(tokenizer_source, trust_remote_code, tokenizer_option)
    check_model_reachable(name, trust_remote_code, option)
    config = load_config(name, option, config_overrides, trust_remote_code)
    tokenizer = load_tokenizer(tokenizer_source or name, tokenizer_option, trust_remote_code)
    check_config_sizes(folder, config, option)  # before anything is built from config.json
    if folder.is_dir():
        check_weights_match_config(folder, config, option)
    check_tokenizer(tokenizer, tokenizer_source or name, option)
    check_max_length(max_length, config, max_length_option, name)
    if need_mask and getattr(tokenizer, "mask_token_id", None) is None:
        raise UserError(f"{mask_option}: the tokenizer of {name} has no mask token; masking needs one "
                        "([MASK] or <mask>)")
    if warn_decoder:
        warn_if_decoder(config, name)
    return config, tokenizer
