"""MLM masking: selection rate, the 80/10/10 split, special/padding tokens, whole-word grouping."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from mirrorbert.errors import UserError
from mirrorbert.mlm.masking import IGNORE_INDEX, MlmMasker, continuation_table


def word_ids_tensor(encodings_word_ids, length: int) -> torch.Tensor:
    """The tokenizer's own `word_ids()` lists (None for specials) as a padded [batch, length] tensor: the
    reference the masker's word grouping is compared with."""
    out = torch.full((len(encodings_word_ids), length), -1, dtype=torch.long)
    for row, ids in enumerate(encodings_word_ids):
        values = [-1 if w is None else int(w) for w in list(ids)[:length]]
        out[row, : len(values)] = torch.tensor(values, dtype=torch.long)
    return out


def canonical_word_ids(word_ids: torch.Tensor, selectable: torch.Tensor) -> torch.Tensor:
    """The tokenizer's word ids renumbered 0, 1, 2... per row, a new word wherever the id changes or the previous
    position is not selectable (so the two segments of a pair never merge): the masker's numbering."""
    word_ids = word_ids.long()
    valid = selectable & (word_ids >= 0)
    prev = torch.full_like(word_ids, -1)
    prev[:, 1:] = word_ids[:, :-1]
    prev_valid = torch.zeros_like(valid)
    prev_valid[:, 1:] = valid[:, :-1]
    starts = valid & ((word_ids != prev) | ~prev_valid)
    words = torch.cumsum(starts.long(), dim=1) - 1
    return torch.where(valid, words, torch.full_like(words, -1))


@pytest.fixture(scope="module")
def bert_tok(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def roberta_tok(tiny_roberta):
    return AutoTokenizer.from_pretrained(tiny_roberta)


def _random_batch(tok, rows=64, length=256, seed=0):
    """Random ordinary tokens framed by [CLS] ... [SEP], with a padded tail on every other row."""
    g = torch.Generator().manual_seed(seed)
    special = set(tok.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tok)) if i not in special])
    ids = ordinary[torch.randint(len(ordinary), (rows, length), generator=g)]
    att = torch.ones_like(ids)
    ids[:, 0] = tok.cls_token_id
    for r in range(rows):
        end = length - 1 if r % 2 == 0 else length // 2
        ids[r, end] = tok.sep_token_id
        ids[r, end + 1 :] = tok.pad_token_id
        att[r, end + 1 :] = 0
    return ids, att, len(ordinary)


def _within(observed: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(observed - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_selection_rate_and_80_10_10_split(bert_tok):
    ids, att, n_ordinary = _random_batch(bert_tok)
    masker = MlmMasker.from_tokenizer(bert_tok)
    corrupted, labels = masker(ids, att, torch.Generator().manual_seed(1))

    selectable = (att == 1) & ~torch.isin(ids, torch.tensor(bert_tok.all_special_ids))
    selected = labels != IGNORE_INDEX
    n_sel, n_ok = int(selected.sum()), int(selectable.sum())
    assert _within(n_sel, n_ok, 0.15), (n_sel, n_ok)

    masked = selected & (corrupted == bert_tok.mask_token_id)
    unchanged = selected & (corrupted == ids)
    replaced = selected & (corrupted != ids) & (corrupted != bert_tok.mask_token_id)
    # A random replacement equals the original with probability 1/n_ordinary, so it then counts as unchanged.
    p_random_same = 0.1 / n_ordinary
    assert _within(int(masked.sum()), n_sel, 0.8)
    assert _within(int(replaced.sum()), n_sel, 0.1 - p_random_same)
    assert _within(int(unchanged.sum()), n_sel, 0.1 + p_random_same)
    # labels carry the original token at targets
    assert torch.equal(labels[selected], ids[selected])


def test_never_special_or_padding(bert_tok):
    ids, att, _ = _random_batch(bert_tok, seed=3)
    masker = MlmMasker.from_tokenizer(bert_tok, probability=0.9)
    corrupted, labels = masker(ids, att, torch.Generator().manual_seed(2))
    special = torch.isin(ids, torch.tensor(bert_tok.all_special_ids)) | (att == 0)
    assert special.any()
    assert (labels[special] == IGNORE_INDEX).all()
    assert torch.equal(corrupted[special], ids[special])
    # positions that are not targets are never touched
    assert torch.equal(corrupted[labels == IGNORE_INDEX], ids[labels == IGNORE_INDEX])
    # random replacements are never special tokens (the mask token is placed only by the 80% branch)
    specials_no_mask = torch.tensor([i for i in bert_tok.all_special_ids if i != bert_tok.mask_token_id])
    assert not torch.isin(corrupted[~special], specials_no_mask).any()


def test_seeded_and_reproducible(bert_tok):
    ids, att, _ = _random_batch(bert_tok, rows=8, length=64)
    masker = MlmMasker.from_tokenizer(bert_tok)
    a = masker(ids, att, torch.Generator().manual_seed(7))
    b = masker(ids, att, torch.Generator().manual_seed(7))
    c = masker(ids, att, torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def _word_groups(word_ids: torch.Tensor) -> dict[tuple[int, int], list[int]]:
    groups: dict[tuple[int, int], list[int]] = {}
    for r in range(word_ids.shape[0]):
        for c in range(word_ids.shape[1]):
            w = int(word_ids[r, c])
            if w >= 0:
                groups.setdefault((r, w), []).append(c)
    return groups


def test_whole_word_masking_bert(bert_tok):
    # words missing from the tiny vocab are split into characters: z ##e ##b ##r ##a
    words = ["zebra", "cat", "xylophone", "mat", "quokka", "dog", "wombat", "park"]
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(words[i] for i in torch.randint(len(words), (30,), generator=g).tolist()) for _ in range(64)]
    enc = bert_tok(texts, padding=True, return_tensors="pt")
    ref_words = word_ids_tensor([enc.word_ids(i) for i in range(len(texts))], enc["input_ids"].shape[1])
    masker = MlmMasker.from_tokenizer(bert_tok, whole_word=True)
    # the ## convention reproduces the tokenizer's own word ids
    ok = masker.selectable(enc["input_ids"], enc["attention_mask"])
    assert torch.equal(masker.word_ids(enc["input_ids"], ok), canonical_word_ids(ref_words, ok))

    _, labels = masker(enc["input_ids"], enc["attention_mask"], torch.Generator().manual_seed(5))
    groups = _word_groups(ref_words)
    assert any(len(cols) > 1 for cols in groups.values())
    chosen = 0
    for (r, _), cols in groups.items():
        states = {bool(labels[r, c] != IGNORE_INDEX) for c in cols}
        assert len(states) == 1, "a word was partly selected"
        chosen += states.pop()
    assert _within(chosen, len(groups), 0.15)


def test_whole_word_masking_roberta_matches_word_ids(roberta_tok):
    texts = ["the cat sat on the mat", "a dog ran in the park and the quick brown fox jumps over the lazy dog"]
    enc = roberta_tok(texts, padding=True, return_tensors="pt")
    masker = MlmMasker.from_tokenizer(roberta_tok, whole_word=True)
    ok = masker.selectable(enc["input_ids"], enc["attention_mask"])
    ref = canonical_word_ids(word_ids_tensor([enc.word_ids(i) for i in range(2)], enc["input_ids"].shape[1]), ok)
    assert torch.equal(masker.word_ids(enc["input_ids"], ok), ref)
    table = continuation_table(roberta_tok)
    assert not table[roberta_tok.convert_tokens_to_ids("\u0120cat")]


def test_tokenizer_without_mask_token_is_a_user_error(bert_tok):
    class NoMask:
        mask_token_id = None
        name_or_path = "no-mask-tokenizer"

    with pytest.raises(UserError, match="no mask token"):
        MlmMasker.from_tokenizer(NoMask())


def test_bad_probabilities_are_refused_by_the_config():
    from mirrorbert.mlm.config import PretrainConfig

    for probability in (0.0, 1.0):
        with pytest.raises(UserError, match="mlm_probability"):
            PretrainConfig(corpus=["c.txt"], model="m", mlm_probability=probability)
