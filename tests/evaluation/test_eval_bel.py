"""Biomedical entity linking: chunked retrieval, loaders in the published layouts, toy linking cases."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import bel
from mirrorbert.search.exact import chunked_topk, cosine_topk


# ----------------------------------------------------------------------------------- fake encoders
class BagOfWordsEncoder:
    """Counts of known words (unknown words ignored): cosines are easy to work out by hand."""

    def __init__(self, vocab: list[str]) -> None:
        self.index = {w: i for i, w in enumerate(vocab)}
        self.calls: list[list[str]] = []

    def encode(self, texts, batch_size=64, normalize=False, show_progress=False):
        self.calls.append(list(texts))
        out = np.zeros((len(texts), len(self.index)), np.float32)
        for r, t in enumerate(texts):
            for w in t.split():
                if w in self.index:
                    out[r, self.index[w]] += 1
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


class CharNgramEncoder:
    """Hashed character 3-grams: a cheap, deterministic lexical encoder for real-data smoke runs."""

    def __init__(self, dim: int = 1024) -> None:
        self.dim = dim

    def encode(self, texts, batch_size=64, normalize=False, show_progress=False):
        import zlib

        out = np.zeros((len(texts), self.dim), np.float32)
        for r, t in enumerate(texts):
            s = f"#{t}#"
            for i in range(len(s) - 2):
                out[r, zlib.crc32(s[i : i + 3].encode()) % self.dim] += 1
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


# --------------------------------------------------------------------------------- chunked top-k
def brute_topk(q: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = q @ keys.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 399, 1000])
@pytest.mark.parametrize("query_block", [16, 1024])
def test_chunked_topk_matches_brute_force(chunk_size, query_block):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(37, 16)).astype(np.float32)
    keys = rng.normal(size=(400, 16)).astype(np.float32)
    for k in (1, 5, 13):
        s, i = chunked_topk(q, keys, k, chunk_size=chunk_size, query_block=query_block)
        bs, bi = brute_topk(q, keys, k)
        np.testing.assert_array_equal(i, bi)
        np.testing.assert_allclose(s, bs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [3, 50, 1000])
def test_chunked_topk_many_exact_ties(chunk_size):
    """Small-integer vectors give exactly equal scores; the order must match a stable sort."""
    rng = np.random.default_rng(5)
    q = rng.integers(-1, 2, size=(40, 3)).astype(np.float32)
    keys = rng.integers(-1, 2, size=(300, 3)).astype(np.float32)
    for k in (1, 4, 10):
        s, i = chunked_topk(q, keys, k, chunk_size=chunk_size)
        bs, bi = brute_topk(q, keys, k)
        np.testing.assert_array_equal(i, bi)
        np.testing.assert_array_equal(s, bs)


def test_chunked_topk_ties_prefer_lower_index_and_k_capped():
    keys = np.array([[1, 0], [0, 1], [1, 0], [1, 0], [0.5, 0.5]], np.float32)
    q = np.array([[1, 0]], np.float32)
    for chunk in (1, 2, 3, 10):
        s, i = chunked_topk(q, keys, 3, chunk_size=chunk)
        assert i.tolist() == [[0, 2, 3]]
        s, i = chunked_topk(q, keys, 2, chunk_size=chunk)  # tie at the k-th place
        assert i.tolist() == [[0, 2]] and s.tolist() == [[1.0, 1.0]]
        s, i = chunked_topk(q, keys, 50, chunk_size=chunk)  # k larger than the dictionary
        assert i.tolist() == [[0, 2, 3, 4, 1]]


def test_cosine_topk_normalises():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(5, 8)) * 10
    keys = rng.normal(size=(50, 8)) * rng.uniform(0.1, 10, size=(50, 1))
    s, i = cosine_topk(q, keys, 4, chunk_size=9)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    kn = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    bs, bi = brute_topk(qn, kn, 4)
    np.testing.assert_array_equal(i, bi)
    np.testing.assert_allclose(s, bs, atol=1e-5)


def test_chunked_topk_memory_is_bounded():
    """200 queries x 200k keys: the full score matrix would be 160 MB; the search must stay far below."""
    rng = np.random.default_rng(2)
    keys = rng.normal(size=(200_000, 8)).astype(np.float32)
    q = rng.normal(size=(200, 8)).astype(np.float32)
    tracemalloc.start()
    try:
        _, i = chunked_topk(q, keys, 5, chunk_size=8192, query_block=128)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    # spot-check exactness on a few queries
    _, bi = brute_topk(q[:4], keys, 5)
    np.testing.assert_array_equal(i[:4], bi)


# ---------------------------------------------------------------------------------- query parsing
def test_make_query_rules():
    q = bel.make_query("heart attack", "C1")
    assert [(p.mention, set(p.gold)) for p in q.parts] == [("heart attack", {"C1"})]
    q = bel.make_query("cancer", "C4|C5")  # alternatives
    assert [set(p.gold) for p in q.parts] == [{"C4", "C5"}]
    q = bel.make_query("breast cancer|ovarian cancer", "C2+C3")  # aligned composite
    assert [(p.mention, set(p.gold)) for p in q.parts] == [("breast cancer", {"C2"}), ("ovarian cancer", {"C3"})]
    q = bel.make_query("breast cancer|ovarian cancer", "C2|C3")  # BioSyn resolved composite
    assert [(p.mention, set(p.gold)) for p in q.parts] == [
        ("breast cancer", {"C2", "C3"}),
        ("ovarian cancer", {"C2", "C3"}),
    ]
    q = bel.make_query("breast and ovarian cancer", "C2|C9+C3")  # one mention, two parts
    assert [(p.mention, set(p.gold)) for p in q.parts] == [
        ("breast and ovarian cancer", {"C2", "C9"}),
        ("breast and ovarian cancer", {"C3"}),
    ]
    q = bel.make_query("a|b|c", "C1+C2")  # mismatch: union
    assert all(set(p.gold) == {"C1", "C2"} for p in q.parts) and len(q.parts) == 3


def test_normalize_text_like_biosyn():
    assert bel.normalize_text("Parkinson's Disease, Type-2 ") == "parkinson s disease type 2"


# ---------------------------------------------------------------------------------- toy linking
VOCAB = ["heart", "attack", "myocardial", "infarction", "breast", "ovarian", "cancer", "carcinoma", "tumour", "flu"]
TOY_DICT = """C1||heart attack
C1||myocardial infarction
C2||breast cancer
C3||ovarian cancer
C4|C5||cancer
C6||tumour
C7||flu
C2||breast carcinoma
"""


def test_link_toy_dictionary(tmp_path):
    (tmp_path / "dict.txt").write_text(TOY_DICT)
    d = bel.load_dictionary(tmp_path / "dict.txt")
    assert len(d) == 8 and d.cuis[4] == ("C4", "C5")
    queries = [
        bel.make_query("myocardial infarction", "C1"),  # exact name: top-1 correct
        bel.make_query("cancer", "C5"),  # alternative CUI of the name 'cancer'
        bel.make_query("cancer", "C9|C4"),  # alternative gold CUIs
        bel.make_query("breast cancer|ovarian cancer", "C2+C3"),  # composite, both parts right
        bel.make_query("breast cancer|flu", "C2+C8"),  # composite, second part wrong (C8 not in dictionary)
        # 'tumour' -> tumour (C6), then zero-cosine ties in index order: heart attack, myocardial
        # infarction, breast cancer, ovarian cancer; flu (C7) is never within the top 5
        bel.make_query("tumour", "C7"),
        # one mention, two parts: 'breast ovarian' ties breast cancer/ovarian cancer/breast carcinoma...
        bel.make_query("breast ovarian", "C2+C3"),
    ]
    enc = BagOfWordsEncoder(VOCAB)
    res = bel.link(enc, d, queries, bel.BelSettings(ks=(1, 5), chunk_size=3))
    # By hand: 'breast ovarian' = (b + o)/sqrt2; cos with 'breast cancer' = cos with 'ovarian cancer'
    # = cos with 'breast carcinoma' = 1/2; ties break to the lower dictionary index, so top-1 is
    # 'breast cancer' (C2): C3 missing at k=1, present at k=5.
    assert res.correct[1] == [True, True, True, True, False, False, False]
    assert res.correct[5] == [True, True, True, True, False, False, True]
    assert res.accuracy[1] == pytest.approx(4 / 7)
    assert res.accuracy[5] == pytest.approx(5 / 7)
    # every distinct mention part is encoded once
    assert sorted(enc.calls[-1]) == sorted(
        {"myocardial infarction", "cancer", "breast cancer", "ovarian cancer", "flu", "tumour", "breast ovarian"}
    )


# ------------------------------------------------------------------------------ loaders on files
def test_load_dictionary_merges_and_reports_bad_lines(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("C1||fever\nC2|C3||fever\n\nC1||pyrexia\n")
    d = bel.load_dictionary(p)
    assert d.names == ["fever", "pyrexia"] and d.cuis == [("C1", "C2", "C3"), ("C1",)]
    p.write_text("C1||fever\nno separator here\n")
    with pytest.raises(UserError, match=r"d\.txt:2"):
        bel.load_dictionary(p)


def test_load_queries_uses_first_two_fields(tmp_path):
    p = tmp_path / "q.txt"
    p.write_text("fever||C1||fever||some START fever END context\nbreast cancer|flu||C2+C7\n")
    qs = bel.load_queries(p)
    assert [q.text for q in qs] == ["fever", "breast cancer|flu"]
    assert len(qs[1].parts) == 2
    p.write_text("only a mention\n")
    with pytest.raises(UserError, match=r"q\.txt:1"):
        bel.load_queries(p)


def test_load_medic_both_layouts(tmp_path):
    tsv = tmp_path / "medic_tsv.txt"
    tsv.write_text(
        "# CTD MEDIC\n# DiseaseName\tDiseaseID\t...\n"
        "Fever\tMESH:D005334\tDO:DOID:1\tdef\tpar\ttree\tptree\tPyrexia|Hyperthermia, Febrile\tslim\n"
        "Gout\tOMIM:138900\t\tdef\tpar\ttree\tptree\t\tslim\n"
    )
    assert bel.load_medic(tsv) == [
        (["D005334", "DO:DOID:1"], ["Fever", "Pyrexia", "Hyperthermia, Febrile"]),
        (["138900"], ["Gout"]),
    ]
    biosyn = tmp_path / "medic_biosyn.txt"
    biosyn.write_text("C567755|613097||Tooth Agenesis, Selective, 6|STHAG6\n")
    assert bel.load_medic(biosyn) == [(["C567755", "613097"], ["Tooth Agenesis, Selective, 6", "STHAG6"])]


PUBTATOR_TEST = (
    "100|t|Heparin-induced thrombocytopenia (HIT) after surgery.\n"
    "100|a|We saw HIT and breast and ovarian cancer. Baboon syndrome was seen.\n"
    "100\t0\t32\tHeparin-induced thrombocytopenia\tDisease\tD013921\n"
    "100\t34\t37\tHIT\tDisease\tD013921\n"
    "100\t60\t85\tbreast and ovarian cancer\tDisease\tD001943|D010051\tbreast cancer|ovarian cancer\n"
    "100\t87\t102\tBaboon syndrome\tDisease\t-1\n"
    "100\t10\t19\tHeparin\tChemical\tD006493\n"
    "100\tCID\tD006493\tD013921\n"
    "\n"
    "200|t|Hyper- or hypotension.\n"
    "200|a|Nothing else.\n"
    "200\t0\t21\tHyper- or hypotension\tDisease\tD006973|D007022\n"
    "\n"
)
PUBTATOR_TRAIN = (
    "300|t|Thrombocytopenia.\n300|a|x\n300\t0\t16\tThrombocytopenia\tDisease\tD013921\n\n"
    "301|t|Hyper or hypotension.\n301|a|x\n301\t0\t20\tHyper or hypotension\tDisease\tD006973|D007022\t\n\n"
)


def write_bc5cdr(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "CDR_TestSet.PubTator.txt").write_text(PUBTATOR_TEST)
    (folder / "CDR_TrainingSet.PubTator.txt").write_text(PUBTATOR_TRAIN)
    (folder / "CDR_DevelopmentSet.PubTator.txt").write_text("")
    (folder / "medic_06Jul2012.txt").write_text(
        "# comment\n"
        "Thrombocytopenia\tMESH:D013921\t\t\t\t\t\tThrombopenia\t\n"
        "Breast Neoplasms\tMESH:D001943\t\t\t\t\t\tBreast Cancer\t\n"
        "Ovarian Neoplasms\tMESH:D010051\t\t\t\t\t\tOvarian Cancer\t\n"
        "Hypertension\tMESH:D006973\t\t\t\t\t\t\t\n"
        "Hypotension\tMESH:D007022\t\t\t\t\t\t\t\n"
    )


def test_read_pubtator(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text(PUBTATOR_TEST)
    docs = bel.read_pubtator(p)
    assert [d.pmid for d in docs] == ["100", "200"]
    assert docs[0].title.startswith("Heparin") and len(docs[0].mentions) == 5
    comp = docs[0].mentions[2]
    assert comp.ids == ("D001943", "D010051") and comp.individual == ("breast cancer", "ovarian cancer")
    p.write_text("100|t|x\n100\tbad\n")
    with pytest.raises(UserError, match=r"t\.txt:2"):
        bel.read_pubtator(p)


def test_abbreviations_schwartz_hearst():
    found = bel.find_abbreviations("Heparin-induced thrombocytopenia (HIT) is rare. We saw HIT (n = 3).")
    assert found == {"HIT": "Heparin-induced thrombocytopenia"}
    assert bel.find_abbreviations("patients with Parkinson's disease (PD) and others") == {"PD": "Parkinson's disease"}
    assert bel.expand_abbreviations("HIT/HITT", {"HIT": "heparin thrombocytopenia"}) == "heparin thrombocytopenia/HITT"


def test_load_bc5cdr(tmp_path):
    write_bc5cdr(tmp_path)
    d, qs = bel.load_bc5cdr(tmp_path)
    # Baboon syndrome (-1) and the Chemical mention are dropped
    assert [q.text for q in qs] == [
        "Heparin-induced thrombocytopenia",
        "HIT",
        "breast and ovarian cancer",
        "Hyper- or hypotension",
    ]
    assert [(p.mention, set(p.gold)) for p in qs[1].parts] == [("heparin induced thrombocytopenia", {"D013921"})]
    assert [(p.mention, set(p.gold)) for p in qs[2].parts] == [
        ("breast cancer", {"D001943"}),
        ("ovarian cancer", {"D010051"}),
    ]
    assert [(p.mention, set(p.gold)) for p in qs[3].parts] == [
        ("hyper or hypotension", {"D006973"}),
        ("hyper or hypotension", {"D007022"}),
    ]
    names = dict(zip(d.names, d.cuis))
    assert names["thrombopenia"] == ("D013921",) and names["breast cancer"] == ("D001943",)
    # training mentions join the dictionary; an unsplit composite keeps all its ids on one name
    assert names["hyper or hypotension"] == ("D006973", "D007022")
    assert names["thrombocytopenia"] == ("D013921",)


# ------------------------------------------------------------------------- evaluate_bel end to end
NCBI_QUERIES = "heart attack||C1||ctx\ncancer||C4||ctx\nflu||C6||ctx\n"


def write_ncbi(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_dictionary.txt").write_text(TOY_DICT)
    (folder / "test_queries.txt").write_text(NCBI_QUERIES)


def test_evaluate_bel_end_to_end(tmp_path):
    write_ncbi(tmp_path / "bel" / "ncbi")
    write_bc5cdr(tmp_path / "bel" / "bc5cdr")
    vocab = VOCAB + ["heparin", "induced", "thrombocytopenia", "thrombopenia", "hyper", "or", "hypotension"]
    enc = BagOfWordsEncoder(vocab)
    preds = tmp_path / "out" / "preds.jsonl"
    m = bel.evaluate_bel(enc, tmp_path, settings=bel.BelSettings(predictions_path=preds, chunk_size=2))
    # ncbi: heart attack -> C1 (right), cancer -> C4|C5 (right), flu -> C7 (wrong)
    assert m["ncbi_acc@1"] == pytest.approx(2 / 3) and m["ncbi_acc@5"] == pytest.approx(2 / 3)
    assert set(m) == {"ncbi_acc@1", "ncbi_acc@5", "bc5cdr_acc@1", "bc5cdr_acc@5", "primary"}
    assert m["primary"] == pytest.approx((m["ncbi_acc@1"] + m["bc5cdr_acc@1"]) / 2)
    lines = [json.loads(x) for x in preds.read_text().splitlines()]
    assert len(lines) == 3 + 4
    assert lines[0]["dataset"] == "ncbi" and lines[0]["parts"][0]["candidates"][0]["name"] == "heart attack"
    assert lines[2]["correct@1"] is False and len(lines[2]["parts"][0]["candidates"]) == 5


def test_evaluate_bel_missing_sets(tmp_path, caplog):
    write_ncbi(tmp_path / "bel" / "ncbi")
    enc = BagOfWordsEncoder(VOCAB)
    with caplog.at_level(logging.WARNING):
        m = bel.evaluate_bel(enc, tmp_path)  # default: a missing set is skipped with a warning
    assert set(m) == {"ncbi_acc@1", "ncbi_acc@5", "primary"}
    assert "bc5cdr" in caplog.text and "CDR_TestSet.PubTator.txt" in caplog.text
    assert list(m.skipped) == ["bc5cdr"] and "medic_06Jul2012.txt" in m.skipped["bc5cdr"]
    with pytest.raises(DatasetMissing, match=r"bc5cdr.*CDR_TestSet\.PubTator\.txt.*BioCreative"):
        # named sets are required
        bel.evaluate_bel(enc, tmp_path, settings=bel.BelSettings(datasets=("ncbi", "bc5cdr")))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetMissing, match=r"ncbi.*test_dictionary\.txt.*BioSyn"):
        bel.evaluate_bel(enc, empty)
    with pytest.raises(UserError, match="unknown BEL"):
        bel.evaluate_bel(enc, tmp_path, settings=bel.BelSettings(datasets=("medmentions",)))


# ------------------------------------------------------------------------------------ real data
def test_real_files_parse(shared_data):
    d, qs = bel.load_ncbi(shared_data / "bel" / "ncbi")
    assert len(d) == 81820 and len(qs) == 960
    assert sum(len(q.parts) > 1 for q in qs) == 0  # BioSyn's copy has no '+' composites in test
    d, qs = bel.load_bc5cdr(shared_data / "bel" / "bc5cdr")
    assert len(qs) == 4424 - 61  # Disease mentions minus those with id -1


@pytest.mark.slow
def test_real_ncbi_char_ngram_smoke(shared_data):
    """A lexical char-3-gram encoder links a good share of NCBI mentions (pipeline sanity check)."""
    settings = bel.BelSettings(datasets=("ncbi",), use_faiss=False)
    m = bel.evaluate_bel(CharNgramEncoder(), shared_data, settings=settings)
    assert 0.7 < m["ncbi_acc@1"] <= m["ncbi_acc@5"] < 1.0
