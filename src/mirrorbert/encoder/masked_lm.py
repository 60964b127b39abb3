"""A masked LM's own head: where a character span's tokens are, and forward passes that predict only there.

GR-BERT's training and the lexical-substitution evaluation both read a word's span out of a masked LM;
they share these helpers from here, below both.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from mirrorbert.errors import UserError
from mirrorbert.safeguards.preflight import max_positions


def require_fast_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("GR-BERT needs a fast (Rust) tokenizer to locate target words; this model's tokenizer is not one")
    if getattr(tokenizer, "mask_token_id", None) is None:
        raise UserError("the tokenizer has no mask token; GR-BERT's MLM objective needs one")


def span_token_positions(offsets: Sequence[tuple[int, int]], special: Sequence[int], start: int, end: int) -> list[int]:
    """Token indices whose character offsets overlap ``[start, end)`` (special tokens excluded)."""
    return [
        i for i, (s, e) in enumerate(offsets)
        if not special[i] and e > s and s < end and e > start
    ]


def model_max_length(model: nn.Module, tokenizer=None) -> int:
    """The longest input the model takes: its usable positions (`max_positions`) or the tokenizer's own limit,
    whichever is less (512 when neither gives one)."""
    tok_limit = getattr(tokenizer, "model_max_length", None)
    limits = [max_positions(getattr(model, "config", None))]
    limits += [tok_limit] if isinstance(tok_limit, int) and 0 < tok_limit < 100_000 else []
    return min((n for n in limits if n is not None), default=512)


def lm_head_of(mlm: nn.Module) -> nn.Module | None:
    """The LM head of BERT- or RoBERTa-family masked LMs (None: fall back to a full forward)."""
    for name in ("cls", "lm_head"):
        head = getattr(mlm, name, None)
        if isinstance(head, nn.Module):
            return head
    return None


def mlm_forward(mlm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                predict: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Last hidden states [B, L, H] and LM logits at the ``predict`` positions only ([N, V])."""
    head = lm_head_of(mlm)
    if head is not None:
        hidden = mlm.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = head(hidden[predict]) if predict is not None else None
        return hidden, logits
    out = mlm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return out.hidden_states[-1], (out.logits[predict] if predict is not None else None)


def span_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` [B, L, H] over the True positions of ``mask`` [B, L]."""
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def load_masked_lm(name: str, trust_remote_code: bool = False, option: str = "--model"):
    """(tokenizer, model) of a masked LM to start from, opened and checked once (`encoder.source.open_model`):
    the folder's config, tokenizer and weight headers and the type's support before the weights load."""
    from mirrorbert.encoder.source import open_model

    with open_model(name, option=option, trust_remote_code=trust_remote_code) as handle:
        handle.need_mask(option)
        return handle.tokenizer(), handle.load("AutoModelForMaskedLM")
