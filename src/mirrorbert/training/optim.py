"""Optimisation: AdamW with the BERT decay convention, the learning-rate schedule, one update."""

from __future__ import annotations

import torch


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with the usual BERT convention (no weight decay on biases and LayerNorm weights), fused where torch
    has the fused kernel for the parameters' device and dtype."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device/dtype, or an old torch
        return torch.optim.AdamW(groups, lr=lr)


def build_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int):
    """`constant` (the Mirror-BERT paper), `constant-warmup`, or `linear` (warmup then linear decay to 0)."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "linear":
            remaining = max(0, total_steps - step)
            return remaining / max(1, total_steps - warmup_steps)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def backward_and_step(loss: torch.Tensor, optimizer, scheduler=None, scaler=None, parameters=None,
                      max_grad_norm: float | None = None, *, update: bool = True) -> None:
    """Backward pass and (when `update`: the last micro-batch of a step) one optimiser step, with fp16 loss
    scaling and clipping of `parameters` (the optimiser's by default)."""
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if not update:
        return
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm:
        params = parameters if parameters is not None else [p for g in optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
