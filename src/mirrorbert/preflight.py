"""Cheap checks of inputs before the expensive work: model folders, tokenizers, lengths, readable files.

Why a module of its own: loading weights takes seconds to minutes and a wrong `--max-length` used to
crash mid-run, so every command reads the small files (config.json, tokenizer files, the safetensors
header) first and refuses a bad input with one `UserError` line before any weights are loaded.
Nothing here imports torch; transformers is imported only when a config or tokenizer is read.
"""

from __future__ import annotations

import json
import logging
import os
import struct
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


def model_load_error(name: str, exc: Exception) -> UserError:
    if Path(name).exists():
        first = first_line(exc)
        return UserError(f"--model {name}: cannot load the model in this folder: {first}")
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


def check_model_reachable(name: str) -> None:
    """A name that is neither a local folder nor in the local HF cache needs the hub: fail fast if offline."""
    if Path(name).exists():
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name, local_files_only=True)
        return  # cached earlier: loads offline
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise UserError(
            f"--model {name}: not a local folder and the Hugging Face hub is unreachable from this machine; "
            "--model also takes a local folder holding a saved model (e.g. --model path/to/model)"
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


def check_tokenizer(tokenizer, name: str, option: str = "--model") -> None:
    """A folder without tokenizer files loads as a 5-token tokenizer that maps every word to [UNK]."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if len(tokenizer) - len(special) < MIN_REAL_TOKENS:
        raise UserError(f"{option} {name}: the tokenizer is empty ({len(tokenizer)} tokens); the folder needs "
                        f"its tokenizer files (one of {', '.join(TOKENIZER_FILES[:4])}, ...)")


def check_tokenizer_files(folder: Path, option: str = "--model") -> None:
    if folder.is_dir() and not any((folder / f).exists() for f in TOKENIZER_FILES):
        raise UserError(f"{option} {folder}: no tokenizer files in this folder (expected one of "
                        f"{', '.join(TOKENIZER_FILES[:4])}, ...)")


def check_safetensors(path: Path, option: str = "--model") -> None:
    """Header-only integrity check: the data the header promises must be in the file (a truncated
    download or copy fails here, in milliseconds, instead of inside the loader)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(n).decode("utf-8"))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except PermissionError:
        raise UserError(f"{option}: {path}: permission denied (the file is not readable)") from None
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise UserError(f"{option}: {path} is damaged (not a valid safetensors file: {first_line(exc)})") from None
    if 8 + n + end > size:
        raise UserError(f"{option}: {path} is truncated ({size} bytes, its header needs {8 + n + end}); "
                        "copy or download it again")


def check_weight_files(folder: str | os.PathLike, option: str = "--model") -> None:
    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors(path, option)
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


def inspect_model(name: str, option: str = "--model", max_length: int | None = None,
                  max_length_option: str = "--max-length", need_mask: bool = False,
                  mask_option: str = "--mask-span", tokenizer_source: str | None = None) -> tuple[Any, Any]:
    """(config, tokenizer) of a model folder or hub id, checked, without loading any weights.

    Raises UserError for: a folder without config.json or tokenizer files, damaged weight files, an
    empty tokenizer, `max_length` beyond the model's positions, no mask token where masking is asked.
    Warns once for a decoder-only model.
    """
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(name)
    if folder.is_dir():
        if not (folder / "config.json").exists():
            raise UserError(f"{option} {name}: folder has no config.json (not a Hugging Face model folder)")
        check_weight_files(folder, option)
        if tokenizer_source is None:
            check_tokenizer_files(folder, option)
    check_model_reachable(name)
    try:
        config = AutoConfig.from_pretrained(name)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source or name)
    except PermissionError as exc:
        raise UserError(f"{option} {name}: permission denied: {exc.filename or first_line(exc)}") from None
    except (OSError, ValueError) as exc:
        error = model_load_error(name, exc)
        raise UserError(str(error).replace("--model", option, 1)) from None
    check_tokenizer(tokenizer, tokenizer_source or name, option)
    check_max_length(max_length, config, max_length_option, name)
    if need_mask and getattr(tokenizer, "mask_token_id", None) is None:
        raise UserError(f"{mask_option}: the tokenizer of {name} has no mask token; masking needs one "
                        "([MASK] or <mask>)")
    warn_if_decoder(config, name)
    return config, tokenizer
