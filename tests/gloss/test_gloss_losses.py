"""GR-BERT losses and model against plain, independent computations."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from mirrorbert.gloss.model import (
    GlossRegularizedMLM,
    collate,
    cosine_logits,
    encode_triplets,
    gloss_candidates,
    gloss_infonce,
    gloss_matching_accuracy,
    masked_lm_loss,
    pick_hard_negative,
)
from mirrorbert.encoder.masked_lm import span_token_positions
from mirrorbert.gloss.triplets import Triplet, find_target_span


def _np_cos(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def _np_ce(logits, target):
    row = logits - logits.max()
    return -(row[target] - math.log(np.exp(row).sum()))


def test_cosine_logits_and_infonce_match_numpy():
    rng = np.random.default_rng(0)
    q, e = rng.normal(size=(4, 6)), rng.normal(size=(7, 6))
    targets = np.array([0, 3, 2, 6])
    tau = 0.05
    sims = _np_cos(q, e) / tau
    got = cosine_logits(torch.tensor(q), torch.tensor(e), tau).numpy()
    np.testing.assert_allclose(got, sims, rtol=1e-5, atol=1e-4)
    expected = np.mean([_np_ce(sims[i], targets[i]) for i in range(4)])
    loss = gloss_infonce(torch.tensor(q), torch.tensor(e), torch.tensor(targets), tau).item()
    assert loss == pytest.approx(expected, rel=1e-5)


def test_masked_lm_loss_matches_manual_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5, 9))
    labels = np.full((2, 5), -100)
    labels[0, 1], labels[1, 3], labels[1, 4] = 4, 0, 8
    expected = np.mean([_np_ce(logits[0, 1], 4), _np_ce(logits[1, 3], 0), _np_ce(logits[1, 4], 8)])
    got = masked_lm_loss(torch.tensor(logits), torch.tensor(labels)).item()
    assert got == pytest.approx(expected, rel=1e-6)
    none = masked_lm_loss(torch.tensor(logits), torch.full((2, 5), -100))
    assert none.item() == 0.0


def test_gloss_candidates_dedupes_and_targets():
    cands, targets = gloss_candidates(["g1", "g2", "g1"], ["g3", None, "g2"])
    assert cands == ["g1", "g2", "g3"]
    assert targets == [0, 1, 0]


def test_pick_hard_negative_is_another_gloss_of_the_word():
    inv = {"bank": ["money place", "river side", "tilt"], "cat": ["feline"]}
    rng = random.Random(0)
    picks = {pick_hard_negative("Bank", "river side", inv, rng) for _ in range(50)}
    assert picks == {"money place", "tilt"}
    assert pick_hard_negative("cat", "feline", inv, rng) is None
    assert pick_hard_negative("dog", "canine", inv, rng) is None


# --------------------------------------------------------------------------- model
TRIPLETS = [
    Triplet("dog", "the dog ran in the park", "a domestic animal", 4, 7),
    Triplet("park", "a dog ran in the park", "a public garden", 17, 21),
    Triplet("guitar", "a man is playing a guitar", "a string instrument", 19, 25),
    Triplet("bank", "the bank raised interest rates again", "a financial institution", 4, 8),
]
INVENTORY = {"bank": ["a financial institution", "sloping land by a river"], "dog": ["a domestic animal"]}


@pytest.fixture(scope="module")
def tok_and_mlm(tiny_bert):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert), AutoModelForMaskedLM.from_pretrained(tiny_bert)


def test_span_token_positions_with_offsets():
    offsets = [(0, 0), (0, 3), (4, 7), (7, 9), (10, 12), (0, 0)]
    special = [1, 0, 0, 0, 0, 1]
    assert span_token_positions(offsets, special, 4, 9) == [2, 3]
    assert span_token_positions(offsets, special, 20, 25) == []


def test_collate_masks_exactly_the_target(tok_and_mlm):
    tok, _ = tok_and_mlm
    enc = encode_triplets(tok, TRIPLETS)
    batch = collate(enc, TRIPLETS, tok, inventory=INVENTORY, rng=random.Random(0))
    for i, t in enumerate(TRIPLETS):
        ids = tok(t.sentence)["input_ids"]
        target_ids = tok(t.surface, add_special_tokens=False)["input_ids"]
        row_mask = batch.target_mask[i, : len(ids)].tolist()
        assert [x for x, m in zip(ids, row_mask) if m] == target_ids
        assert batch.full_ids[i, : len(ids)].tolist() == ids
        ctx = batch.context_ids[i, : len(ids)].tolist()
        assert [c for c, m in zip(ctx, row_mask) if m] == [tok.mask_token_id] * len(target_ids)
        assert [c for c, m in zip(ctx, row_mask) if not m] == [x for x, m in zip(ids, row_mask) if not m]
        assert batch.mlm_labels[i][batch.target_mask[i]].tolist() == target_ids
        assert (batch.mlm_labels[i][~batch.target_mask[i]] == -100).all()
    # 4 positives + one hard negative (bank's other gloss); dog's only gloss gives none.
    assert batch.gloss_ids.shape[0] == 5 and batch.n_hard == 1
    assert batch.targets.tolist() == [0, 1, 2, 3]


def _reference_losses(tiny_bert, batch, enc1_state, enc2_state, gloss_state, arch, tau, lam):
    """Recompute the losses with freshly loaded HF models and full forward passes."""
    from transformers import AutoModel, AutoModelForMaskedLM

    def load_mlm(state):
        m = AutoModelForMaskedLM.from_pretrained(tiny_bert).eval()
        m.load_state_dict(state)
        return m

    enc1 = load_mlm(enc1_state)
    gloss = AutoModel.from_pretrained(tiny_bert).eval()
    res = gloss.load_state_dict(gloss_state, strict=False)
    assert not res.unexpected_keys and all(k.startswith("pooler") for k in res.missing_keys)
    with torch.no_grad():
        lab = batch.mlm_labels.numpy()
        logits1 = enc1(input_ids=batch.context_ids, attention_mask=batch.attention_mask).logits.numpy()
        pos = np.argwhere(lab != -100)
        mlm1 = np.mean([_np_ce(logits1[i, j], lab[i, j]) for i, j in pos])

        def hmean(model, ids):
            h = model(input_ids=ids, attention_mask=batch.attention_mask, output_hidden_states=True).hidden_states[-1]
            h = h.numpy()
            m = batch.target_mask.numpy()
            return np.stack([h[i][m[i]].mean(0) for i in range(h.shape[0])])

        e = gloss(input_ids=batch.gloss_ids, attention_mask=batch.gloss_attention).last_hidden_state[:, 0].numpy()
        if arch == "mt":
            query = hmean(enc1, batch.full_ids)
            mlm2 = 0.0
        else:
            enc2 = load_mlm(enc2_state)
            logits2 = enc2(input_ids=batch.context_ids, attention_mask=batch.attention_mask).logits.numpy()
            mlm2 = np.mean([_np_ce(logits2[i, j], lab[i, j]) for i, j in pos])
            query = hmean(enc2, batch.full_ids) - hmean(enc1, batch.context_ids)
        sims = _np_cos(query, e) / tau
        gr = np.mean([_np_ce(sims[i], t) for i, t in enumerate(batch.targets.tolist())])
    return mlm1, mlm2, gr, mlm1 + mlm2 + lam * gr


@pytest.mark.parametrize("arch", ["mt", "sc"])
def test_model_losses_match_plain_computation(tiny_bert, tok_and_mlm, arch):
    from transformers import AutoModelForMaskedLM

    tok, _ = tok_and_mlm
    mlm = AutoModelForMaskedLM.from_pretrained(tiny_bert)
    model = GlossRegularizedMLM.from_mlm(mlm, arch=arch, lam=2.0, tau=0.05).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # make the copies differ so a mix-up of encoders would show
        for p in model.gloss_encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if arch == "sc":
            for p in model.context2.parameters():
                p.add_(0.05 * torch.randn_like(p))
    enc = encode_triplets(tok, TRIPLETS)
    batch = collate(enc, TRIPLETS, tok, inventory=INVENTORY, rng=random.Random(0))
    out = model(batch)
    ref = _reference_losses(
        tiny_bert, batch, model.context.state_dict(),
        model.context2.state_dict() if arch == "sc" else None,
        model.gloss_encoder.state_dict(), arch, 0.05, 2.0,
    )
    assert out.mlm.item() == pytest.approx(ref[0], rel=1e-4)
    if arch == "sc":
        assert out.mlm2.item() == pytest.approx(ref[1], rel=1e-4)
    assert out.gr.item() == pytest.approx(ref[2], rel=1e-4)
    assert out.loss.item() == pytest.approx(ref[3], rel=1e-4)
    # Gradients reach every encoder that takes part in the loss.
    model.train()
    model(batch).loss.backward()
    parts = [model.context, model.gloss_encoder] + ([model.context2] if arch == "sc" else [])
    for part in parts:
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())


def test_sc_saves_only_enc2(tiny_bert, tok_and_mlm, tmp_path):
    from transformers import AutoModelForMaskedLM

    tok, _ = tok_and_mlm
    model = GlossRegularizedMLM.from_mlm(AutoModelForMaskedLM.from_pretrained(tiny_bert), arch="sc")
    with torch.no_grad():
        for p in model.context2.parameters():
            p.add_(0.1)
    model.save_inference(tmp_path / "out", tok)
    weights = [p.name for p in (tmp_path / "out").iterdir() if p.suffix in (".safetensors", ".bin")]
    assert weights == ["model.safetensors"]
    back = AutoModelForMaskedLM.from_pretrained(tmp_path / "out")
    assert type(back).__name__ == "BertForMaskedLM"
    name = "bert.encoder.layer.0.attention.self.query.weight"
    saved = back.state_dict()[name]
    assert torch.equal(saved, model.context2.state_dict()[name])
    assert not torch.equal(saved, model.context.state_dict()[name])
    assert sum(p.numel() for p in back.parameters()) == sum(p.numel() for p in model.context2.parameters())


def test_roberta_forward_and_heldout_accuracy(tiny_roberta):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_roberta)
    model = GlossRegularizedMLM.from_mlm(AutoModelForMaskedLM.from_pretrained(tiny_roberta), arch="mt")
    enc = encode_triplets(tok, TRIPLETS)
    assert len(enc) == len(TRIPLETS)
    out = model(collate(enc, TRIPLETS, tok, inventory=INVENTORY))
    assert torch.isfinite(out.loss)
    res = gloss_matching_accuracy(model, tok, TRIPLETS, enc)
    assert res["n_glosses"] == 4 and 0.0 <= res["accuracy"] <= 1.0
    # Check the argmax definition directly.
    with torch.no_grad():
        model.eval()
        b = collate(enc, TRIPLETS, tok)
        q = model.queries(b).numpy()
        g = tok([t.gloss for t in TRIPLETS], padding=True, return_tensors="pt")
        e = model.encode_glosses(g["input_ids"], g["attention_mask"]).numpy()
    expected = float(np.mean(_np_cos(q, e).argmax(1) == np.arange(4)))
    assert res["accuracy"] == pytest.approx(expected)


def test_find_span_then_tokens_for_multiword():
    s = "she looked after the children"
    span = find_target_span(s, "look_after", "v")
    assert s[span[0]:span[1]] == "looked after"
