"""Where every model comes in (encoder/source.py): one check, one handle, prepared models, one-line refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mirrorbert.encoder.source import open_model
from mirrorbert.errors import UserError
from tiny_models import CORPUS, make_tiny_mlm

REPO = Path(__file__).resolve().parents[2]


def test_a_handle_checks_once_and_hands_libraries_its_snapshot(tiny_bert):
    from mirrorbert.safeguards.model_files import CHECKS

    before = CHECKS["model folders"]
    with open_model(tiny_bert) as handle:
        snapshot = handle.path
        assert snapshot != tiny_bert and (snapshot / "config.json").is_file()
        assert handle.config().model_type == "bert" and len(handle.tokenizer()) > 8
        model = handle.load("AutoModelForMaskedLM")
        assert type(model).__name__ == "BertForMaskedLM"
    assert CHECKS["model folders"] - before == 1 and not snapshot.exists()


def test_every_model_the_handle_builds_is_prepared(tmp_path):
    """RoFormer's sinusoid table out of training, whichever class is loaded."""
    folder = make_tiny_mlm("roformer", tmp_path / "roformer")
    with open_model(folder) as handle:
        for kind in ("AutoModel", "AutoModelForMaskedLM"):
            model = handle.load(kind)
            table = [p for n, p in model.named_parameters() if n.endswith("embed_positions.weight")]
            assert table and not any(p.requires_grad for p in table)


def test_xmod_runs_in_bf16_and_fp16_once_prepared(tmp_path):
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(make_tiny_mlm("xmod", tmp_path / "xmod"), device="cpu")
    reference = encoder.encode(CORPUS)
    for precision in ("bf16", "fp16"):
        vectors = encoder.encode(CORPUS, precision=precision)
        cosine = torch.nn.functional.cosine_similarity(torch.tensor(vectors), torch.tensor(reference))
        assert cosine.min() > 0.99, precision


def test_a_model_max_length_that_is_no_length_is_the_models_positions(tiny_bert, tmp_path, caplog):
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["model_max_length"] = -1
    path.write_text(json.dumps(config), encoding="utf-8")
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(folder, device="cpu")
    assert encoder.max_length == 64  # the positions of the tiny BERT
    assert encoder.encode(["a cat"]).shape == (1, 32)


def test_a_panicking_tokenizer_is_one_line_without_the_panics_own_report(tiny_bert, tmp_path):
    """tokenizers reports a panic on the standard error from Rust: held back, the refusal is the only line."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(?:a|aa)+$x"}, "behavior": "Isolated",
                             "invert": False}
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "in.txt").write_text("a cat\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "mirrorbert", "encode", "--model", str(folder), "--input",
                           str(tmp_path / "in.txt"), "--output", str(tmp_path / "v.npy"), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and " INFO " not in line]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mirrorbert: error:") and "tokenizer" in lines[0] and "panicked at" not in proc.stderr


def test_a_hub_name_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="hub is unreachable"):
        open_model("surely-not-a-model-name-xyz")


def test_a_hub_cache_snapshot_is_checked_like_a_folder(tiny_bert, tmp_path, monkeypatch):
    """A Hub id already in the Hugging Face cache loads offline, its files (links into blobs/) checked."""
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123", encoding="utf-8")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for path in sorted(tiny_bert.iterdir()):
        blob = repo / "blobs" / path.name.replace(".", "-")
        shutil.copy(path, blob)
        os.symlink(f"../../blobs/{blob.name}", snapshot / path.name)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with open_model("org/tiny") as handle:
        assert handle.config().model_type == "bert"
    (tmp_path / "elsewhere.json").write_text("{}", encoding="utf-8")
    os.unlink(snapshot / "tokenizer_config.json")
    os.symlink(tmp_path / "elsewhere.json", snapshot / "tokenizer_config.json")
    with pytest.raises(UserError, match="leads out"):
        open_model("org/tiny")
