"""CUDA paths (marker `gpu`; every test skips without a CUDA device): packed == padded on the GPU, the fused
attention kernel a packed step runs (no silent math fallback), the bf16 and fp16 + loss-scaling training
paths, and one DDP step on NCCL with one process.

    pytest -m gpu tests/runtime/test_gpu.py -s
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from mirrorbert.mirror.config import TrainConfig
from mirrorbert.encoder.model import Encoder
from mirrorbert.runtime.device import autocast, make_grad_scaler
from mirrorbert.training.optim import backward_and_step, build_optimizer
from mirrorbert.mirror.loss import build_loss
from mirrorbert.mirror.step import embed_views, mirror_step_loss
from mirrorbert.mirror.train import train
from mirrorbert.encoder.dropout import dropout_overrides
from tiny_models import make_tiny_bert

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """TF32 (on by default in the trainer on Ampere+) would dominate the fp32 tolerances below."""
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def load(folder, pooling: str = "mean", dropout: float = 0.0) -> Encoder:
    from transformers import AutoConfig

    overrides = dropout_overrides(AutoConfig.from_pretrained(folder), dropout)
    return Encoder.load(folder, pooling=pooling, device="cuda", config_overrides=overrides)


def views(encoder: Encoder, corpus: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    texts = corpus + ["a", " ".join(corpus[:4])]
    first = encoder.tokenize(texts)
    second = [ids[:1] + [encoder.tokenizer.mask_token_id] + ids[2:] for ids in first]
    return first, second


@pytest.mark.parametrize("pooling", ["cls", "mean", "first-last"])
def test_packed_equals_padded_on_cuda(tiny_bert, corpus, pooling):
    encoder = load(tiny_bert, pooling)
    encoder.eval()
    first, _ = views(encoder, corpus)
    with torch.no_grad():
        padded = encoder.embed(first, packing=False)
        packed = encoder.embed(first, packing=True)
    assert padded.device.type == "cuda"
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


def test_packed_training_step_equals_padded_on_cuda(tiny_bert, corpus):
    encoder = load(tiny_bert)
    encoder.train()  # dropout is 0: the two layouts must agree
    first, second = views(encoder, corpus)
    results = []
    for layout in (False, True):
        encoder.zero_grad(set_to_none=True)
        encoder.packing = layout
        loss = mirror_step_loss(encoder, first, second, build_loss("infonce", 0.05), precision="fp32")
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in encoder.named_parameters()
                                        if p.grad is not None}))
    (loss_pad, grads_pad), (loss_packed, grads_packed) = results
    torch.testing.assert_close(loss_packed, loss_pad, atol=1e-5, rtol=1e-5)
    assert grads_pad.keys() == grads_packed.keys()
    for key in grads_pad:
        torch.testing.assert_close(grads_packed[key], grads_pad[key], atol=1e-5, rtol=1e-4, msg=key)


def _loss_at(encoder: Encoder, first, second, precision: str) -> torch.Tensor:
    with torch.no_grad():
        return mirror_step_loss(encoder, first, second, build_loss("infonce", 0.05), precision=precision).float()


def fused_attention_kernels(encoder: Encoder, first, second, device: torch.device, precision: str) -> list[str]:
    """The SDPA kernels one packed training step (forward and backward) runs with the math fallback disabled.

    Packed rows carry a block-diagonal mask; a backend that cannot take it would make SDPA fall back to the
    slow math path silently. With only the fused backends allowed, SDPA raises instead, and the profiler
    names the kernel it chose.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    encoder.packing = True
    with profile(activities=[ProfilerActivity.CPU]) as prof, sdpa_kernel(fused):
        mirror_step_loss(encoder, first, second, build_loss("infonce", 0.05), precision=precision).backward()
    return sorted({e.name for e in prof.events()
                   if "scaled_dot_product" in e.name and e.name != "aten::scaled_dot_product_attention"})


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_packed_attention_runs_on_a_fused_kernel(tmp_path, corpus, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    folder = make_tiny_bert(tmp_path / "head-dim-64", hidden=128, heads=2)  # BERT's head width
    encoder = load(folder)
    assert encoder.model.config._attn_implementation == "sdpa"
    encoder.train()
    first, second = views(encoder, corpus)
    kernels = fused_attention_kernels(encoder, first, second, CUDA, precision)
    print(f"{precision}: {kernels}")  # shown with -s: which fused kernel this GPU chose
    assert kernels and not any("math" in name for name in kernels)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_loss_is_close_to_fp32(tiny_bert, corpus, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    encoder = load(tiny_bert)
    encoder.eval()
    first, second = views(encoder, corpus)
    seen = []  # the dense layers must really run in the low precision
    linear = next(m for m in encoder.model.modules() if isinstance(m, torch.nn.Linear))
    handle = linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with torch.no_grad(), autocast(CUDA, precision):
        embed_views(encoder, first, second, precision=precision)
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16 if precision == "bf16" else torch.float16}
    torch.testing.assert_close(_loss_at(encoder, first, second, precision), _loss_at(encoder, first, second, "fp32"),
                               rtol=3e-2, atol=3e-2)


def test_fp16_step_with_the_grad_scaler_updates_like_fp32(tiny_bert, corpus):
    encoder, reference = load(tiny_bert), load(tiny_bert)
    encoder.train()
    reference.train()
    first, second = views(encoder, corpus)
    scaler = make_grad_scaler(CUDA, "fp16")
    assert scaler is not None
    moved = {}
    for model, precision, grad_scaler in ((encoder, "fp16", scaler), (reference, "fp32", None)):
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.0)
        loss = mirror_step_loss(model, first, second, build_loss("infonce", 0.05), precision=precision)
        backward_and_step(loss, optimizer, scaler=grad_scaler, max_grad_norm=1.0)
        moved[precision] = {n: p.detach() - start[n] for n, p in model.named_parameters()}
    assert scaler.get_scale() > 0 and all(torch.isfinite(d).all() for d in moved["fp16"].values())
    # AdamW's first step moves each weight by about lr * sign(gradient): the precisions must agree on
    # almost every sign (a few near-zero gradients may flip under fp16 rounding)
    signs = torch.cat([(moved["fp16"][n].sign() == moved["fp32"][n].sign()).flatten() for n in moved["fp32"]])
    assert signs.float().mean() > 0.95


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_train_runs_on_cuda_in_mixed_precision(tiny_bert, corpus, tmp_path, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    data = tmp_path / "data.txt"
    data.write_text("\n".join(corpus * 2) + "\n", encoding="utf-8")
    result = train(TrainConfig(model=str(tiny_bert), data=str(data), output=str(tmp_path / "out"), batch_size=8,
                               steps=3, device="cuda", precision=precision, show_progress=False, max_length=24))
    assert result.info["precision"] == precision and result.info["device"].startswith("cuda")
    assert result.final_loss is not None and torch.isfinite(torch.tensor(result.final_loss))
    assert result.info["peak_memory_measure"] == "cuda max_memory_allocated"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_ddp_step_on_nccl_equals_the_plain_step(tiny_bert, corpus, monkeypatch):
    import torch.distributed as dist

    from mirrorbert.runtime.distributed import DistContext

    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    monkeypatch.setitem(os.environ, "MASTER_ADDR", "127.0.0.1")
    monkeypatch.setitem(os.environ, "MASTER_PORT", str(_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        # one process: DistContext would skip DDP; force the multi-process path so the real wrap,
        # all_gather and gradient all-reduce run on NCCL
        monkeypatch.setattr(DistContext, "enabled", property(lambda self: True))
        ctx = DistContext(rank=0, world_size=1, device=torch.device("cuda", torch.cuda.current_device()))
        encoder, plain = load(tiny_bert), load(tiny_bert)
        ctx.wrap(encoder)
        assert isinstance(encoder.model, torch.nn.parallel.DistributedDataParallel)
        first, second = views(plain, corpus)
        after = []
        for model, gather in ((encoder, lambda rows: ctx.gather_views(rows, len(first))), (plain, None)):
            model.train()
            optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.01)
            loss = mirror_step_loss(model, first, second, build_loss("infonce", 0.05), precision="fp32",
                                    gather=gather)
            backward_and_step(loss, optimizer)
            after.append((loss.detach(), model))
        ctx.unwrap(encoder)
        torch.testing.assert_close(after[0][0], after[1][0], atol=1e-5, rtol=1e-5)
        for (name, a), b in zip(encoder.named_parameters(), plain.parameters()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    finally:
        dist.destroy_process_group()
