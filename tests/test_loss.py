"""The Mirror-BERT loss against a plain, loop-based reading of the paper's eq. 1."""

import math

import pytest
import torch

from mirrorbert.loss import mirror_infonce


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
    ours = mirror_infonce(a, tau)
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
    assert mirror_infonce(perfect, tau).item() == pytest.approx(expected, rel=1e-5)
    swapped = torch.cat([eye, eye[[1, 0, 3, 2]]])
    assert mirror_infonce(swapped, tau) > mirror_infonce(perfect, tau)


def test_loss_rejects_odd_batches():
    with pytest.raises(ValueError):
        mirror_infonce(torch.randn(5, 3), 0.1)
