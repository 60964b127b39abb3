"""The model and tokenizer an MLM pre-training run starts from: a named size or config JSON (from scratch), or
any Hugging Face masked LM (continued pre-training), each checked before its weights load."""

from __future__ import annotations

from pathlib import Path

from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.preflight import check_max_length, inspect_model, weights_load_error

# Named sizes of Turc et al. (2019), "Well-Read Students Learn Better"; heads = hidden / 64.
ARCHITECTURES: dict[str, dict[str, int]] = {
    "bert-tiny": {"num_hidden_layers": 2, "hidden_size": 128},
    "bert-mini": {"num_hidden_layers": 4, "hidden_size": 256},
    "bert-small": {"num_hidden_layers": 4, "hidden_size": 512},
    "bert-medium": {"num_hidden_layers": 8, "hidden_size": 512},
}
# Positions of the named sizes (BERT's); a longer --seq-length needs a config JSON that says so.
ARCHITECTURE_POSITIONS = 512


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from mirrorbert.safeguards.model_loading import load_tokenizer as load_tokenizer_checked

    if not Path(path).exists():
        raise UserError(f"--tokenizer {path}: no such folder")
    try:
        return load_tokenizer_checked(path, trust_remote_code=trust_remote_code, option="--tokenizer")
    except UserError:
        raise
    except (OSError, ValueError) as exc:
        first = first_line(exc)
        raise UserError(f"--tokenizer {path}: cannot load a tokenizer from this folder: {first}") from None


def architecture_config(architecture: str, tokenizer, seq_length: int):
    """A fresh config for a named size or a config JSON file, sized to the tokenizer's vocabulary."""
    from transformers import BertConfig

    from mirrorbert.safeguards.model_loading import config_for_model

    if architecture in ARCHITECTURES:
        size = ARCHITECTURES[architecture]
        hidden = size["hidden_size"]
        config = BertConfig(
            hidden_size=hidden, num_hidden_layers=size["num_hidden_layers"], num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden, max_position_embeddings=ARCHITECTURE_POSITIONS,
        )
    else:
        path = Path(architecture)
        if not path.is_file():
            raise UserError(
                f"--architecture {architecture}: not a named size ({', '.join(ARCHITECTURES)}) nor a config JSON file"
            )
        from mirrorbert.safeguards.readback import parse_json, read_regular_bytes

        values = parse_json(read_regular_bytes(path, "--architecture", 16 << 20), "--architecture", path)
        if not isinstance(values, dict):
            raise UserError(f"--architecture {path}: expected a JSON object of config fields")
        values = {k: v for k, v in values.items() if k not in ("architectures", "transformers_version")}
        model_type = values.pop("model_type", "bert")
        try:
            config = config_for_model(model_type, **values)
        except (ValueError, TypeError) as exc:
            raise UserError(f"--architecture {path}: {exc}") from None
    # before any weight is allocated: a sequence longer than the positions cannot run at all
    check_max_length(seq_length, config, "--seq-length", f"--architecture {architecture}")
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if tokenizer.bos_token_id is not None:
        config.bos_token_id = tokenizer.bos_token_id
    if tokenizer.eos_token_id is not None:
        config.eos_token_id = tokenizer.eos_token_id
    return config


def build_model(cfg):
    """(model, tokenizer, description) for a fresh architecture or a pretrained MLM."""
    from mirrorbert.safeguards.model_loading import load_model, model_from_config

    if cfg.architecture is not None:
        tokenizer = load_tokenizer(cfg.tokenizer, cfg.trust_remote_code)
        config = architecture_config(cfg.architecture, tokenizer, cfg.seq_length)
        try:
            model = model_from_config(config, "AutoModelForMaskedLM", trust_remote_code=cfg.trust_remote_code,
                                      option=f"--architecture {cfg.architecture}")
        except UserError:
            raise
        except ValueError as exc:
            raise UserError(f"--architecture {cfg.architecture}: no masked-LM head for this config ({exc})") from None
        return model, tokenizer, f"{cfg.architecture} (from scratch)"
    from mirrorbert.safeguards.preflight import check_model_reachable, model_load_error

    name = cfg.model
    if Path(name).is_dir() and not (Path(name) / "config.json").exists():
        raise UserError(f"--model {name}: folder has no config.json (not a Hugging Face model folder)")
    # config, tokenizer, weight-file headers and --seq-length first: cheap, and before the weights load
    config, _ = inspect_model(name, max_length=cfg.seq_length, max_length_option="--seq-length", need_mask=True,
                              mask_option="--model", tokenizer_source=cfg.tokenizer,
                              trust_remote_code=cfg.trust_remote_code)
    from mirrorbert.encoder.architectures import check_supported

    check_supported(config, name)
    check_model_reachable(name, cfg.trust_remote_code)
    try:
        model = load_model(name, "AutoModelForMaskedLM", trust_remote_code=cfg.trust_remote_code)
        tokenizer = load_tokenizer(cfg.tokenizer, cfg.trust_remote_code) if cfg.tokenizer else \
            _auto_tokenizer(name, cfg.trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  damaged weights raise safetensors' own error type
        error = weights_load_error(name, exc) or (
            model_load_error(name, exc) if isinstance(exc, (OSError, ValueError)) else None)
        if error is None:
            raise
        raise error from None
    embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embeddings:
        raise UserError(
            f"--tokenizer: {len(tokenizer)} tokens but the model {name} has only {embeddings} embeddings"
        )
    return model, tokenizer, name


def _auto_tokenizer(name: str, trust_remote_code: bool = False):
    from mirrorbert.safeguards.model_loading import load_tokenizer as load_tokenizer_checked

    return load_tokenizer_checked(name, trust_remote_code=trust_remote_code)
