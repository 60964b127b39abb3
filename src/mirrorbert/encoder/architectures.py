"""What some encoder types need beyond the generic path, applied wherever a model is loaded or a precision
chosen: the precision a type can run in (`REDUCED_PRECISION`), the preparation every loaded model passes
(`prepare_model`), the one length a type takes and the types refused before loading. The facts per type:
docs/guide/architectures.md.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from mirrorbert.compat import transformers_takes_4d_mask
from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class ReducedPrecision:
    """What a type needs under bf16/fp16 autocast: `fp32` (it runs in fp32, `reason` says why) or `cast` (a cast
    at the source, installed by `prepare_model`, lets it run in the precision asked)."""

    action: str
    reason: str
    devices: tuple[str, ...] = ("cpu", "cuda", "mps")  # where the rule applies


REDUCED_PRECISION = {
    "deberta": ReducedPrecision("fp32", "its attention fills masked scores with float32's minimum, which bf16 and "
                                        "fp16 cannot hold"),
    "xmod": ReducedPrecision("cast", "its language adapters write half-precision output into a float32 buffer; "
                                     "each adapter's output is cast back to its input's type"),
    "yoso": ReducedPrecision("fp32", "its CUDA attention is a custom autograd function whose backward mixes "
                                     "float32 and half-precision tensors", devices=("cuda",)),
}
_told: "weakref.WeakKeyDictionary[torch.nn.Module, set[str]]" = weakref.WeakKeyDictionary()


def model_type_of(model_or_config: Any) -> str:
    config = getattr(model_or_config, "config", model_or_config)
    return str(getattr(config, "model_type", "") or "")


def usable_precision(model: torch.nn.Module, precision: str, device: torch.device | str | None = None) -> str:
    """`precision`, or fp32 for a type that cannot run in bf16/fp16 on `device` (the model's own device when not
    given), saying so once per model."""
    kind = model_type_of(model)
    need = REDUCED_PRECISION.get(kind)
    if device is None:
        device = next(iter(model.parameters()), torch.empty(0)).device
    where = torch.device(device).type
    if precision in ("bf16", "fp16") and need is not None and need.action == "fp32" and where in need.devices:
        told = _told.setdefault(model, set())
        if precision not in told:
            told.add(precision)
            logger.info("precision %s -> fp32 for %s: %s", precision, kind, need.reason)
        return "fp32"
    return precision


def fixed_length(model: torch.nn.Module) -> int | None:
    """The one sequence length a model takes (Nyströmformer's landmark attention), or None: any length."""
    if model_type_of(model) != "nystromformer":
        return None
    return _landmark_length(model.config)


def check_supported(config: Any, name: str, option: str = "--model") -> None:
    """Refuse, before any weight is read, a model that cannot encode strings of different lengths here."""
    if model_type_of(config) == "nystromformer" and _landmark_length(config) and transformers_takes_4d_mask():
        raise UserError(f"{option} {name}: Nystromformer's landmark attention (num_landmarks {config.num_landmarks} < "
                        f"segment_means_seq_len {config.segment_means_seq_len}) takes no padding mask on transformers "
                        "5 (the mask cannot broadcast over the landmarks), so padded strings would attend to padding; "
                        "not supported")


def _landmark_length(config: Any) -> int | None:
    length, landmarks = getattr(config, "segment_means_seq_len", None), getattr(config, "num_landmarks", None)
    return int(length) if isinstance(length, int) and length != landmarks else None


class NoPooler(torch.nn.Module):
    """Stands where a model's pooler head was: no parameters, hands back what it is given (SqueezeBERT calls
    its pooler without checking for one, ALBERT applies tanh to what it returns); nothing here reads it."""

    def forward(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden


def prepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Settings a loaded model of some types needs before it can encode any string (see the module doc); the
    one preparation of every model, whatever it was loaded from (encoder/source.py). Idempotent."""
    kind = model_type_of(model)
    if kind == "xmod":
        _default_language(model)
        _cast_adapter_outputs(model)
    elif kind == "roformer":
        _freeze_sinusoids(model)
    return model


def _cast_adapter_outputs(model: torch.nn.Module) -> None:
    """Each X-MOD adapter's output in its input's type (under autocast its Linear layers return bf16/fp16,
    which X-MOD writes into a float32 buffer)."""
    for module in model.modules():
        if type(module).__name__ == "XmodAdapter" and not getattr(module, "_mirrorbert_cast", False):
            module.register_forward_hook(lambda adapter, inputs, output: output.to(inputs[0].dtype))
            module._mirrorbert_cast = True


def _freeze_sinusoids(model: torch.nn.Module) -> None:
    """RoFormer's sinusoid table (its rotary angles), which transformers 5 loads as a trainable weight, kept out
    of training: trained, it would stop being a function of the distance alone."""
    for name, module in model.named_modules():
        if name.endswith("embed_positions") and isinstance(getattr(module, "weight", None), torch.nn.Parameter):
            module.weight.requires_grad_(False)


def _default_language(model: torch.nn.Module) -> None:
    config = model.config
    languages = list(getattr(config, "languages", None) or [])
    if getattr(config, "default_language", None) or not languages:
        return
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    setter = getattr(base, "set_default_language", None) or getattr(model, "set_default_language", None)
    if setter is None:
        return
    setter(languages[0])
    config.default_language = languages[0]
    logger.info("X-MOD: config.json names no default_language; using its first language adapter, %s "
                "(set default_language in config.json to choose another)", languages[0])


__all__ = ["REDUCED_PRECISION", "ReducedPrecision", "NoPooler", "check_supported", "fixed_length", "model_type_of",
           "prepare_model", "usable_precision"]
