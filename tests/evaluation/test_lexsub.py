"""Lexical substitution: loaders, official metrics on a hand-computed example, generation, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation.lexsub import GenerationConfig, LexSubGenerator, word_candidates
from mirrorbert.evaluation.lexsub_data import (
    LexSubItem,
    load_lexsub,
    parse_answer_line,
    read_gold,
    read_preprocessed,
    word_span,
    write_system_file,
)
from mirrorbert.evaluation.lexsub_scoring import normalize_answer, prepare_gold, score_lexsub
from mirrorbert.data.wordnet import WordNet


def read_system_file(path: Path) -> dict[tuple[str, str], list[str]]:
    """A system answer file in the official format, read as `score.pl` reads it (later duplicates ignored)."""
    out: dict[tuple[str, str], list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            lemma_pos, item_id, _, entries = parse_answer_line(line)
            out.setdefault((lemma_pos, item_id), [e.strip() for e in entries])
    return out


# --------------------------------------------------------------------------- hand-computed metrics
GOLD = """\
bright.a 1 :: intelligent 3;clever 3;smart 1;
bright.a 2 :: luminous 2;well-lit 1;clear 1;light 1;
side.n 3 :: team 5;
side.n 4 :: part 1;
side.n 5 :: pn 2;view 1;
light.n 6 ::  lamp 2;bulb 1;
"""
BEST = """\
bright.a 1 :: clever;smart
bright.a 2 :: well lit
side.n 3 :: team;side
side.n 4 :: part
light.n 6 :: 
"""
OOT_GUESSES_1 = ["clever", "smart"] + [f"zz{i}" for i in range(8)] + ["intelligent"]  # 11th guess is cut
OOT = f"""\
bright.a 1 ::: {';'.join(OOT_GUESSES_1)}
bright.a 2 ::: luminous;well-lit
side.n 3 ::: side;team
light.n 6 ::: bulb
"""


def test_official_metrics_on_hand_computed_example(tmp_path):
    (tmp_path / "g.gold").write_text(GOLD, encoding="utf-8")
    (tmp_path / "s.best").write_text(BEST, encoding="utf-8")
    (tmp_path / "s.oot").write_text(OOT, encoding="utf-8")
    gold = read_gold(tmp_path / "g.gold")
    best = read_system_file(tmp_path / "s.best")
    oot = read_system_file(tmp_path / "s.oot")
    assert gold[("bright.a", "2")] == {"luminous": 2, "well-lit": 1, "clear": 1, "light": 1}
    assert best[("light.n", "6")] == []
    s = score_lexsub(gold, best, oot)
    # Scored items: 1, 2, 3, 6 (item 4 has one response; item 5 one after dropping "pn").
    assert s.n_items == 4 and s.n_attempted == 3 and s.n_mode == 3  # item 1 has a tie: no mode
    best_sum = (3 + 1) / 2 / 7 + 1 / 1 / 5 + 5 / 2 / 5
    assert s.best_p == pytest.approx(100 * best_sum / 3)
    assert s.best_r == pytest.approx(100 * best_sum / 4)
    # Mode items answered: 2 (first guess "well lit" != luminous) and 3 (first guess team == mode).
    assert s.best_mode_p == pytest.approx(100 * 1 / 2)
    assert s.best_mode_r == pytest.approx(100 * 1 / 3)
    oot_sum = (3 + 1) / 7 + (2 + 1) / 5 + 5 / 5 + 1 / 3
    assert s.oot_p == pytest.approx(100 * oot_sum / 4)
    assert s.oot_r == pytest.approx(100 * oot_sum / 4)
    assert s.oot_mode_p == pytest.approx(100 * 2 / 3)  # modes of 2 and 3 found, lamp not
    assert s.oot_mode_r == pytest.approx(100 * 2 / 3)
    # P@k from the oot lists: item1 clever|clever,smart,zz0; item2 luminous|luminous,well lit;
    # item3 side|side,team; item6 bulb|bulb.
    assert s.p_at_1 == pytest.approx(100 * 3 / 4)
    assert s.p_at_3 == pytest.approx(100 * (2 / 3 + 2 / 3 + 1 / 3 + 1 / 3) / 4)


def test_prepare_gold_rules_and_normalisation():
    assert prepare_gold({"part": 1}) is None
    assert prepare_gold({"pn": 3, "view": 1}) is None
    g = prepare_gold({"team": 5})
    assert g.total == 5 and g.mode == "team"
    g = prepare_gold({"a b": 2, "cd": 2})
    assert g.mode is None
    assert normalize_answer("Non-Stop") == "nonstop"
    assert normalize_answer("o'clock") == "oclock"
    assert normalize_answer(" well-lit ") == "well lit"


def test_write_and_read_system_files_roundtrip(tmp_path):
    answers = {("side.n", "301"): ["team", "group"], ("bright.a", "2"): []}
    write_system_file(tmp_path / "x.oot", answers, oot=True)
    assert (tmp_path / "x.oot").read_text().splitlines()[0] == "side.n 301 ::: team;group"
    assert read_system_file(tmp_path / "x.oot") == answers


# --------------------------------------------------------------------------- loaders
PRE = "side.n\t301\t2\ton our side : provide more aid\nbright.a\t1\t1\ta bright student\ncat.n\t7\t1\tthe cat sat on the mat\n"
GOLD_FILE = "side.n 301 :: position 2;standpoint 1;\nbright.a 1 :: clever 3;smart 1;\n"


def write_lexsub(root: Path, pre: str = PRE, gold: str = GOLD_FILE) -> Path:
    d = root / "lexsub" / "LS07" / "test"
    d.mkdir(parents=True, exist_ok=True)
    (d / "lst_test.preprocessed").write_text(pre, encoding="utf-8")
    (d / "lst_test.gold").write_text(gold, encoding="utf-8")
    return root


def test_loaders_and_errors(tmp_path):
    root = write_lexsub(tmp_path)
    items = load_lexsub("LS07", root)
    assert [i.key for i in items] == [("side.n", "301"), ("bright.a", "1"), ("cat.n", "7")]
    it = items[0]
    assert it.target == "side" and it.lemma == "side" and it.pos == "n"
    s, e = word_span(it.tokens, it.index)
    assert " ".join(it.tokens)[s:e] == "side"
    assert dict(it.gold) == {"position": 2, "standpoint": 1}
    assert items[2].gold == ()
    assert LexSubItem("free.J", "1", ("free",), 0).pos == "a"
    with pytest.raises(DatasetMissing, match="LS14"):
        load_lexsub("CoInCo", root)
    with pytest.raises(UserError, match="unknown lexical substitution set"):
        load_lexsub("LS99", root)
    bad = tmp_path / "bad.preprocessed"
    bad.write_text("side.n\t301\t9\tshort sentence\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.preprocessed:1: target index 9"):
        read_preprocessed(bad)
    badg = tmp_path / "bad.gold"
    badg.write_text("side.n 301 :: team five;\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.gold:1: gold entry 'team five'"):
        read_gold(badg)


# --------------------------------------------------------------------------- generation
NOUNS = ["cat", "dog", "park", "mat", "garden", "book", "frog", "bank", "market", "history", "guitar", "fox", "man"]
VERBS = ["sit", "run", "play", "read"]


def write_small_wordnet(root: Path) -> Path:
    """A WordNet whose nouns are words of the tiny BERT vocabulary (one synset each)."""
    from support import LICENCE

    wn = root / "wordnet"
    wn.mkdir(parents=True, exist_ok=True)
    for pos, name, words in (("n", "noun", NOUNS), ("v", "verb", VERBS), ("a", "adj", ["quick", "lazy"]),
                             ("r", "adv", ["again"])):
        data, index = [LICENCE], [LICENCE]
        for k, w in enumerate(words):
            off = 1000 + k
            data.append(f"{off:08d} 03 {pos} 01 {w} 0 000 | the {w} thing  \n")
            index.append(f"{w} {pos} 1 0 1 0 {off:08d}  \n")
        (wn / f"data.{name}").write_text("".join(data), encoding="utf-8")
        (wn / f"index.{name}").write_text("".join(sorted(index, key=lambda l: (l != LICENCE, l))), encoding="utf-8")
    (wn / "verb.exc").write_text("sat sit\nran run\n", encoding="utf-8")
    (wn / "noun.exc").write_text("men man\n", encoding="utf-8")
    return root


@pytest.fixture()
def small_data(tmp_path):
    root = write_small_wordnet(tmp_path)
    write_lexsub(root)
    return root


@pytest.fixture(scope="module")
def tiny(tiny_bert):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return AutoModelForMaskedLM.from_pretrained(tiny_bert).eval(), AutoTokenizer.from_pretrained(tiny_bert)


def test_filter_candidates_lemma_pos_and_duplicates(small_data, tiny):
    model, tok = tiny
    wn = WordNet.load(small_data)
    gen = LexSubGenerator(model, tok, wn)
    item = LexSubItem("man.n", "1", ("two", "men", "ran"), 1)
    words = ["man", "men", "dogs", "dog", "ran", "quick", "cat", "zebra", "cats"]
    kept = gen.filter_candidates(item, words, list(range(len(words))))
    # man/men: target lemma; dogs then dog: same lemma, first kept; ran/quick: not nouns;
    # zebra: not in WordNet; cats duplicates cat.
    assert kept == [("dog", 2.0), ("cat", 6.0)]


def test_word_candidates_are_whole_words(tiny):
    _, tok = tiny
    ids, words = word_candidates(tok)
    vocab = tok.get_vocab()
    assert "cat" in words and "guitar" in words
    assert all(not w.startswith("##") and w.isalpha() and len(w) >= 2 for w in words)
    assert all(vocab[w] == i for i, w in zip(ids, words))


def _independent_ranking(model, tok, item, allowed):
    """Full-vocabulary logits at the target position via the model's own forward."""
    enc = tok(" ".join(item.tokens), return_tensors="pt")
    word_ids = enc.word_ids()
    pos = [i for i, w in enumerate(word_ids) if w == item.index]
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True)
    assert len(pos) == 1  # single-token target: the logits row is the model's own
    logits = out.logits[0, pos[0]]
    vocab = tok.get_vocab()
    return sorted(allowed, key=lambda w: -float(logits[vocab[w]]))


def test_rank_matches_independent_mlm_ranking(small_data, tiny):
    model, tok = tiny
    wn = WordNet.load(small_data)
    item = load_lexsub("LS07", small_data)[2]  # cat.n in "the cat sat on the mat"
    gen = LexSubGenerator(model, tok, wn, config=GenerationConfig(pool=10_000, keep=100))
    ranked = gen.rank([item])[item.key]
    expected = _independent_ranking(model, tok, item, [w for w in NOUNS if w != "cat"])
    assert ranked == expected


def test_post_emb_matches_manual_mixture(small_data, tiny):
    model, tok = tiny
    wn = WordNet.load(small_data)
    item = load_lexsub("LS07", small_data)[2]
    cfg = GenerationConfig(post=("emb",), emb_weight=0.7, pool=10_000, keep=100)
    ranked = LexSubGenerator(model, tok, wn, config=cfg).rank([item])[item.key]
    vocab = tok.get_vocab()
    ids, words = word_candidates(tok)
    enc = tok(" ".join(item.tokens), return_tensors="pt")
    pos = [i for i, w in enumerate(enc.word_ids()) if w == item.index][0]
    with torch.no_grad():
        logits = model(**enc).logits[0, pos][ids].double().numpy()
    emb = model.get_input_embeddings().weight.detach().double().numpy()
    t = emb[enc["input_ids"][0, pos]]
    cos = emb[ids] @ t / (np.linalg.norm(emb[ids], axis=1) * np.linalg.norm(t))

    def log_softmax(x):
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    score = log_softmax(logits) + 0.7 * log_softmax(cos * 15.0)
    by_word = {w: score[k] for k, w in enumerate(words)}
    expected = sorted([w for w in NOUNS if w != "cat"], key=lambda w: -by_word[w])
    assert ranked == expected
    assert vocab  # silence unused


def test_post_valid_reranks_only_the_top(small_data, tiny):
    model, tok = tiny
    wn = WordNet.load(small_data)
    item = load_lexsub("LS07", small_data)[2]
    plain = LexSubGenerator(model, tok, wn, config=GenerationConfig(pool=10_000)).rank([item])[item.key]
    valid = LexSubGenerator(model, tok, wn, config=GenerationConfig(post=("valid",), valid_top=5, pool=10_000)
                            ).rank([item])[item.key]
    assert sorted(valid[:5]) == sorted(plain[:5]) and valid[5:] == plain[5:]
    # A huge proposal weight keeps the proposal order.
    heavy = LexSubGenerator(model, tok, wn, config=GenerationConfig(post=("valid",), valid_weight=1e6, pool=10_000)
                            ).rank([item])[item.key]
    assert heavy == plain


def test_lexsub_command_end_to_end(small_data, tiny_bert, tmp_path_factory, capsys):
    import argparse
    import json

    from mirrorbert.cli.gloss import add_lexsub_parser

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_lexsub_parser(sub)
    out = tmp_path_factory.mktemp("lexsub-output") / "res"  # outside the data directory (the write policy)
    args = parser.parse_args(["lexsub", "--model", str(tiny_bert), "--dataset", "LS07", "--data-dir", str(small_data),
                              "--output", str(out), "--device", "cpu", "--json"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["LS07"]["n_items"] == 2 and "best_p" in printed["LS07"]
    assert (out / "LS07.best").is_file() and (out / "LS07.oot").is_file()
    best = read_system_file(out / "LS07.best")
    assert set(best) == {("side.n", "301"), ("bright.a", "1"), ("cat.n", "7")}
    args = parser.parse_args(["lexsub", "--model", str(tiny_bert), "--dataset", "LS14", "--data-dir", str(small_data)])
    with pytest.raises(DatasetMissing):
        args.func(args)


@pytest.mark.slow
def test_real_lexsub_files_load(shared_data):
    ls07 = load_lexsub("LS07", shared_data)
    assert len(ls07) == 1710
    for it in ls07[:200]:
        assert word_span(it.tokens, it.index)[1] <= len(" ".join(it.tokens))
    gold = {it.key: dict(it.gold) for it in ls07 if it.gold}
    assert len(gold) == 1703
    ls14 = load_lexsub("LS14", shared_data)
    assert len(ls14) > 9000


def test_long_sentences_are_cropped_around_the_target(small_data, tiny):
    model, tok = tiny
    wn = WordNet.load(small_data)
    gen = LexSubGenerator(model, tok, wn)
    words = ["the", "dog", "ran", "in", "the", "park"] * 20
    words[100] = "cat"
    item = LexSubItem("cat.n", "9", tuple(words), 100)
    tokens, index = gen._fit(item)
    assert tokens[index] == "cat" and len(tokens) < len(words)
    assert len(tok(" ".join(tokens))["input_ids"]) <= gen.max_length
    ranked = gen.rank([item])[item.key]
    assert ranked and "cat" not in ranked and set(ranked) <= set(NOUNS)
