"""Dropout as the source of the two views' difference: the config rates of any encoder, and DropHead
(per-example attention-head dropout on BERT-style self-attention; one mask per view, packed or padded).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

from mirrorbert.errors import UserError

# Config attributes that carry dropout probabilities, as the Hugging Face encoder families name them.
DROPOUT_CONFIG_KEYS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "hidden_dropout",
    "attention_dropout",
    "dropout",
    "activation_dropout",
    "embd_pdrop",
    "resid_pdrop",
    "attn_pdrop",
    "embedding_dropout",
    "mlp_dropout",
)


def dropout_overrides(config, p: float) -> dict[str, float]:
    """The config fields to set so that every dropout layer of this architecture uses probability p."""
    found = {key: p for key in DROPOUT_CONFIG_KEYS if isinstance(getattr(config, key, None), (int, float))}
    if not found:
        raise UserError(
            f"--dropout: cannot find the dropout settings of model type {getattr(config, 'model_type', '?')!r} "
            f"(looked for {', '.join(DROPOUT_CONFIG_KEYS)})"
        )
    return found


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Self-attention blocks whose output is the concatenation of per-head contexts (BERT-like layout)."""
    found = []
    for module in model.modules():
        heads = getattr(module, "num_attention_heads", None)
        size = getattr(module, "attention_head_size", None)
        if isinstance(heads, int) and isinstance(size, int) and type(module).__name__.endswith("SelfAttention"):
            found.append(module)
    return found


# Which view each token of the running forward pass belongs to, set by packed execution (several views
# per row); None means one view per row (padded execution).
_HEAD_GROUPS: ContextVar[tuple[torch.Tensor, int] | None] = ContextVar("mirrorbert_drophead_groups", default=None)


@contextmanager
def drophead_groups(view_of_token: torch.Tensor, n_views: int) -> Iterator[None]:
    """Make DropHead draw one head mask per view: `view_of_token` is (rows, length), -1 for padding."""
    token = _HEAD_GROUPS.set((view_of_token, n_views))
    try:
        yield
    finally:
        _HEAD_GROUPS.reset(token)


class DropHead:
    """Drop whole attention heads per example (Zhou et al. 2020), rescaling the kept ones by 1/(1-p), in
    training mode only; packed, one mask per view (the padded batch's draws, in its order)."""

    def __init__(self, model: torch.nn.Module, p: float):
        self.p = p
        self.handles = []
        modules = _attention_modules(model)
        if not modules:
            model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
            raise UserError(
                f"--drophead is not supported for model type {model_type!r} "
                "(supported: BERT-style self-attention, e.g. BERT, RoBERTa, XLM-R, ELECTRA)"
            )
        for module in modules:
            self.handles.append(module.register_forward_hook(self._hook))

    def _hook(self, module, inputs, output):
        if not module.training or self.p <= 0:
            return output
        context = output[0] if isinstance(output, tuple) else output
        batch, length, width = context.shape
        heads = module.num_attention_heads
        groups = _HEAD_GROUPS.get()
        n_views = batch if groups is None else groups[1]
        keep = torch.full((n_views, 1, heads, 1), 1.0 - self.p, device=context.device, dtype=context.dtype)
        mask = torch.bernoulli(keep) / (1.0 - self.p)
        if groups is not None:  # (views, heads) -> (rows, length, heads, 1); padding keeps its heads
            per_view = torch.cat([mask.view(n_views, heads), mask.new_ones(1, heads)])
            view_of_token = groups[0].masked_fill(groups[0] < 0, n_views)
            mask = per_view[view_of_token].unsqueeze(-1)
        dropped = (context.view(batch, length, heads, width // heads) * mask).view(batch, length, width)
        return (dropped, *output[1:]) if isinstance(output, tuple) else dropped

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
