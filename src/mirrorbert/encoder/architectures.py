"""What some encoder types need beyond the generic path, in one place.

"Any masked LM" holds for every encoder type transformers builds as a masked LM
(tests/encoder/test_architectures.py trains, encodes, saves and reloads a tiny one of each). A few types need
a word here, applied wherever a model is loaded or a precision chosen:

* precision (`REDUCED_PRECISION`): what a type needs under bf16 and fp16 autocast, decided once per model
  (`usable_precision`) and recorded as the precision a run used. DeBERTa (v1) fills masked attention scores
  with float32's minimum even under autocast, which bf16 and fp16 cannot hold: it runs in fp32, with one info
  line. X-MOD's language adapters write their half-precision output into a float32 buffer: a hook casts each
  adapter's output back to its input's type, so it runs in the precision asked;
* X-MOD picks a language adapter per input; a config without `default_language` gets its first language
  (one info line), so strings without a language tag still encode;
* Nyströmformer's landmark attention reshapes queries by its configured sequence length, so every batch is
  padded to exactly that length; on transformers 5 that attention cannot take a padding mask at all, so a
  model using it (fewer landmarks than positions) is refused before loading, saying why;
* RoFormer's sinusoid table (its rotary angles) is a constant: kept out of training;
* SqueezeBERT calls its pooler unconditionally: the pooler taken out of the model (no pooling here uses
  it) is replaced by a module without weights that hands back its input, not by None.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch

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
FP32_ONLY = {kind: need.reason for kind, need in REDUCED_PRECISION.items() if need.action == "fp32"}
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
            logger.info("precision %s -> fp32 for %s: %s", precision, kind, FP32_ONLY[kind])
        return "fp32"
    return precision


def fixed_length(model: torch.nn.Module) -> int | None:
    """The one sequence length a model takes (Nyströmformer's landmark attention), or None: any length."""
    if model_type_of(model) != "nystromformer":
        return None
    return _landmark_length(model.config)


def unsupported_reason(config: Any) -> str | None:
    """Why a model of this config cannot encode strings of different lengths here, or None."""
    from mirrorbert.compat import transformers_takes_4d_mask

    if model_type_of(config) == "nystromformer" and _landmark_length(config) and transformers_takes_4d_mask():
        return (f"Nystromformer's landmark attention (num_landmarks {config.num_landmarks} < segment_means_seq_len "
                f"{config.segment_means_seq_len}) takes no padding mask on transformers 5 (the mask cannot broadcast "
                "over the landmarks), so padded strings would attend to padding; not supported")
    return None


def check_supported(config: Any, name: str, option: str = "--model") -> None:
    """Refuse, before any weight is read, a model this version cannot run (`unsupported_reason`)."""
    reason = unsupported_reason(config)
    if reason is not None:
        from mirrorbert.errors import UserError

        raise UserError(f"{option} {name}: {reason}")


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
            module.register_forward_hook(_same_type_as_input)
            module._mirrorbert_cast = True


def _same_type_as_input(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.to(inputs[0].dtype)


def _freeze_sinusoids(model: torch.nn.Module) -> None:
    """RoFormer's rotary angles come from a fixed sinusoid table, which transformers 5 loads as a trainable
    weight; trained, it would stop being a function of the distance alone (and packed rows, which look it
    up by column, would train other rows of it than padded ones)."""
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


__all__ = ["FP32_ONLY", "REDUCED_PRECISION", "ReducedPrecision", "NoPooler", "check_supported", "fixed_length", "unsupported_reason", "model_type_of", "prepare_model", "usable_precision"]
