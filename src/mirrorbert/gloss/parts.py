"""A GR-BERT checkpoint's model folder: every encoder a resumed run needs (the context encoder or two, the gloss
encoder), written and read back only inside the checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.gloss.config import GlossPretrainConfig

GLOSS_ENCODER = "gloss_encoder.safetensors"
LEGACY_GLOSS_ENCODER = "gloss_encoder.pt"  # older mirrorbert: a pickle, read with weights_only=True only


def save_parts(model, tokenizer, folder: Path) -> None:
    """Everything a resumed run needs: every encoder, not just the inference one."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.context.save_pretrained(folder / "context")
    tokenizer.save_pretrained(folder / "context")
    if model.context2 is not None:
        model.context2.save_pretrained(folder / "context2")
    save_file({k: v.detach().to("cpu").contiguous() for k, v in model.gloss_encoder.state_dict().items()},
              str(folder / GLOSS_ENCODER))


def load_parts(folder: Path, cfg: GlossPretrainConfig):
    from mirrorbert.gloss.model import GlossRegularizedMLM
    from mirrorbert.safeguards.model_loading import load_model, load_tokenizer

    option, trust = f"--resume {folder.parent}:", cfg.trust_remote_code
    ck = _checkpoint(folder)
    ck.subfolder(f"{folder.name}/context")  # the encoders' folders inside the checkpoint, never a link out
    tok = load_tokenizer(folder / "context", trust_remote_code=trust, option=option)
    model = GlossRegularizedMLM.from_mlm(load_model(folder / "context", "AutoModelForMaskedLM",
                                                    trust_remote_code=trust, option=option),
                                         arch=cfg.arch, lam=cfg.lam, tau=cfg.tau)
    if cfg.arch == "sc":
        if not ck.is_dir(f"{folder.name}/context2"):
            raise UserError(f"--resume {folder.parent}: checkpoint has no enc2 (was it written with --arch mt?)")
        ck.subfolder(f"{folder.name}/context2")
        model.context2 = load_model(folder / "context2", "AutoModelForMaskedLM", trust_remote_code=trust,
                                    option=option)
    model.gloss_encoder.load_state_dict(_gloss_encoder_state(folder))
    return tok, model


def _checkpoint(folder: Path):
    """The confined reader of the checkpoint holding the parts folder `folder` (`step-N/model`)."""
    from mirrorbert.training.checkpoints import checkpoint_folder

    return checkpoint_folder(folder.parent, f"--resume {folder.parent}:")


def _gloss_encoder_state(folder: Path) -> dict[str, Any]:
    """The gloss encoder's weights of a checkpoint: safetensors, or an older `.pt` read without running code;
    either only inside the checkpoint folder, a regular file."""
    import torch

    from mirrorbert.errors import first_line
    from mirrorbert.training.state_format import load_legacy_pt

    option, ck = f"--resume {folder.parent}", _checkpoint(folder)
    if ck.exists(f"{folder.name}/{GLOSS_ENCODER}"):
        from safetensors.torch import load_file

        real = ck.check_file(f"{folder.name}/{GLOSS_ENCODER}")
        try:
            return load_file(str(real), device="cpu")
        except Exception as exc:  # noqa: BLE001  safetensors raises its own error type
            raise UserError(f"{option}: {folder / GLOSS_ENCODER} cannot be read ({first_line(exc)})") from None
    if ck.exists(f"{folder.name}/{LEGACY_GLOSS_ENCODER}"):
        state = load_legacy_pt(ck.check_file(f"{folder.name}/{LEGACY_GLOSS_ENCODER}"), option,
                               shown=folder / LEGACY_GLOSS_ENCODER)
        if isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
            return state
        raise UserError(f"{option}: {folder / LEGACY_GLOSS_ENCODER} does not hold a gloss encoder's weights")
    raise UserError(f"{option}: checkpoint is incomplete: {folder / GLOSS_ENCODER} is missing")


def cpu_state(module) -> dict[str, Any]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
