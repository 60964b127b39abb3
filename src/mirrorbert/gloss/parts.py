"""A GR-BERT checkpoint's model folder: every encoder a resumed run needs (the context encoder or two, the gloss
encoder), written and read back only inside the checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from mirrorbert.encoder.masked_lm import load_masked_lm
from mirrorbert.errors import UserError, first_line
from mirrorbert.gloss.config import GlossPretrainConfig
from mirrorbert.gloss.model import GlossRegularizedMLM
from mirrorbert.mlm.models import load_mlm
from mirrorbert.training.checkpoints import checkpoint_folder

GLOSS_ENCODER = "gloss_encoder.safetensors"


def save_parts(model, tokenizer, folder: Path) -> None:
    """Everything a resumed run needs: every encoder, not just the inference one."""
    folder.mkdir(parents=True, exist_ok=True)
    model.context.save_pretrained(folder / "context")
    tokenizer.save_pretrained(folder / "context")
    if model.context2 is not None:
        model.context2.save_pretrained(folder / "context2")
    save_file({k: v.detach().to("cpu").contiguous() for k, v in model.gloss_encoder.state_dict().items()},
              str(folder / GLOSS_ENCODER))


def load_parts(folder: Path, cfg: GlossPretrainConfig):
    option, trust = f"--resume {folder.parent}:", cfg.trust_remote_code
    ck = _checkpoint(folder)
    context = ck.subfolder(f"{folder.name}/context")  # the encoders' folders inside the checkpoint, never a link out
    tok, mlm = load_masked_lm(str(context.root), trust, option)
    model = GlossRegularizedMLM.from_mlm(mlm, arch=cfg.arch, lam=cfg.lam, tau=cfg.tau)
    if cfg.arch == "sc":
        if not ck.is_dir(f"{folder.name}/context2"):
            raise UserError(f"--resume {folder.parent}: checkpoint has no enc2 (was it written with --arch mt?)")
        model.context2 = load_mlm(str(ck.subfolder(f"{folder.name}/context2").root), option, trust)
    model.gloss_encoder.load_state_dict(_gloss_encoder_state(folder))
    return tok, model


def _checkpoint(folder: Path):
    """The confined reader of the checkpoint holding the parts folder `folder` (`step-N/model`)."""
    return checkpoint_folder(folder.parent, f"--resume {folder.parent}:")


def _gloss_encoder_state(folder: Path) -> dict[str, Any]:
    """The gloss encoder's weights of a checkpoint (safetensors), read only inside the checkpoint folder, a
    regular file."""
    option, ck = f"--resume {folder.parent}", _checkpoint(folder)
    if ck.exists(f"{folder.name}/{GLOSS_ENCODER}"):
        with ck.library_path(f"{folder.name}/{GLOSS_ENCODER}") as checked:
            try:
                return load_file(str(checked), device="cpu")
            except Exception as exc:  # noqa: BLE001  safetensors raises its own error type
                raise UserError(f"{option}: {folder / GLOSS_ENCODER} cannot be read ({first_line(exc)})") from None
    raise UserError(f"{option}: checkpoint is incomplete: {folder / GLOSS_ENCODER} is missing")


def cpu_state(module) -> dict[str, Any]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
