"""Cheap checks of names and values before the expensive work: a model name that is no folder and no reachable
Hub id, a file that cannot be read, a length beyond a model's positions. Nothing here imports torch or
transformers."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import open_regular

# Models whose position ids start after the padding index, so pad_token_id + 1 positions are unusable.
OFFSET_POSITION_MODEL_TYPES = ("roberta", "xlm-roberta", "camembert", "longformer")
# Decoder-only families: Mirror-BERT expects a bidirectional encoder; these still run but pool poorly.
DECODER_MODEL_TYPES = (
    "gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "llama", "mistral", "mixtral", "qwen2", "qwen3",
    "opt", "bloom", "falcon", "phi", "phi3", "gemma", "gemma2", "codegen", "ctrl", "xglm", "olmo",
)

# What a Hugging Face Hub id looks like: `name` or `org/name`, of letters, digits, `.`, `_` and `-`.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def looks_like_path(name: str) -> bool:
    """Whether a model name means a folder rather than a Hub id (`name` or `org/name`): it starts with `.`, `/`
    or `~`, ends with a separator, has more than one slash or a character no Hub id has, or its first part is a
    local folder."""
    if name.startswith((".", "/", "~")) or name.endswith(("/", os.sep)) or name.count("/") > 1:
        return True
    if not _HUB_ID.fullmatch(name):
        return True
    head, slash, _ = name.partition("/")
    return bool(slash) and os.path.isdir(head)


def check_model_exists(name: str, option: str = "--model") -> None:
    """A path-looking model name that is not there, or a non-folder where a model folder belongs: one line."""
    if os.path.lexists(name) and not os.path.isdir(name):
        raise UserError(f"{option} {name}: not a folder (a model is a folder of config, tokenizer and weight "
                        "files, or a Hugging Face hub id)")
    if not os.path.lexists(name) and looks_like_path(name):
        raise UserError(f"{option} {name}: no such folder")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub answers a TCP connection within `timeout` seconds (False under HF_HUB_OFFLINE)."""
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


def check_model_reachable(name: str, option: str = "--model") -> None:
    """A name that is neither a local folder nor in the local Hugging Face cache needs the Hub: one line when it
    is unreachable (`check_model_exists` first)."""
    check_model_exists(name, option)
    if Path(name).exists():
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # cached earlier: loads offline
    except Exception:  # noqa: BLE001  not a valid repository id: the load words it
        pass
    if not hub_reachable():
        raise UserError(
            f"{option} {name}: not a local folder and the Hugging Face hub is unreachable from this machine; "
            f"{option} also takes a local folder holding a saved model (e.g. {option} path/to/model)"
        )


def check_readable(path: str | os.PathLike, option: str) -> Path:
    """An existing, readable regular file (`readback.open_regular`), or one error line naming the option and file."""
    os.close(open_regular(Path(path), option))
    return Path(path)


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
