"""Cached-gradient contrastive steps (GradCache, Gao et al. 2021): the loss and gradients of a big in-batch
contrastive batch at the activation memory of one chunk; the caller's loss is an ordinary tensor (how and why:
docs/design.md)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from mirrorbert.runtime.randomness import set_torch_rng_state, torch_rng_state

EmbedFn = Callable[[Sequence[Sequence[int]]], torch.Tensor]


class _ReplayChunks(torch.autograd.Function):
    """Identity on the cached embeddings whose backward re-runs the encoder and pushes the gradient in."""

    @staticmethod
    def forward(ctx, anchor, embeddings, embed_fn, chunks, states):
        ctx.embed_fn, ctx.chunks, ctx.states = embed_fn, chunks, states
        return embeddings.clone()

    @staticmethod
    def backward(ctx, grad):
        after = torch_rng_state()  # the replay must leave no trace in the random streams
        start = 0
        try:
            for chunk, state in zip(ctx.chunks, ctx.states):
                set_torch_rng_state(state)
                with torch.enable_grad():
                    out = ctx.embed_fn(chunk)
                rows = out.shape[0]
                torch.autograd.backward(out, grad[start:start + rows].to(out.dtype))
                start += rows
        finally:
            set_torch_rng_state(after)
        return None, None, None, None, None


def cached_embeddings(embed_fn: EmbedFn, sequences: Sequence[Sequence[int]], chunk: int) -> torch.Tensor:
    """Embeddings of all `sequences` (rows in order), computed `chunk` at a time without a graph; backpropagating
    through them re-runs `embed_fn` per chunk with a graph and the chunk's saved random state. `embed_fn` must
    apply its own autocast (the replay runs inside `backward`) and depend only on its input and the random state."""
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    chunks = [list(sequences[i:i + chunk]) for i in range(0, len(sequences), chunk)]
    states, parts = [], []
    with torch.no_grad():
        for part in chunks:
            states.append(torch_rng_state())
            parts.append(embed_fn(part))
    embeddings = torch.cat(parts)
    if not torch.is_grad_enabled():
        return embeddings
    # A leaf that requires grad puts the function in the graph even though `embeddings` has none.
    anchor = torch.empty(0, device=embeddings.device, requires_grad=True)
    return _ReplayChunks.apply(anchor, embeddings, embed_fn, chunks, states)


def cached_step(embed_fn: EmbedFn, sequences: Sequence[Sequence[int]], chunk: int,
                loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`loss_fn` of the full embedding matrix, with cached gradients: call `.backward()` on the result (the
    gradients of embedding the same chunks with a graph)."""
    return loss_fn(cached_embeddings(embed_fn, sequences, chunk))


__all__ = ["cached_embeddings", "cached_step"]
