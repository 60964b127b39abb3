"""Run under `torchrun --nproc_per_node 2` by tests/runtime/test_distributed.py (not collected by pytest).

One launch checks three things in order, to keep the test suite fast:
1. gradients: the loss and every parameter gradient of a 2-process step (DDP + gathered views, uneven
   shards) equal those of one process holding the whole global batch, for one- and two-pass
   (controlled dropout) embedding, and for a batch with fewer strings than processes (a stand-in on
   rank 1 that must not count); rank 0 prints `RESULT {...}`;
2. sharded encoding: `Encoder.encode` under `sharded_encoding` returns every row in input order; rank 0
   saves the matrix to OUTDIR/vectors.npy;
3. a crash: rank 1 exits before a collective; rank 0 must stop (not wait forever) naming the checkpoint,
   printing `STOPPED ...`.
"""

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

from tiny_models import CORPUS

from mirrorbert.runtime.distributed import init_from_env, sharded_encoding
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError
from mirrorbert.mirror.loss import MirrorInfoNCE
from mirrorbert.encoder.packing import unsupported_reason
from mirrorbert.mirror.step import embed_views
from mirrorbert.mirror.views import tokenize_once

ENCODE_TEXTS = CORPUS + ["x", "a much longer sentence about the cat and the dog in the park today"]  # 14 rows


def main(model: str, outdir: str) -> int:
    ctx = init_from_env("cpu")
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    encoder = Encoder.load(model, pooling="mean", device="cpu", config_overrides=no_dropout)
    encoder.train()
    first = tokenize_once(encoder.tokenizer, CORPUS[:5], 16)  # 5 strings on 2 processes: shards of 3 and 2
    second = tokenize_once(encoder.tokenizer, CORPUS[5:10], 16)  # any second view will do for gradients

    # 1. gradients
    reference = copy.deepcopy(encoder)
    ctx.wrap(encoder)
    if ctx.is_main:  # packing must see through the DDP wrapper (it once fell back to padding here)
        print("PACKABLE " + json.dumps(unsupported_reason(encoder.model)), flush=True)
    worst = {}
    for controlled in (False, True):
        reference.zero_grad()
        encoder.zero_grad()
        expected = MirrorInfoNCE(0.05)(embed_views(reference, first, second, precision="fp32",
                                                   controlled_dropout=controlled))
        expected.backward()
        local = embed_views(encoder, ctx.shard(first), ctx.shard(second), precision="fp32",
                            controlled_dropout=controlled)
        loss = MirrorInfoNCE(0.05)(ctx.gather_views(local, len(first)))
        loss.backward()
        grads = dict(reference.model.named_parameters())
        diff = max((p.grad - grads[n].grad).abs().max().item()
                   for n, p in encoder.model.module.named_parameters() if p.grad is not None)
        scale = max(p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None)
        worst[str(controlled)] = {"loss_diff": abs(loss.item() - expected.item()), "grad_diff": diff,
                                  "grad_scale": scale}
    # a batch with fewer strings than processes: rank 1 embeds a stand-in that must not count
    reference.zero_grad()
    encoder.zero_grad()
    lone = [first[0]], [second[0]]
    (embed_views(reference, *lone, precision="fp32") ** 2).sum().backward()
    local = embed_views(encoder, ctx.shard(lone[0]), ctx.shard(lone[1]), precision="fp32")
    gathered = ctx.gather_views(local, 1)
    (gathered ** 2).sum().backward()
    grads = dict(reference.model.named_parameters())
    worst["empty shard"] = {
        "loss_diff": 0.0 if gathered.shape[0] == 2 else float("inf"),
        "grad_diff": max((p.grad - grads[n].grad).abs().max().item()
                         for n, p in encoder.model.module.named_parameters() if p.grad is not None),
        "grad_scale": max(p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None)}
    ctx.unwrap(encoder)
    if ctx.is_main:
        print("RESULT " + json.dumps(worst), flush=True)

    # 2. sharded encoding
    with sharded_encoding(ctx):
        vectors = encoder.encode(ENCODE_TEXTS, batch_size=3)
    if ctx.is_main:
        np.save(Path(outdir) / "vectors.npy", vectors)

    # 3. a crashed rank
    torch.distributed.barrier()
    if ctx.rank == 1:
        sys.exit(3)
    try:
        with ctx.failure_guard(lambda: "ckpt/step-2"):
            ctx.gather_views(embed_views(encoder, ctx.shard(first), ctx.shard(second), precision="fp32"), 5)
    except UserError as exc:
        print(f"STOPPED {exc}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
