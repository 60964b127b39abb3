"""Second views made per batch: a string's view is a function of (seed, epoch, string index) alone."""

import random

import pytest
from transformers import AutoTokenizer

from mirrorbert.data.strings import fingerprint, training_strings
from mirrorbert.data.readers import chunked
from mirrorbert.data.token_store import StoreStrings, open_token_store
from mirrorbert.mirror.train import training_store
from mirrorbert.mirror.views import SecondViews, tokenize_once

LONG = ["a man is playing a guitar on the stage tonight", "two children are playing football in the garden",
        "scientists discovered a new species of frog", "she read a book about ancient history"]


def _batches(n, size, rng):
    order = list(range(n))
    rng.shuffle(order)
    return [order[i:i + size] for i in range(0, n, size)]


@pytest.mark.parametrize("unit,k,min_chars", [("char", 3, 10), ("token", 2, 0)])
@pytest.mark.parametrize("which", ["tiny_bert", "tiny_roberta"])
def test_a_view_depends_only_on_seed_epoch_and_index(request, which, unit, k, min_chars, corpus):
    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(which))
    strings = list(corpus) + LONG
    views = SecondViews.from_lists(tok, strings, tokenize_once(tok, strings, 16), unit, k, min_chars, 16)
    n, whole = len(strings), {}
    for epoch in (0, 1):
        whole[epoch] = views.views_for(range(n), 5, epoch)
        for size in (1, 3, 7):  # any batch, any place in it, any batch size: the same view
            for batch in _batches(n, size, random.Random(size)):
                assert views.views_for(batch, 5, epoch) == [whole[epoch][i] for i in batch]
    assert whole[0] != whole[1]  # a fresh draw each epoch
    assert views.views_for(range(n), 6, 0) != whole[0]  # and each seed
    assert sum(v.count(tok.mask_token_id) > 0 for v in whole[0]) >= n // 2


def test_views_over_the_store_equal_views_over_lists(tiny_bert, corpus, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    strings = list(corpus) + LONG
    store = open_token_store(chunked(strings, 4), fingerprint(strings), tok, 16, tmp_path)
    listed = SecondViews.from_lists(tok, strings, tokenize_once(tok, strings, 16), "char", 3, 10, 16)
    stored = SecondViews(tok, store, "char", 3, 10, 16)
    batch = [9, 2, 14, 0]
    assert stored.views_for(batch, 1, 2) == listed.views_for(batch, 1, 2)
    assert stored.stats == listed.stats and stored.stats.masked_strings > 0


def test_the_run_keeps_the_store_not_a_list_of_strings(tiny_bert, corpus, tmp_path, caplog):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    strings = training_strings(list(corpus) + ["\u200b"], "t.txt", 0, None, 0)
    store = training_store(strings, tok, 16)
    assert isinstance(strings.strings, StoreStrings) and list(strings.strings) == list(corpus)
    assert strings.n_blank == 1 and "1 string(s) give no tokens" in caplog.text
    assert strings.summary()["strings"] == len(corpus)
    assert training_store(strings, tok, 16) is store and strings.n_blank == 1  # the same object again
