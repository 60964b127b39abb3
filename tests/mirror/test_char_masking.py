"""Character span masking as the authors ran Mirror-BERT, and the masking shares reported after training."""

import json
from collections import Counter

import pytest
import torch
from transformers import AutoTokenizer

from mirrorbert.mirror.config import TrainConfig, resolve_config
from mirrorbert.data.strings import load_training_strings
from mirrorbert.runtime.randomness import derived_generator, index_uniforms
from mirrorbert.mirror.views import STREAM_MASK, STREAM_ORDER
from mirrorbert.training.plan import BatchPlan
from mirrorbert.mirror.train import train
from mirrorbert.mirror.views import (
    SecondViews, char_starts_from_draws, mask_chars, special_token_ids, tokenize_once,
)

LONG = [
    "a man is playing a guitar on the stage tonight",
    "two children are playing football in the garden",
    "scientists discovered a new species of frog",
    "the quick brown fox jumps over the lazy dog",
    "she read a book about ancient history",
]


@pytest.mark.parametrize("which,mask_text", [("tiny_bert", "[MASK]"), ("tiny_roberta", "<mask>")])
@pytest.mark.parametrize("k", [2, 5])
def test_one_mask_token_of_the_models_own_tokenizer_at_the_drawn_span(request, which, mask_text, k, corpus):
    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(which))
    assert tok.mask_token == mask_text
    strings = list(corpus) + LONG
    ids = tokenize_once(tok, strings, 50)
    views = SecondViews.from_lists(tok, strings, ids, "char", k, 30, 50).views_for(range(len(strings)), 3, 0)
    starts = char_starts_from_draws(strings, k, 30, index_uniforms(3, (STREAM_MASK, 0), range(len(strings))))
    assert sum(s is not None for s in starts) >= 5
    for text, original, view, start in zip(strings, ids, views, starts):
        if start is None:
            assert len(text) <= 30 and view == original
            continue
        masked = mask_chars(text, start, k, tok.mask_token)
        assert masked[:start] == text[:start] and masked[start + len(mask_text):] == text[start + k:]
        assert view.count(tok.mask_token_id) == 1
        assert view == tokenize_once(tok, [masked], 50)[0]
        if which == "tiny_roberta":  # byte-level BPE is lossless: the view decodes to the masked string
            # (transformers 4.x gives RoBERTa's <mask> lstrip: it takes the space before it, as in pre-training)
            if getattr(tok.added_tokens_decoder.get(tok.mask_token_id), "lstrip", False):
                masked = masked.replace(" " + mask_text, mask_text)
            assert tok.decode(view, skip_special_tokens=False) == "<s>" + masked + "</s>"


def generator_draws(n: int, seed: int) -> list[float]:
    """Uniform draws of a seeded generator, as the sentence-transformers collator draws them."""
    return torch.rand(n, generator=derived_generator(seed, STREAM_MASK, 0)).tolist()


def test_never_masks_strings_up_to_the_minimum(corpus):
    strings = ["x" * 30, "y" * 31, "short", "z" * 12]
    starts = char_starts_from_draws(strings * 50, 5, 30, generator_draws(200, 0))
    assert all(s is None for i, s in enumerate(starts) if i % 4 != 1)
    assert all(s is not None and 0 <= s <= 26 for i, s in enumerate(starts) if i % 4 == 1)
    # with no minimum, a string must still be longer than the span
    assert char_starts_from_draws(["abcde", "abcdef"], 5, 0, generator_draws(2, 0))[0] is None
    assert char_starts_from_draws(["abc"], 0, 0, generator_draws(1, 0)) == [None]


def test_span_start_is_uniform_over_all_valid_starts():
    """Pearson chi-square over the 36 starts of a 40-character string (k = 5), fixed seed."""
    from scipy.stats import chi2

    text, k, per_start = "0123456789" * 4, 5, 300
    n_starts = len(text) - k + 1
    n = n_starts * per_start
    per_generator = char_starts_from_draws([text] * n, k, 30, generator_draws(n, 11))  # the ST collator's
    per_index = char_starts_from_draws([text] * n, k, 30, index_uniforms(11, (STREAM_MASK, 0), range(n)))  # train's
    for draws in (per_generator, per_index):
        counts = Counter(draws)
        assert set(counts) == set(range(n_starts))  # the last start (len - k) included, nothing beyond it
        statistic = sum((counts[s] - per_start) ** 2 / per_start for s in range(n_starts))
        assert statistic < chi2.ppf(0.999, n_starts - 1)


def test_token_unit_masks_k_real_tokens_and_reports_k_per_masked_string(tiny_bert, corpus):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    ids = tokenize_once(tok, corpus, 50)
    views = SecondViews.from_lists(tok, corpus, ids, "token", 2, 30, 50)
    drawn = views.views_for(range(len(corpus)), 5, 0)
    special = special_token_ids(tok)
    for view, original in zip(drawn, ids):  # k consecutive real tokens became mask tokens, nothing else changed
        changed = [p for p, (a, b) in enumerate(zip(view, original)) if a != b]
        assert len(view) == len(original) and len(changed) == 2 and changed[1] == changed[0] + 1
        assert all(view[p] == tok.mask_token_id and original[p] not in special for p in changed)
    masked = sum(v != o for v, o in zip(drawn, ids))
    real = sum(t not in special for row in ids for t in row)
    assert views.stats.shares() == {"masked_token_share": round(2 * masked / real, 6),
                                    "masked_string_share": round(masked / len(corpus), 6)}


def test_char_unit_counts_the_original_tokens_the_span_overlaps(tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    text = "the cat sat on the mat and the dog ran in the park"
    ids = tokenize_once(tok, [text, "dog"], 50)
    views = SecondViews.from_lists(tok, [text, "dog"], ids, "char", 5, 30, 50)
    views.views_for([0, 1], 0, 0)
    start = char_starts_from_draws([text, "dog"], 5, 30, index_uniforms(0, (STREAM_MASK, 0), [0, 1]))[0]
    offsets = tok(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    expected = sum(1 for a, b in offsets if a < start + 5 and b > start)
    real = len(ids[0]) - 2 + len(ids[1]) - 2
    assert expected >= 1
    assert (views.stats.masked_tokens, views.stats.masked_strings, views.stats.real_tokens) == (expected, 1, real)


def test_sentence_preset_hides_what_the_authors_procedure_hides(shared_data):
    """On the paper's 10k STS-B training sentences: 10-16% of real tokens, 80-92% of strings."""
    cfg = resolve_config({"preset": "sentence"})
    strings = load_training_strings(data=str(shared_data / "corpora" / "stsbenchmark_train_10k_sents_random_sampled.txt"))
    tok = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "bert-base-uncased")
    ids = tokenize_once(tok, strings.strings, cfg.max_length)
    views = SecondViews.from_lists(tok, strings.strings, ids, cfg.mask_unit, cfg.mask_span, cfg.mask_min_chars,
                                   cfg.max_length)
    drawn = views.views_for(range(len(ids)), cfg.seed, 0)
    shares = views.stats.shares()
    assert 0.10 <= shares["masked_token_share"] <= 0.16, shares
    assert 0.80 <= shares["masked_string_share"] <= 0.92, shares
    assert max(v.count(tok.mask_token_id) for v in drawn) == 1


def test_train_writes_the_masking_shares_of_every_epoch(tiny_bert, corpus, tmp_path):
    data = tmp_path / "s.txt"
    data.write_text("\n".join(corpus + LONG) + "\n", encoding="utf-8")
    cfg = TrainConfig(model=str(tiny_bert), data=str(data), output=str(tmp_path / "out"), batch_size=6,
                      max_length=16, epochs=2, mask_span=3, mask_unit="char", seed=4, show_progress=False)
    result = train(cfg)
    meta = json.loads((tmp_path / "out" / "mirrorbert.json").read_text())["training"]
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    strings = load_training_strings(data=str(data)).strings
    expected = SecondViews.from_lists(tok, strings, tokenize_once(tok, strings, 16), "char", 3, 30, 16)
    plan = BatchPlan(len(strings), 6, 4, STREAM_ORDER)
    for epoch in range(2):  # the shares of the batches trained (a trailing single string is never trained)
        for batch in plan.iter_batches(epoch):
            expected.views_for(batch, 4, epoch)
    assert result.info["masked_token_share"] == meta["masked_token_share"] == expected.stats.shares()["masked_token_share"]
    assert meta["masked_string_share"] == expected.stats.shares()["masked_string_share"]
    assert 0 < meta["masked_token_share"] < 1 and 0 < meta["masked_string_share"] < 1


@pytest.mark.parametrize("depth", [0, 2])
def test_views_made_ahead_but_never_trained_are_not_counted(tiny_bert, corpus, tmp_path, monkeypatch, depth):
    """On a GPU the views are made a few batches ahead in a thread (on a CPU inline); a run stopped by --steps
    counts only its own."""
    from mirrorbert.mirror import step

    monkeypatch.setattr(step, "prefetch_depth", lambda device: depth)
    data = tmp_path / "s.txt"
    data.write_text("\n".join(corpus + LONG) + "\n", encoding="utf-8")
    cfg = TrainConfig(model=str(tiny_bert), data=str(data), output=str(tmp_path / "out"), batch_size=2,
                      max_length=16, steps=2, mask_span=3, mask_unit="char", seed=9, show_progress=False)
    result = train(cfg)
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    strings = load_training_strings(data=str(data)).strings
    expected = SecondViews.from_lists(tok, strings, tokenize_once(tok, strings, 16), "char", 3, 30, 16)
    batches = list(BatchPlan(len(strings), 2, 9, STREAM_ORDER).iter_batches(0))
    assert len(batches) > 2 + 2  # more batches than trained exist to be made ahead
    for batch in batches[:2]:
        expected.views_for(batch, 9, 0)
    assert result.info["masked_token_share"] == expected.stats.shares()["masked_token_share"]
    assert result.info["masked_string_share"] == expected.stats.shares()["masked_string_share"]
