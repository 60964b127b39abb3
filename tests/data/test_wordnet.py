"""WordNet reader, lemmatiser and triplet builder on a tiny WordNet-format fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirrorbert.errors import UserError
from mirrorbert.gloss.triplets import (
    Triplet,
    build_wordnet_triplets,
    find_target_span,
    gloss_inventory,
    load_triplets,
    load_triplets_tsv,
    split_holdout,
    triplet_stats,
    wordnet_gloss_inventory,
    write_triplets_tsv,
)
from mirrorbert.data.wordnet import WordNet, shortest_base_form, split_gloss
from support import LICENCE

def _data_line(offset: int, pos: str, words: list[str], gloss: str) -> str:
    lemmas = " ".join(f"{w} 0" for w in words)
    return f"{offset:08d} 03 {pos} {len(words):02x} {lemmas} 000 | {gloss}  \n"


# (offset, file pos, ss_type, lemmas, gloss) for the fixture.
SYNSETS = [
    (100, "n", "n", ["dog", "domestic_dog"], 'a domesticated canine; "the dog barked all night"; "dogs chase cats"'),
    (200, "n", "n", ["dog", "frump"], 'a dull unattractive woman; "she is a real dog"'),
    (300, "n", "n", ["goose"], 'a web-footed bird; "geese flew over the lake"; "a wild bird"'),
    (400, "v", "v", ["run"], 'move fast on foot; "he ran to the store"; "she runs every day"'),
    (500, "v", "v", ["look_after", "care_for"], 'keep in safety; "she looked after the children"'),
    (600, "v", "v", ["bark"], "make a barking sound"),
    (700, "a", "a", ["big"], 'above average in size; "a bigger house"; "big trucks"'),
    (800, "a", "s", ["galore(ip)", "abounding"], 'existing in abundance; "whiskey galore"'),
    (900, "r", "r", ["flat_out"], 'with full force; "he stated his opinion flat-out"'),
]

EXPECTED = {  # (lemma, example) -> surface form that must be found
    ("dog", "the dog barked all night"): "dog",
    ("dog", "dogs chase cats"): "dogs",
    ("dog", "she is a real dog"): "dog",
    ("goose", "geese flew over the lake"): "geese",
    ("run", "he ran to the store"): "ran",
    ("run", "she runs every day"): "runs",
    ("look after", "she looked after the children"): "looked after",
    ("big", "a bigger house"): "bigger",
    ("big", "big trucks"): "big",
    ("galore", "whiskey galore"): "galore",
    ("flat out", "he stated his opinion flat-out"): "flat-out",
}


def write_wordnet(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    names = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
    for pos, name in names.items():
        lines = [LICENCE]
        index: dict[str, list[int]] = {}
        for off, fpos, sstype, words, gloss in SYNSETS:
            if fpos != pos:
                continue
            lines.append(_data_line(off, sstype, words, gloss))
            for w in words:
                index.setdefault(w.split("(")[0].lower(), []).append(off)
        (root / f"data.{name}").write_text("".join(lines), encoding="utf-8")
        idx = [LICENCE]
        for lemma in sorted(index):
            offs = index[lemma]
            idx.append(f"{lemma} {pos} {len(offs)} 1 @ {len(offs)} 0 " + " ".join(f"{o:08d}" for o in offs) + "  \n")
        (root / f"index.{name}").write_text("".join(idx), encoding="utf-8")
    (root / "noun.exc").write_text("geese goose\n", encoding="utf-8")
    (root / "verb.exc").write_text("ran run\n", encoding="utf-8")
    (root / "adj.exc").write_text("bigger big\n", encoding="utf-8")
    (root / "adv.exc").write_text("", encoding="utf-8")
    return root


@pytest.fixture()
def wn_dir(tmp_path) -> Path:
    write_wordnet(tmp_path / "data" / "wordnet")
    return tmp_path / "data"


def test_split_gloss_definition_and_examples():
    d, ex = split_gloss('facing away; "the abaxial surface" - Shakespeare; "another one"')
    assert d == "facing away"
    assert ex == ("the abaxial surface", "another one")
    d, ex = split_gloss("having two faces--one looking ahead")
    assert d == "having two faces--one looking ahead" and ex == ()


def test_reader_parses_synsets_index_and_markers(wn_dir):
    wn = WordNet.load(wn_dir)
    assert len(wn.synsets) == len(SYNSETS)
    dogs = wn.synsets_of("dog", "n")
    assert {s.definition for s in dogs} == {"a domesticated canine", "a dull unattractive woman"}
    assert dogs[0].examples == ("the dog barked all night", "dogs chase cats")
    sat = wn.synsets_of("galore", "a")
    assert len(sat) == 1 and sat[0].pos == "s" and sat[0].lemmas == ("galore", "abounding")
    assert wn.synsets_of("Look After", "v")[0].lemmas == ("look_after", "care_for")
    assert wn.synsets_of("dog", "v") == []


def test_morphy_uses_exceptions_rules_and_index(wn_dir):
    wn = WordNet.load(wn_dir)
    assert wn.morphy("ran", "v") == ["run"]
    assert wn.morphy("runs", "v") == ["run"]
    assert wn.morphy("geese", "n") == ["goose"]
    assert wn.morphy("dogs", "n") == ["dog"]
    assert wn.morphy("bigger", "a") == ["big"]
    assert wn.morphy("cats", "n") == []  # not a lemma of this tiny WordNet
    assert shortest_base_form(wn.morphy("cats", "n"), "cats") == "cats"
    assert shortest_base_form(wn.morphy("bigger", "a"), "bigger") == "big"
    assert shortest_base_form(wn.morphy("Dogs", "n"), "dogs") == "dog"
    assert wn.morphy("looked_after", "v") == ["look_after"]


def test_wordnet_triplets_match_hand_enumeration(wn_dir):
    wn = WordNet.load(wn_dir)
    triplets = build_wordnet_triplets(wn)
    got = {(t.word, t.sentence): t.surface for t in triplets}
    assert got == EXPECTED
    for t in triplets:
        assert t.sentence[t.start:t.end] == t.surface
        assert '"' not in t.gloss and t.gloss == wn.synsets[(t.sense[-1] if t.sense[-1] != "s" else "a",
                                                              int(t.sense[:8]))].definition
    stats = triplet_stats(triplets)
    assert stats == {
        "words": len({w for w, _ in EXPECTED}),
        "glosses": len({t.gloss for t in triplets}),
        "triplets": len(EXPECTED),
    }
    assert stats["glosses"] == 8  # every synset with a matching example (not "bark")
    inv = wordnet_gloss_inventory(wn, ["dog", "goose"])
    assert sorted(inv["dog"]) == ["a domesticated canine", "a dull unattractive woman"]
    assert inv["goose"] == ["a web-footed bird"]


def test_find_target_span_prefers_exact_and_handles_case_and_possessive():
    s = "The Dogs' owner saw the dog's bone"
    span = find_target_span(s, "dog", "n")
    assert s[span[0]:span[1]] == "dog"  # exact match preferred over the inflected "Dogs"
    span = find_target_span("Dogs were barking", "dog", "n")
    assert span == (0, 4)
    assert find_target_span("a cat sat", "dog", "n") is None


def test_missing_wordnet_is_a_clear_user_error(tmp_path):
    with pytest.raises(UserError, match="WordNet 3.0 not found"):
        WordNet.load(tmp_path)
    with pytest.raises(UserError, match="WordNet"):
        load_triplets("wordnet", data_dir=tmp_path)
    root = write_wordnet(tmp_path / "wn2" / "wordnet")
    (root / "index.verb").unlink()
    with pytest.raises(UserError, match="index.verb"):
        WordNet.load(tmp_path / "wn2")


def test_tsv_loader_and_errors(tmp_path):
    good = tmp_path / "t.tsv"
    good.write_text("# comment\nbank\tShe sat on the river banks .\tsloping land beside water\n\n"
                    "run\tHe runs home\tmove fast\n", encoding="utf-8")
    ts = load_triplets_tsv(good)
    assert [t.surface for t in ts] == ["banks", "runs"]
    assert ts[0].word == "bank" and ts[0].gloss == "sloping land beside water"

    bad = tmp_path / "bad.tsv"
    bad.write_text("bank\tShe sat on the bank\tland\nonly two\tfields\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.tsv:2: expected 3 TAB-separated fields"):
        load_triplets_tsv(bad)
    bad.write_text("bank\tShe sat on the bank\t \n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.tsv:1: empty gloss"):
        load_triplets_tsv(bad)
    bad.write_text("bank\tShe sat on the shore\tland\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.tsv:1: word 'bank' does not occur"):
        load_triplets_tsv(bad)
    with pytest.raises(UserError, match="not found"):
        load_triplets_tsv(tmp_path / "nope.tsv")
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n# nothing\n", encoding="utf-8")
    with pytest.raises(UserError, match="no triplets"):
        load_triplets_tsv(empty)


def test_tsv_irregular_forms_need_wordnet_exceptions(tmp_path, wn_dir):
    f = tmp_path / "irr.tsv"
    f.write_text("run\tHe ran home\tmove fast\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"irr\.tsv:1: word 'run'"):
        load_triplets_tsv(f)
    ts = load_triplets_tsv(f, wn=WordNet.load(wn_dir))
    assert ts[0].surface == "ran"
    ts, inv = load_triplets(str(f), data_dir=wn_dir)
    assert ts[0].surface == "ran" and inv == {"run": ["move fast"]}


def test_tsv_roundtrip_and_inventory(tmp_path):
    ts = [Triplet("bank", "the bank lent money", "a financial institution", 4, 8),
          Triplet("bank", "the river bank", "sloping land", 10, 14),
          Triplet("bank", "a bank robbery", "a financial institution", 2, 6)]
    path = tmp_path / "x.tsv"
    write_triplets_tsv(ts, path)
    back = load_triplets_tsv(path)
    assert [(t.word, t.sentence, t.gloss, t.start, t.end) for t in back] == \
        [(t.word, t.sentence, t.gloss, t.start, t.end) for t in ts]
    assert gloss_inventory(ts) == {"bank": ["a financial institution", "sloping land"]}


def test_holdout_split_is_seeded_disjoint_and_sized():
    ts = [Triplet(f"w{i}", f"w{i} here", f"g{i}", 0, len(f"w{i}")) for i in range(101)]
    tr, ho = split_holdout(ts, 0.05, seed=3)
    assert len(ho) == 6 and len(tr) == 95
    assert {t.word for t in tr}.isdisjoint({t.word for t in ho})
    tr2, ho2 = split_holdout(ts, 0.05, seed=3)
    assert ho2 == ho
    _, ho3 = split_holdout(ts, 0.05, seed=4)
    assert ho3 != ho
    assert split_holdout(ts, 0.0)[1] == []
    with pytest.raises(UserError):
        split_holdout(ts, 1.5)


@pytest.mark.slow
def test_real_wordnet_counts(shared_data):
    wn = WordNet.load(shared_data)
    # Numbers documented in the shared data README.
    assert len(wn.synsets) == 117659
    assert sum(len(s.examples) for s in wn.synsets.values()) == 48339
    triplets = build_wordnet_triplets(wn)
    stats = triplet_stats(triplets)
    # The issue expects "about 45k" triplets; every triplet's span must be its lemma's form.
    assert 40_000 <= stats["triplets"] <= 55_000
    assert all(t.sentence[t.start:t.end] for t in triplets)


def test_shortest_base_form_rule():
    from mirrorbert.data.wordnet import shortest_base_form

    assert shortest_base_form(["eggs", "egg"], "eggs") == "egg"
    assert shortest_base_form(["as", "a"], "as") == "as"
    assert shortest_base_form([], "zebras") == "zebras"
    assert shortest_base_form(["a"], "a") == "a"
