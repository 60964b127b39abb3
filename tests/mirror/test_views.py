"""Span masking, padding, dropout configuration and drophead."""

from collections import Counter

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from mirrorbert.errors import UserError
from mirrorbert.runtime.randomness import derived_generator
from mirrorbert.encoder.dropout import DropHead, dropout_overrides
from mirrorbert.mirror.views import mask_span, special_token_ids, tokenize_once, valid_span_starts
from mirrorbert.encoder.batching import pad_batch


def masked_views(token_ids, k, mask_id, special, generator):
    """Token-unit second views of a batch, one uniform draw per string from `generator`, in order."""
    draws = torch.rand(len(token_ids), generator=generator).tolist()
    return [mask_span(ids, k, mask_id, special, u) for ids, u in zip(token_ids, draws)]


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_masking_replaces_exactly_k_consecutive_non_special_tokens(request, which, k, corpus):
    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(which))
    special = special_token_ids(tok)
    ids = tokenize_once(tok, corpus, max_length=50)
    views = masked_views(ids, k, tok.mask_token_id, special, torch.Generator().manual_seed(0))
    for original, masked in zip(ids, views):
        assert len(original) == len(masked)
        changed = [i for i, (a, b) in enumerate(zip(original, masked)) if a != b or b == tok.mask_token_id]
        n_real = sum(t not in special for t in original)
        if n_real <= k:
            assert masked == original
            continue
        assert len(changed) == k and changed == list(range(changed[0], changed[0] + k))
        assert all(masked[i] == tok.mask_token_id for i in changed)
        assert all(original[i] not in special for i in changed)
    assert tok.mask_token in ("[MASK]", "<mask>")


def test_first_view_is_untouched_and_short_strings_stay_unmasked(tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    ids = tokenize_once(tok, ["the cat sat", "dog"], 25)
    copy = [list(x) for x in ids]
    views = masked_views(ids, 3, tok.mask_token_id, special_token_ids(tok), torch.Generator().manual_seed(1))
    assert ids == copy
    assert views[0] == ids[0] and views[1] == ids[1]  # 3 and 1 real tokens: <= k


def test_span_start_is_uniform_over_valid_starts():
    special = {0, 1}
    ids = [0, 10, 11, 12, 13, 14, 15, 1]  # 6 real tokens, k=2 -> starts 1..5
    assert valid_span_starts(ids, 2, special) == [1, 2, 3, 4, 5]
    gen = torch.Generator().manual_seed(0)
    counts = Counter(mask_span(ids, 2, 99, special, float(u)).index(99) for u in torch.rand(5000, generator=gen))
    assert set(counts) == {1, 2, 3, 4, 5}
    assert all(abs(c / 5000 - 0.2) < 0.03 for c in counts.values())


def test_fresh_draw_every_epoch_reproducible_from_seed(tiny_bert, corpus):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    ids = tokenize_once(tok, corpus, 50)
    special = special_token_ids(tok)
    e0 = masked_views(ids, 1, tok.mask_token_id, special, derived_generator(7, 2, 0))
    e0_again = masked_views(ids, 1, tok.mask_token_id, special, derived_generator(7, 2, 0))
    e1 = masked_views(ids, 1, tok.mask_token_id, special, derived_generator(7, 2, 1))
    assert e0 == e0_again and e0 != e1


def test_pad_batch_pads_to_the_longest_only():
    batch = pad_batch([[5, 6, 7], [5]], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_dropout_overrides_use_the_config_names(tiny_bert):
    cfg = AutoConfig.from_pretrained(tiny_bert)
    assert dropout_overrides(cfg, 0.3) == {"hidden_dropout_prob": 0.3, "attention_probs_dropout_prob": 0.3}


def test_dropout_overrides_error_for_unknown_architecture():
    class Strange:
        model_type = "strange"

    with pytest.raises(UserError, match="--dropout"):
        dropout_overrides(Strange(), 0.1)


def test_drophead_zeroes_whole_heads_and_rescales(tiny_bert):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_bert, attn_implementation="eager")
    captured = []
    attn = [m for m in model.modules() if type(m).__name__ == "BertSelfAttention"][0]
    drop = DropHead(model, 0.5)
    attn.register_forward_hook(lambda m, i, o: captured.append(o[0].detach()))  # runs after DropHead's hook
    model.train()
    for m in model.modules():  # isolate drophead from ordinary dropout
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = torch.randint(5, 100, (8, 6))
    torch.manual_seed(0)
    model(input_ids=x)
    dropped = captured[-1].view(8, 6, 2, 16)
    drop.remove()
    torch.manual_seed(0)
    model(input_ids=x)
    plain = captured[-1].view(8, 6, 2, 16)
    per_head_zero = (dropped == 0).all(dim=(1, 3))
    assert per_head_zero.any() and not per_head_zero.all()
    kept = ~per_head_zero
    ratio = dropped.permute(0, 2, 1, 3)[kept] / plain.permute(0, 2, 1, 3)[kept]
    assert torch.allclose(ratio, torch.full_like(ratio, 2.0), atol=1e-4)
    model.eval()


def test_drophead_rejects_unsupported_architecture():
    with pytest.raises(UserError, match="--drophead is not supported"):
        DropHead(torch.nn.Linear(3, 3), 0.1)
