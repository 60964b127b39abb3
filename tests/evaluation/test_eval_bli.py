"""Bilingual lexicon induction: Procrustes, CSLS by hand, loaders, end to end on synthetic pairs."""

from __future__ import annotations

import logging
import zlib
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import bli
from mirrorbert.evaluation.bli import csls_topk


def random_rotation(d: int, seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q * np.sign(np.diag(r))


# ------------------------------------------------------------------------------------ Procrustes
def test_procrustes_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 12))
    y = rng.normal(size=(200, 12))
    w = bli.procrustes(x, y)
    ref, _ = scipy.linalg.orthogonal_procrustes(x, y)
    np.testing.assert_allclose(w, ref, atol=1e-5)
    np.testing.assert_allclose(w @ w.T, np.eye(12), atol=1e-5)


def test_procrustes_recovers_exact_rotation():
    x = np.random.default_rng(1).normal(size=(50, 8))
    q = random_rotation(8, 2)
    np.testing.assert_allclose(bli.procrustes(x, x @ q), q, atol=1e-5)


# ------------------------------------------------------------------------------------------ CSLS
def test_csls_hand_computed():
    """Sources a=(1,0), b=(.6,.8); targets y1=(.8,.6) (a hub), y2=(0,1); k=2.

    cos: a.y1=.8, a.y2=0, b.y1=.96, b.y2=.8  -> plain cosine sends both to y1.
    r_T(a)=(.8+0)/2=.4, r_T(b)=(.96+.8)/2=.88, r_S(y1)=(.8+.96)/2=.88, r_S(y2)=(0+.8)/2=.4
    CSLS(a,y1)=1.6-.4-.88=.32, CSLS(a,y2)=0-.4-.4=-.8, CSLS(b,y1)=1.92-.88-.88=.16, CSLS(b,y2)=1.6-.88-.4=.32
    """
    src = np.array([[1, 0], [0.6, 0.8]], np.float32)
    tgt = np.array([[0.8, 0.6], [0, 1]], np.float32)
    scores, ids = csls_topk(src, tgt, k=2, csls_k=2)
    assert ids.tolist() == [[0, 1], [1, 0]]
    np.testing.assert_allclose(scores, [[0.32, -0.8], [0.32, 0.16]], atol=1e-6)
    # with k=1 neighbourhoods the hub keeps b: CSLS(b,y1)=1.92-.96-.96=0 > CSLS(b,y2)=1.6-.96-.8=-.16
    scores, ids = csls_topk(src, tgt, k=1, csls_k=1)
    assert ids[:, 0].tolist() == [0, 0]
    np.testing.assert_allclose(scores[:, 0], [1.6 - 0.8 - 0.96, 0.0], atol=1e-6)


def test_csls_matches_brute_force_with_separate_source_space():
    rng = np.random.default_rng(3)
    src = rng.normal(size=(20, 6))
    space = rng.normal(size=(70, 6))
    tgt = rng.normal(size=(90, 6))
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    s, t, sp = unit(src), unit(tgt), unit(space)
    cos = s @ t.T
    r_t = np.sort(cos, axis=1)[:, -5:].mean(1)
    r_s = np.sort(t @ sp.T, axis=1)[:, -5:].mean(1)
    csls = 2 * cos - r_t[:, None] - r_s[None, :]
    scores, ids = csls_topk(src, tgt, k=3, csls_k=5, source_space=space, chunk_size=7)
    np.testing.assert_array_equal(ids, np.argsort(-csls, axis=1)[:, :3])
    np.testing.assert_allclose(scores, np.sort(csls, axis=1)[:, ::-1][:, :3], atol=1e-5)


# --------------------------------------------------------------------------------------- loaders
def test_load_bli_dictionary(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("dog\tchien\ncat\tchat\n\ncat\tmatou\n")
    assert bli.load_bli_dictionary(p) == [("dog", "chien"), ("cat", "chat"), ("cat", "matou")]
    p.write_text("dog\tchien\ndog chien\n")
    with pytest.raises(UserError, match=r"d\.tsv:2"):
        bli.load_bli_dictionary(p)


# ---------------------------------------------------------------------------------- end to end
class TableEncoder:
    """Words 'xx_i' of language xx get R_xx v_i: all languages are exact rotations of one space.

    Any other word gets a random vector seeded by its crc32 (stable across runs).
    """

    def __init__(self, dim: int = 16, n: int = 60) -> None:
        rng = np.random.default_rng(7)
        self.base = rng.normal(size=(n, dim))
        self.rot = {"en": np.eye(dim), "fr": random_rotation(dim, 11), "it": random_rotation(dim, 12)}
        self.dim = dim
        self.seen: list[str] = []

    def vector(self, word: str) -> np.ndarray:
        lang, _, idx = word.partition("_")
        if lang in self.rot and idx.isdigit():
            return self.base[int(idx)] @ self.rot[lang]
        return np.random.default_rng(zlib.crc32(word.encode())).normal(size=self.dim)

    def encode(self, texts, batch_size=64, normalize=False, show_progress=False):
        self.seen.extend(texts)
        out = np.stack([self.vector(t) for t in texts]).astype(np.float32)
        if normalize:
            out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out


def write_pair(root: Path, src: str, tgt: str, wrong: int = 0) -> None:
    """40 training pairs (0..39) and 20 test pairs (40..59), the first ``wrong`` test golds shuffled."""
    folder = root / "bli" / f"{src}-{tgt}"
    folder.mkdir(parents=True)
    train = "".join(f"{src}_{i}\t{tgt}_{i}\n" for i in range(40))
    test_lines = []
    for i in range(40, 60):
        gold = i if i >= 40 + wrong else 40 + (i - 40 + 1) % wrong
        test_lines.append(f"{src}_{i}\t{tgt}_{gold}\n")
    (folder / f"yacle.train.freq.5k.{src}-{tgt}.tsv").write_text(train)
    (folder / f"yacle.test.freq.2k.{src}-{tgt}.tsv").write_text("".join(test_lines))


def test_evaluate_bli_exact_rotation(tmp_path, monkeypatch):
    calls = []

    def fake_frequent(lang, n):
        calls.append((lang, n))
        return [f"{lang}_freqword{i}" for i in range(min(n, 5))]

    monkeypatch.setattr(bli, "frequent_words", fake_frequent)
    write_pair(tmp_path, "en", "fr")
    write_pair(tmp_path, "it", "fr", wrong=4)  # 4 of 20 golds point at another word
    enc = TableEncoder()
    m = bli.evaluate_bli(enc, tmp_path, settings=bli.BliSettings(pairs=["en-fr", "it-fr"], extra_vocab=100))
    assert m["en-fr_acc@1"] == 1.0
    assert m["it-fr_acc@1"] == pytest.approx(16 / 20)
    assert m["primary"] == pytest.approx((1.0 + 0.8) / 2)
    assert ("fr", 100) in calls and ("en", 100) in calls and ("it", 100) in calls
    assert "fr_freqword0" in enc.seen and "en_freqword0" in enc.seen
    assert len(enc.seen) == len(set(enc.seen))  # every word encoded once across pairs


def test_evaluate_bli_several_gold_targets(tmp_path, monkeypatch):
    monkeypatch.setattr(bli, "frequent_words", lambda lang, n: [])
    write_pair(tmp_path, "en", "fr", wrong=2)
    test = tmp_path / "bli" / "en-fr" / "yacle.test.freq.2k.en-fr.tsv"
    # give the two wrongly-aligned sources their right translation as a second gold
    test.write_text(test.read_text() + "en_40\tfr_40\nen_41\tfr_41\n")
    m = bli.evaluate_bli(TableEncoder(), tmp_path, settings=bli.BliSettings(pairs=["en-fr"], extra_vocab=0))
    assert m["en-fr_acc@1"] == 1.0


def test_evaluate_bli_missing_pairs(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(bli, "frequent_words", lambda lang, n: [])
    write_pair(tmp_path, "en", "it")
    with caplog.at_level(logging.WARNING):
        # default: present pairs only
        m = bli.evaluate_bli(TableEncoder(), tmp_path, settings=bli.BliSettings(extra_vocab=0))
    assert set(m) == {"en-it_acc@1", "primary"}
    assert "yacle.train.freq.5k.en-fr.tsv" in caplog.text
    assert set(m.skipped) == {"en-fr", "en-ru", "en-tr", "it-fr", "ru-fr"}
    with pytest.raises(DatasetMissing, match=r"bli-en-fr.*yacle\.train\.freq\.5k\.en-fr\.tsv.*xling-eval"):
        bli.evaluate_bli(TableEncoder(), tmp_path, settings=bli.BliSettings(pairs=["en-it", "en-fr"]))
    with pytest.raises(DatasetMissing, match=r"bli-de-fi.*xling-eval"):  # pair outside the registry
        bli.evaluate_bli(TableEncoder(), tmp_path, settings=bli.BliSettings(pairs=["de-fi"]))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetMissing, match=r"no BLI pair found.*en-fr, en-it, en-ru, en-tr, it-fr, ru-fr.*xling-eval"):
        bli.evaluate_bli(TableEncoder(), empty)
    with pytest.raises(UserError, match="en-fr"):
        bli.evaluate_bli(TableEncoder(), tmp_path, settings=bli.BliSettings(pairs=["enfr"]))


# ------------------------------------------------------------------------------------ real data
def test_real_dictionaries_and_wordfreq(shared_data):
    for pair in bli.BLI_PAIRS:
        folder = shared_data / "bli" / pair
        assert len(bli.load_bli_dictionary(folder / f"yacle.train.freq.5k.{pair}.tsv")) == 5000
        assert len(bli.load_bli_dictionary(folder / f"yacle.test.freq.2k.{pair}.tsv")) == 2000
    for lang in ("en", "fr", "it", "ru", "tr"):
        words = bli.frequent_words(lang, 20000)
        assert len(words) == 20000 and len(set(words)) == 20000
