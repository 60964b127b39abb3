"""Padding-free execution layouts: packed rows (several views share one row, each attending only to its own
tokens, positions restarting per view) and length groups (small padded batches of similar lengths, for models
that cannot be packed). Either equals padded execution up to float rounding (tests/encoder/test_packing.py);
why and how: docs/design.md, "Packed rows and length groups".
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from mirrorbert.compat import installed_version, transformers_takes_4d_mask
from mirrorbert.settings.choices import PACKING_MODES
from mirrorbert.errors import UserError
from mirrorbert.encoder.pooling import needs_hidden_states, pool_views
from mirrorbert.encoder.dropout import drophead_groups

logger = logging.getLogger(__name__)

ROW_BUDGET = 128  # tokens per packed row (docs/design.md, "Packed rows and length groups")

@dataclass(frozen=True)
class PackingRecipe:
    """How one model type takes a packed row (proven per type in tests/encoder/test_packing.py).

    `positions`: "zero" or "after_pad" (ids restart per view at 0 or padding_idx + 1), or "relative" (nothing to
    pass). `mask`: "prepared" (block-diagonal, 4D on transformers 5, 3D 1/0 on 4.x), "pairwise" (DeBERTa's own
    (rows, width, width) 1/0 mask) or "per_layer_type" (ModernBERT: one per layer type, windowed where sliding)."""

    positions: str
    mask: str = "prepared"
    needs_4d: bool = False  # packs only where transformers takes a prepared 4D mask (5.x)
    min_transformers: tuple[int, ...] = ()  # packed from this transformers on; length groups below it


TESTED_NEWER = (5, 24)  # the first transformers these types' equivalence tests pass on with a prepared mask

PACKING_RECIPES = {
    "bert": PackingRecipe("zero"),
    "electra": PackingRecipe("zero"),
    "distilbert": PackingRecipe("zero"),
    "megatron-bert": PackingRecipe("zero", min_transformers=TESTED_NEWER),
    "ernie": PackingRecipe("zero"),
    "albert": PackingRecipe("zero", needs_4d=True),  # 4.x unsqueezes the mask itself: 2D only
    "roberta": PackingRecipe("after_pad"),
    "xlm-roberta": PackingRecipe("after_pad"),
    "camembert": PackingRecipe("after_pad"),
    "data2vec-text": PackingRecipe("after_pad"),
    "mpnet": PackingRecipe("after_pad", min_transformers=TESTED_NEWER),
    "roformer": PackingRecipe("relative", min_transformers=TESTED_NEWER),
    "deberta-v2": PackingRecipe("zero", mask="pairwise"),
    "modernbert": PackingRecipe("zero", mask="per_layer_type", needs_4d=True, min_transformers=TESTED_NEWER),
}
PACKABLE_MODEL_TYPES = tuple(PACKING_RECIPES)
# Attention implementations reading a dense 4D mask: sdpa takes a boolean one, eager an additive one.
PACKABLE_ATTENTION = ("sdpa", "eager")

_fallback_logged: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def packing_flag(mode: str | bool | None) -> bool | str | None:
    """'auto' | 'on' | 'grouped' | 'off' (the CLI/config spelling) -> None | True | 'grouped' | False (the API's)."""
    if mode is None or isinstance(mode, bool):
        return mode
    if mode not in PACKING_MODES:
        raise UserError(f"--packing: unknown mode {mode!r}; choose one of {', '.join(PACKING_MODES)}")
    return {"auto": None, "on": True, "grouped": "grouped", "off": False}[mode]


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a DistributedDataParallel wrapper (whose forward takes *args)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why this model cannot run packed, or None when it can."""
    model = unwrapped(model)
    config = model.config
    model_type = getattr(config, "model_type", type(model).__name__)
    if model_type not in PACKABLE_MODEL_TYPES:
        return f"model type {model_type!r} is not one of the packable ones ({', '.join(PACKABLE_MODEL_TYPES)})"
    recipe = PACKING_RECIPES[model_type]
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention not in PACKABLE_ATTENTION:
        return f"attention implementation {attention!r} takes no block-diagonal mask (packable: sdpa, eager)"
    if recipe.positions != "relative" and "position_ids" not in inspect.signature(model.forward).parameters:
        return f"{type(model).__name__}.forward takes no position_ids"
    if recipe.needs_4d and not transformers_takes_4d_mask():
        return f"{model_type} takes a block-diagonal mask only on transformers 5"
    if recipe.min_transformers and installed_version("transformers") < recipe.min_transformers:
        return (f"{model_type} is packed from transformers {'.'.join(map(str, recipe.min_transformers))} on, where "
                "it takes a block-diagonal mask")
    return None


GROUP_BUDGET = 512  # padded slots per length group (docs/design.md, "Packed rows and length groups")


def choose_layout(model: torch.nn.Module, requested: bool | str | None,
                  sequences: Sequence[Sequence[int]] | None = None) -> str:
    """'packed', 'grouped' or 'padded' for this model and batch; an unpackable model logs why, once.

    Auto: packed rows wherever the model supports them and they cost fewer FLOPs than padding this batch
    (not for `encode`'s length-sorted batches, which pad almost nothing); a model that cannot be packed
    runs length groups (as does `packing=True` on it, with a warning saying why).
    """
    if requested is False:
        return "padded"
    if requested == "grouped":
        return _grouped_unless_one_group(sequences)
    reason = unsupported_reason(model)
    if reason is None:
        if requested is True or sequences is None or packing_is_cheaper(model.config, sequences):
            return "packed"
        return "padded"
    if model not in _fallback_logged:
        _fallback_logged.add(model)
        log = logger.warning if requested else logger.info
        log("packing off, running length-grouped padded batches: %s", reason)
    return _grouped_unless_one_group(sequences)


def _grouped_unless_one_group(sequences: Sequence[Sequence[int]] | None) -> str:
    """One length group is exactly the padded batch."""
    if sequences is not None and len(length_groups([len(s) for s in sequences])) <= 1:
        return "padded"
    return "grouped"


def length_groups(lengths: Sequence[int], budget: int | None = None) -> list[list[int]]:
    """View indices sorted by length and cut so that each group's padded size (views x its longest) stays
    within `budget` slots (default GROUP_BUDGET); a longer view is a group of its own. Depends only on the
    lengths."""
    budget = budget or GROUP_BUDGET
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[i] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def grouped_embed(embed_padded: Callable[[Sequence[Sequence[int]]], torch.Tensor],
                  sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Pooled vectors, in input order, from padded forward passes over length groups (one autograd graph,
    so a loss over all of them backpropagates as through one padded batch)."""
    groups = length_groups([len(s) for s in sequences])
    vectors = torch.cat([embed_padded([sequences[i] for i in group]) for group in groups])
    order = torch.tensor([i for group in groups for i in group], device=vectors.device)
    return vectors[torch.argsort(order)]


def packing_is_cheaper(config, sequences: Sequence[Sequence[int]]) -> bool:
    """Compare the FLOPs of a layer (projections and FFN ~ 24 d^2 per token, attention ~ 4 d x row width
    per token) over the padded (views, longest) batch and over the packed (rows, width) one."""
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "dim", 0) or 768)
    lengths = [len(s) for s in sequences]
    rows = plan_rows(lengths, ROW_BUDGET)
    width = max(sum(lengths[i] for i in row) for row in rows)

    def cost(n_rows: int, row_width: int) -> int:
        return n_rows * row_width * (6 * hidden + row_width)

    return cost(len(rows), width) < cost(len(lengths), max(lengths))


def plan_rows(lengths: Sequence[int], budget: int = ROW_BUDGET) -> list[list[int]]:
    """First-fit-decreasing bin packing of view indices into rows of `budget` tokens.

    Depends only on the lengths (ties keep input order), so equal-length batches get equal layouts.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    room: list[int] = []
    first_open = 0  # rows before this one are full for every remaining (shorter or equal) view
    for i in order:
        size = lengths[i]
        while first_open < len(room) and room[first_open] <= 0:
            first_open += 1
        for r in range(first_open, len(room)):
            if room[r] >= size:
                rows[r].append(i)
                room[r] -= size
                break
        else:
            rows.append([i])
            room.append(budget - size)
    return rows


@dataclass
class PackedBatch:
    """Model inputs of packed views plus where each view's tokens lie."""

    input_ids: torch.Tensor  # (rows, width)
    position_ids: torch.Tensor  # (rows, width)
    view_of_token: torch.Tensor  # (rows, width): index of the view owning the token, -1 for padding
    first_token: torch.Tensor  # (views,): flat index (row * width + column) of each view's first token
    n_views: int

    def attention_mask(self, attention: str, dtype: torch.dtype, prepared: bool = True,
                       within: torch.Tensor | None = None) -> torch.Tensor:
        """A token sees the tokens of its own view (and of those, only the ones `within` allows, a
        (width, width) window); padding sees padding only. `prepared` (transformers 5): (rows, 1, width,
        width), boolean for sdpa, additive for eager; else (transformers 4.x) the (rows, width, width) 1/0
        mask the model turns into an additive one itself."""
        segment = self.view_of_token
        allowed = segment[:, :, None] == segment[:, None, :]
        if within is not None:
            allowed = allowed & (within | (segment[:, :, None] < 0))  # padding keeps seeing itself
        allowed = allowed.unsqueeze(1)
        if not prepared:
            return allowed[:, 0].to(dtype)
        if attention == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)


def pack(sequences: Sequence[Sequence[int]], pad_id: int, first_position: int = 0,
         budget: int = ROW_BUDGET, device: torch.device | None = None) -> PackedBatch:
    """Lay the sequences out in rows of at most `budget` tokens (`plan_rows`), as tensors on `device`."""
    lengths = [len(s) for s in sequences]
    rows = plan_rows(lengths, budget)
    width = max(sum(lengths[i] for i in row) for row in rows)
    ids = [pad_id] * (len(rows) * width)
    positions = [first_position] * (len(rows) * width)
    owner = [-1] * (len(rows) * width)
    first = [0] * len(sequences)
    for r, row in enumerate(rows):
        offset = r * width
        for i in row:
            size = lengths[i]
            ids[offset:offset + size] = sequences[i]
            positions[offset:offset + size] = range(first_position, first_position + size)
            owner[offset:offset + size] = [i] * size
            first[i] = offset
            offset += size
    shape, long = (len(rows), width), {"dtype": torch.long, "device": device}
    return PackedBatch(
        torch.tensor(ids, **long).view(shape), torch.tensor(positions, **long).view(shape),
        torch.tensor(owner, **long).view(shape), torch.tensor(first, **long), len(sequences),
    )


def row_budget(model: torch.nn.Module) -> int:
    """ROW_BUDGET, or fewer where a row must fit the model's position table: RoFormer looks its rotary angles
    up by column, so a row wider than max_position_embeddings would index past the table."""
    positions = getattr(unwrapped(model).config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        return max(1, min(ROW_BUDGET, positions - _first_position(model)))
    return ROW_BUDGET


def _first_position(model: torch.nn.Module) -> int:
    """The first position id of this model: after its embeddings' own padding index where it counts from
    there (MPNet fixes that index at 1, whatever the config's pad_token_id)."""
    model = unwrapped(model)
    recipe = PACKING_RECIPES.get(model.config.model_type)
    if recipe is None or recipe.positions != "after_pad":
        return 0
    base = getattr(model, model.base_model_prefix, model)
    padding_idx = getattr(getattr(base, "embeddings", None), "padding_idx", None)
    return int(padding_idx if isinstance(padding_idx, int) else model.config.pad_token_id) + 1


def _packed_mask(model: torch.nn.Module, packed: PackedBatch) -> torch.Tensor | dict[str, torch.Tensor]:
    """The block-diagonal attention mask in the form this model type takes (PackingRecipe.mask)."""
    config = unwrapped(model).config
    recipe = PACKING_RECIPES[config.model_type]
    attention = getattr(config, "_attn_implementation", None) or "eager"
    dtype = next(model.parameters()).dtype
    if recipe.mask == "pairwise":
        return packed.attention_mask(attention, torch.long, prepared=False)
    if recipe.mask == "per_layer_type":
        window = int(config.sliding_window)
        column = torch.arange(packed.input_ids.shape[1], device=packed.input_ids.device)
        near = (column[:, None] - column[None, :]).abs() <= window  # a view's tokens are contiguous in its row
        return {"full_attention": packed.attention_mask(attention, dtype),
                "sliding_attention": packed.attention_mask(attention, dtype, within=near)}
    return packed.attention_mask(attention, dtype, prepared=transformers_takes_4d_mask())


@contextlib.contextmanager
def _embeddings_mask(model: torch.nn.Module, packed: PackedBatch):
    """DeBERTa's embeddings multiply by the attention mask it was given, which must be per token there while
    its encoder takes the pairwise one: hand the embeddings the token mask (real tokens) for this call."""
    inner = unwrapped(model)
    if PACKING_RECIPES[inner.config.model_type].mask != "pairwise":
        yield
        return
    embeddings = getattr(getattr(inner, inner.base_model_prefix, inner), "embeddings")
    tokens = (packed.view_of_token >= 0).long()

    def token_mask(module, args, kwargs):
        return args, {**kwargs, "mask": tokens}

    handle = embeddings.register_forward_pre_hook(token_mask, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def packed_embed(model: torch.nn.Module, sequences: Sequence[Sequence[int]], pooling: str,
                 pad_id: int) -> torch.Tensor:
    """Pooled vectors of the sequences, in order, from one packed forward pass."""
    device = next(model.parameters()).device
    packed = pack(sequences, pad_id, _first_position(model), row_budget(model), device)
    inputs = {"input_ids": packed.input_ids, "attention_mask": _packed_mask(model, packed)}
    if PACKING_RECIPES[unwrapped(model).config.model_type].positions != "relative":
        inputs["position_ids"] = packed.position_ids
    if "token_type_ids" in inspect.signature(unwrapped(model).forward).parameters:
        inputs["token_type_ids"] = torch.zeros_like(packed.input_ids)
    with drophead_groups(packed.view_of_token, packed.n_views), _embeddings_mask(model, packed):
        outputs = model(**inputs, output_hidden_states=needs_hidden_states(pooling), return_dict=True)
    return pool_views(outputs, packed.view_of_token, packed.first_token, packed.n_views, pooling)
