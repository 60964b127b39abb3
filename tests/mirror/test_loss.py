"""The Mirror-BERT losses against a plain, loop-based reading of the paper's eq. 1 and pytorch-metric-learning."""

import math

import pytest
import torch

from mirrorbert.errors import UserError
from mirrorbert.mirror.loss import MirrorInfoNCE, MirrorMultiSimilarity, build_loss


def eq1_by_hand(emb: torch.Tensor, tau: float) -> torch.Tensor:
    """Sum over the 2B anchors of -log(exp(cos(i, mirror)/tau) / sum_{j != i} exp(cos(i, j)/tau)), averaged."""
    n = emb.shape[0]
    b = n // 2
    total = 0.0
    for i in range(n):
        mirror = i + b if i < b else i - b
        denom = 0.0
        for j in range(n):
            if j == i:
                continue
            cos = torch.dot(emb[i], emb[j]) / (emb[i].norm() * emb[j].norm())
            denom = denom + torch.exp(cos / tau)
        cos_pos = torch.dot(emb[i], emb[mirror]) / (emb[i].norm() * emb[mirror].norm())
        total = total - torch.log(torch.exp(cos_pos / tau) / denom)
    return total / n


@pytest.mark.parametrize("batch,dim,tau", [(2, 5, 0.04), (3, 8, 0.2), (5, 4, 1.0)])
def test_loss_value_and_gradient_match_eq1(batch, dim, tau):
    torch.manual_seed(batch)
    emb = torch.randn(2 * batch, dim, dtype=torch.float64)
    a = emb.clone().requires_grad_(True)
    b = emb.clone().requires_grad_(True)
    ours = MirrorInfoNCE(tau)(a)
    ref = eq1_by_hand(b, tau)
    ours.backward()
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.allclose(a.grad, b.grad.to(a.grad.dtype), atol=1e-5)


def test_loss_is_minimal_when_mirrors_coincide_and_others_are_orthogonal():
    eye = torch.eye(4, dtype=torch.float64)
    perfect = torch.cat([eye, eye])  # each view equals its mirror, orthogonal to the rest
    tau = 0.1
    # positive logit 1/tau against 6 negatives at 0: -log(e^{10} / (e^{10} + 6))
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 6))
    assert MirrorInfoNCE(tau)(perfect).item() == pytest.approx(expected, rel=1e-5)
    swapped = torch.cat([eye, eye[[1, 0, 3, 2]]])
    assert MirrorInfoNCE(tau)(swapped) > MirrorInfoNCE(tau)(perfect)


def test_loss_rejects_odd_batches():
    with pytest.raises(ValueError):
        MirrorInfoNCE(0.1)(torch.randn(5, 3))


# ----------------------------------------------------------------------------- precision
@pytest.mark.parametrize("name", ["infonce", "ms"])
def test_loss_under_bf16_autocast_equals_fp32(name):
    """Autocast must not reach the similarity matmul: at tau = 0.04 a bf16 matmul is off by ~1e-2."""
    torch.manual_seed(0)
    emb = torch.randn(16, 24)
    loss_fn = build_loss(name, 0.04)
    reference = loss_fn(emb)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        under_autocast = loss_fn(emb)
    assert under_autocast.dtype == torch.float32
    assert abs(under_autocast.item() - reference.item()) < 1e-5
    upcast = loss_fn(emb.to(torch.bfloat16))  # half-precision embeddings are upcast, not used as they are
    assert upcast.dtype == torch.float32
    assert abs(upcast.item() - loss_fn(emb.to(torch.bfloat16).float()).item()) < 1e-6


def test_build_loss_infonce_is_eq1():
    emb = torch.randn(8, 5, dtype=torch.float64)
    assert build_loss("infonce", 0.1)(emb).item() == pytest.approx(eq1_by_hand(emb, 0.1).item(), rel=1e-9)
    with pytest.raises(ValueError):
        build_loss("triplet", 0.1)


def test_build_loss_gives_the_loss_objects_and_checks_their_settings():
    assert isinstance(build_loss("infonce", 0.1), MirrorInfoNCE) and build_loss("infonce", 0.1).temperature == 0.1
    assert isinstance(build_loss("ms", 0.1), MirrorMultiSimilarity)
    assert MirrorMultiSimilarity().get_config_dict() == {"loss": "ms", "alpha": 1.0, "beta": 60.0, "base": 0.5,
                                                         "margin": 0.2}
    for bad in (0, -1.0, float("inf"), float("nan"), True, "0.1"):
        with pytest.raises(UserError, match="temperature"):
            MirrorInfoNCE(bad)
        with pytest.raises(UserError, match="temperature"):
            build_loss("ms", bad)


# ----------------------------------------------------------------------------- multi-similarity (SapBERT)
def pml_multi_similarity(emb: torch.Tensor) -> tuple[torch.Tensor, int]:
    """pytorch-metric-learning as SapBERT calls it; labels: the two views of string i share label i."""
    from pytorch_metric_learning import losses, miners

    labels = torch.arange(emb.shape[0] // 2).repeat(2)
    miner = miners.TripletMarginMiner(margin=0.2, type_of_triplets="all")
    loss = losses.MultiSimilarityLoss(alpha=1, beta=60, base=0.5)
    triplets = miner(emb, labels)
    return loss(emb, labels, triplets), len(triplets[0])


def _clustered(batch: int, dim: int, noise: float, seed: int) -> torch.Tensor:
    """Views of a string = its centre plus noise: small noise leaves some anchors with no violating triplet."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    return torch.cat([centres + noise * torch.randn(batch, dim, generator=g, dtype=torch.float64),
                      centres + noise * torch.randn(batch, dim, generator=g, dtype=torch.float64)])


@pytest.mark.parametrize("batch,dim,noise,seed", [(4, 6, 1.0, 0), (8, 16, 0.6, 1), (6, 3, 0.5, 2), (16, 32, 2.0, 3), (50, 8, 0.2, 4)])
def test_ms_loss_value_and_gradient_equal_pytorch_metric_learning(batch, dim, noise, seed):
    emb = _clustered(batch, dim, noise, seed)
    ours_in = emb.clone().requires_grad_(True)
    ref_in = emb.clone().requires_grad_(True)
    ours = MirrorMultiSimilarity()(ours_in)
    ref, n_triplets = pml_multi_similarity(ref_in)
    assert n_triplets > 1  # the library returns 0 for a single triplet; these cases mine several
    ours.backward()
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-10, abs=1e-12)
    assert torch.allclose(ours_in.grad, ref_in.grad, rtol=1e-9, atol=1e-12)
    assert ours_in.grad.abs().sum() > 0


def test_ms_loss_is_zero_when_the_miner_finds_no_triplet():
    eye = torch.eye(5, dtype=torch.float64)
    emb = torch.cat([eye, eye]).requires_grad_(True)  # cos(a, mirror) = 1, cos(a, other) = 0: margin 1 > 0.2
    ref_in = emb.detach().clone().requires_grad_(True)
    ours = MirrorMultiSimilarity()(emb)
    ref, n_triplets = pml_multi_similarity(ref_in)
    assert n_triplets == 0
    ours.backward()
    ref.backward()
    assert ours.item() == ref.item() == 0.0
    assert torch.equal(emb.grad, torch.zeros_like(emb)) and torch.equal(ref_in.grad, torch.zeros_like(emb))


def test_training_with_ms_loss_lowers_it(tiny_bert, corpus, tmp_path):
    """A short run on a tiny BERT: the multi-similarity loss of fixed views falls (eval mode, no dropout)."""
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.mirror.train import train
    from mirrorbert.mirror.views import SecondViews, tokenize_once

    data = tmp_path / "s.txt"
    data.write_text("\n".join(corpus) + "\n", encoding="utf-8")

    def ms_of(model) -> float:
        enc = Encoder.load(str(model), pooling="mean", device="cpu")  # CLS of a random tiny BERT is ~constant
        enc.eval()
        ids = tokenize_once(enc.tokenizer, corpus, 16)
        second = SecondViews.from_lists(enc.tokenizer, corpus, ids, "char", 3, 20, 16).views_for(range(len(ids)), 0, 0)
        with torch.no_grad():
            return MirrorMultiSimilarity()(enc.embed(ids + second)).item()

    cfg = TrainConfig(model=str(tiny_bert), data=str(data), output=str(tmp_path / "out"), batch_size=6,
                      max_length=16, steps=12, lr=1e-3, loss="ms", mask_span=3, mask_min_chars=20,
                      pooling="mean", show_progress=False)
    result = train(cfg)
    before, after = ms_of(tiny_bert), ms_of(tmp_path / "out")
    assert result.info["config"]["loss"] == "ms"
    assert after < 0.5 * before, (before, after)
