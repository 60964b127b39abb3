"""Speed-ups that must not change results: fused AdamW, span masking without per-epoch re-scans."""

from __future__ import annotations

import copy

import torch

from mirrorbert.training.optim import build_optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def _run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 6) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def test_build_optimizer_is_fused_where_torch_has_the_kernel():
    fused_on_cpu = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)
    optimizer = build_optimizer(_model(), lr=1e-3, weight_decay=0.01)
    assert bool(optimizer.defaults.get("fused")) == fused_on_cpu


def test_fused_adamw_equals_the_plain_loop():
    ours = _model()
    plain = copy.deepcopy(ours)
    optimizer = build_optimizer(ours, lr=1e-2, weight_decay=0.1)
    groups = [{"params": [plain[0].weight, plain[2].weight], "weight_decay": 0.1},
              {"params": [plain[0].bias, plain[1].weight, plain[1].bias, plain[2].bias], "weight_decay": 0.0}]
    reference = torch.optim.AdamW(groups, lr=1e-2, foreach=False, fused=False)
    _run(ours, optimizer)
    _run(plain, reference)
    for (name, a), b in zip(ours.named_parameters(), plain.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name
    moved = sum((a - b).abs().sum() for a, b in zip(ours.parameters(), _model().parameters()))
    assert moved > 0  # the steps did something


def test_fused_optimizer_state_round_trips_through_a_checkpoint():
    model = _model()
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    _run(model, optimizer, steps=2)
    twin = copy.deepcopy(model)
    twin_opt = build_optimizer(twin, lr=1e-2, weight_decay=0.1)
    twin_opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    _run(model, optimizer, steps=3)
    _run(twin, twin_opt, steps=3)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_fused_adamw_with_clipping_via_backward_and_step():
    from mirrorbert.training.optim import backward_and_step

    ours, plain = _model(), _model()
    optimizer = build_optimizer(ours, lr=1e-2, weight_decay=0.0)
    reference = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.0, foreach=False, fused=False)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    for model, opt in ((ours, optimizer), (plain, reference)):
        for _ in range(3):
            backward_and_step(model(x).pow(2).mean() * 100, opt, max_grad_norm=0.5)
    for a, b in zip(ours.parameters(), plain.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_token_span_masking_per_batch_draws_what_mask_span_draws(tiny_bert, corpus):
    """The batch path (`SecondViews.views_for`) against a one-string reference at the same draw."""
    from transformers import AutoTokenizer

    from mirrorbert.mirror.views import (
        STREAM_MASK, SecondViews, special_token_ids, tokenize_once, valid_span_starts,
    )
    from mirrorbert.runtime.randomness import index_uniforms, uniform_choice

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    strings = corpus + ["a b", "x"]  # too short for a span: left unmasked
    ids = tokenize_once(tokenizer, strings, 12)
    views = SecondViews.from_lists(tokenizer, strings, ids, "token", 2, 0, 12)
    special = special_token_ids(tokenizer)

    for epoch in range(3):
        drawn = views.views_for(range(len(ids)), 7, epoch)
        expected = []
        for i, u in enumerate(index_uniforms(7, (STREAM_MASK, epoch), range(len(ids)))):
            starts, view = valid_span_starts(ids[i], 2, special), list(ids[i])
            if starts:  # the string's own draw
                start = starts[uniform_choice(float(u), len(starts))]
                view[start:start + 2] = [tokenizer.mask_token_id] * 2
            expected.append(view)
        assert drawn == expected
        assert drawn[-1] == ids[-1] and drawn != ids
