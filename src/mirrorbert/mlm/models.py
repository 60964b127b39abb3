"""The model and tokenizer an MLM pre-training run starts from: a named size or config JSON (from scratch), or
any Hugging Face masked LM (continued pre-training), each checked before its weights load."""

from __future__ import annotations

from pathlib import Path

from mirrorbert.encoder.source import config_for_model, fresh_model, open_model
from mirrorbert.errors import UserError
from mirrorbert.safeguards.preflight import check_max_length

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
    """The tokenizer of a tokenizer folder (`--tokenizer`), checked like a model's."""
    with open_model(path, option="--tokenizer", trust_remote_code=trust_remote_code, need_config=False) as handle:
        return handle.tokenizer()


def architecture_config(architecture: str, tokenizer, seq_length: int):
    """A fresh config for a named size or a config JSON file, sized to the tokenizer's vocabulary."""
    from transformers import BertConfig

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


def build_model(cfg, resume_model: str | None = None, resume_option: str = "--resume"):
    """(model, tokenizer, description) for a fresh architecture or a pretrained MLM; when resuming, the model
    is the checkpoint's (`resume_model`), opened and prepared as any other."""
    trust = cfg.trust_remote_code
    if cfg.architecture is not None:
        tokenizer = load_tokenizer(cfg.tokenizer, trust)
        config = architecture_config(cfg.architecture, tokenizer, cfg.seq_length)
        description = f"{cfg.architecture} (from scratch)"
        if resume_model is not None:
            return load_mlm(resume_model, resume_option, trust), tokenizer, description
        try:
            model = fresh_model(config, "AutoModelForMaskedLM", trust_remote_code=trust,
                                option=f"--architecture {cfg.architecture}")
        except UserError:
            raise
        except ValueError as exc:
            raise UserError(f"--architecture {cfg.architecture}: no masked-LM head for this config ({exc})") from None
        return model, tokenizer, description
    with open_model(cfg.model, trust_remote_code=trust, need_tokenizer=cfg.tokenizer is None) as start:
        start.check_max_length(cfg.seq_length, "--seq-length")
        tokenizer = load_tokenizer(cfg.tokenizer, trust) if cfg.tokenizer else start.tokenizer()
        if tokenizer.mask_token_id is None:
            raise UserError(f"--model: the tokenizer of {cfg.model} has no mask token; masking needs one "
                            "([MASK] or <mask>)")
        start.warn_if_decoder()
        model = load_mlm(resume_model, resume_option, trust) if resume_model else start.load("AutoModelForMaskedLM")
    embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embeddings:
        raise UserError(f"--tokenizer: {len(tokenizer)} tokens but the model {cfg.model} has only {embeddings} "
                        "embeddings")
    return model, tokenizer, cfg.model


def load_mlm(folder: str, option: str, trust_remote_code: bool):
    """The masked LM saved in `folder` (a checkpoint's, or a best model), opened, checked and prepared."""
    with open_model(folder, option=option, trust_remote_code=trust_remote_code, need_tokenizer=False) as saved:
        return saved.load("AutoModelForMaskedLM")
