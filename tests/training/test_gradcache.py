"""GradCache and gradient checkpointing: same loss and gradients as the plain step, less memory."""

import pytest
import torch
from safetensors.torch import load_file

from mirrorbert.mirror.config import TrainConfig
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError
from mirrorbert.training.gradcache import cached_embeddings, cached_step
from mirrorbert.mirror.loss import MirrorInfoNCE
from mirrorbert.runtime.device import enable_gradient_checkpointing
from mirrorbert.mirror.step import embed_views
from mirrorbert.mirror.train import train
from mirrorbert.mirror.views import mask_span, special_token_ids, tokenize_once

CPU = torch.device("cpu")
DROPOUT = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _encoder(path, overrides):
    enc = Encoder.load(path, pooling="mean", config_overrides=overrides)
    enc.train()
    return enc


def _batch(enc, corpus, n=6):
    first = tokenize_once(enc.tokenizer, corpus[:n], 16)
    gen = torch.Generator().manual_seed(0)
    special = special_token_ids(enc.tokenizer)
    second = [mask_span(ids, 2, enc.tokenizer.mask_token_id, special, float(torch.rand((), generator=gen)))
              for ids in first]
    return first + second


def _grads(enc):
    return {name: p.grad.detach().clone() for name, p in enc.named_parameters() if p.grad is not None}


def _embed_fn(enc):
    return lambda chunk: embed_views(enc, chunk, [], precision="fp32")


def _loss(emb):
    return MirrorInfoNCE(0.05)(emb)


def _run(enc, step):
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    loss = step()
    loss.backward()
    return loss.detach(), _grads(enc)


def _assert_close(a, b, atol=1e-5):
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert torch.allclose(loss_a, loss_b, atol=atol), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=atol, rtol=1e-4), name


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_roberta"])
def test_cached_step_equals_one_plain_pass_without_dropout(request, which, corpus):
    enc = _encoder(request.getfixturevalue(which), NO_DROPOUT)
    seqs = _batch(enc, corpus)
    plain = _run(enc, lambda: _loss(_embed_fn(enc)(seqs)))
    cached = _run(enc, lambda: cached_step(_embed_fn(enc), seqs, 5, _loss))
    _assert_close(plain, cached)


def test_cached_step_replays_dropout_masks(tiny_bert, corpus):
    """With dropout on, the reference is the same chunks embedded with a graph; the RNG replay makes
    the masks of the re-run identical to those of the cached pass, so loss and gradients match."""
    enc = _encoder(tiny_bert, DROPOUT)
    seqs = _batch(enc, corpus)
    embed = _embed_fn(enc)
    chunked = _run(enc, lambda: _loss(torch.cat([embed(seqs[i:i + 4]) for i in range(0, len(seqs), 4)])))
    cached = _run(enc, lambda: cached_step(embed, seqs, 4, _loss))
    _assert_close(chunked, cached)
    # the masks matter: without replaying the same random state the gradients differ
    torch.manual_seed(999)
    other = _run(enc, lambda: _loss(embed(seqs)))
    assert not torch.allclose(other[0], cached[0], atol=1e-5)


def test_cached_step_leaves_random_state_as_a_plain_chunked_step(tiny_bert, corpus):
    enc = _encoder(tiny_bert, DROPOUT)
    seqs = _batch(enc, corpus)
    embed = _embed_fn(enc)
    _run(enc, lambda: _loss(torch.cat([embed(seqs[i:i + 4]) for i in range(0, len(seqs), 4)])))
    after_plain = torch.get_rng_state()
    _run(enc, lambda: cached_step(embed, seqs, 4, _loss))
    assert torch.equal(after_plain, torch.get_rng_state())


def test_cached_embeddings_without_grad_are_plain_embeddings(tiny_bert, corpus):
    enc = _encoder(tiny_bert, NO_DROPOUT)
    seqs = _batch(enc, corpus)
    with torch.no_grad():
        cached = cached_embeddings(_embed_fn(enc), seqs, 3)
        plain = _embed_fn(enc)(seqs)
    assert cached.grad_fn is None
    assert torch.allclose(cached, plain, atol=1e-5)


def test_cached_step_works_with_any_loss_over_the_matrix(tiny_bert, corpus):
    """The loss is a callable of the full matrix (another loss, or one over gathered embeddings)."""
    enc = _encoder(tiny_bert, NO_DROPOUT)
    seqs = _batch(enc, corpus)

    def other_loss(emb):
        return (emb @ emb.T).logsumexp(-1).mean()

    plain = _run(enc, lambda: other_loss(_embed_fn(enc)(seqs)))
    cached = _run(enc, lambda: cached_step(_embed_fn(enc), seqs, 4, other_loss))
    _assert_close(plain, cached, atol=1e-4)


@pytest.mark.parametrize("overrides", [NO_DROPOUT, DROPOUT], ids=["dropout-0", "dropout-0.1"])
def test_gradient_checkpointing_same_loss_and_gradients(tiny_bert, corpus, overrides):
    """Non-reentrant checkpointing restores the RNG for the recomputation: same masks, same gradients."""
    enc = _encoder(tiny_bert, overrides)
    seqs = _batch(enc, corpus)
    plain = _run(enc, lambda: _loss(_embed_fn(enc)(seqs)))
    enable_gradient_checkpointing(enc.model)
    assert enc.model.is_gradient_checkpointing
    checkpointed = _run(enc, lambda: _loss(_embed_fn(enc)(seqs)))
    _assert_close(plain, checkpointed)


def test_grad_cache_refuses_controlled_dropout():
    with pytest.raises(UserError, match="grad_cache_chunk="):
        TrainConfig(grad_cache_chunk=4, controlled_dropout=True)
    with pytest.raises(UserError, match="grad_cache_chunk="):
        TrainConfig(grad_cache_chunk=-1)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("data") / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


def _train(model, data, out, **kw):
    base = dict(model=str(model), data=str(data), output=str(out), batch_size=6, max_length=16, steps=3,
                show_progress=False, lr=1e-3, temperature=0.05, mask_span=1, pooling="cls", precision="fp32")
    return train(TrainConfig(**{**base, **kw}))


def test_train_with_grad_cache_and_checkpointing_gives_the_same_weights(tiny_bert, data_file, tmp_path):
    """Adam turns float-rounding differences of tiny gradients into updates of up to ~lr, so the weights
    are compared at half of lr: a wrong gradient moves many weights by ~lr per step (3 steps here). With
    packing the chunks are packed differently from the full batch, so the float noise is a little larger."""
    common = dict(dropout=0.0, lr=1e-4)
    plain = _train(tiny_bert, data_file, tmp_path / "plain", **common)
    cached = _train(tiny_bert, data_file, tmp_path / "cached", grad_cache_chunk=4, **common)
    ckpt = _train(tiny_bert, data_file, tmp_path / "ckpt", gradient_checkpointing=True, **common)
    assert abs(plain.final_loss - cached.final_loss) < 1e-5
    start = Encoder.load(tiny_bert).model.state_dict()
    wa = load_file(str(plain.output / "model.safetensors"))
    moved = max((wa[key] - start[key]).abs().max().item() for key in wa if key in start)
    assert moved > 2e-4
    for other in (cached, ckpt):
        wb = load_file(str(other.output / "model.safetensors"))
        for key in wa:
            assert torch.allclose(wa[key], wb[key], atol=5e-5, rtol=0), key
    assert cached.info["peak_memory_bytes"] > 0
    assert cached.info["config"]["grad_cache_chunk"] == 4


def test_train_runs_with_dropout_and_both_memory_options(tiny_bert, data_file, tmp_path):
    result = _train(tiny_bert, data_file, tmp_path / "out", dropout=0.1, grad_cache_chunk=5,
                    gradient_checkpointing=True)
    assert result.steps == 3 and result.final_loss == result.final_loss  # finite, not NaN
