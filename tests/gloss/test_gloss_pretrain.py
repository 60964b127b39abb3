"""GR-BERT training loop on a tiny model: output format, SC saving, resume, errors, CLI."""

from __future__ import annotations

import argparse
import json

from mirrorbert.jsonio import loads_strict
from pathlib import Path

import pytest
import torch

from mirrorbert.errors import UserError
from mirrorbert.gloss.pretrain import GlossPretrainConfig, pretrain
from support import ROWS
from support import write_stsb as _write_stsb

@pytest.fixture()
def tsv(tmp_path) -> Path:
    p = tmp_path / "triplets.tsv"
    p.write_text("".join(f"{w}\t{s}\t{g}\n" for w, s, g in ROWS), encoding="utf-8")
    return p


def _cfg(tiny_bert, tsv, out, **kw) -> GlossPretrainConfig:
    base = dict(model=str(tiny_bert), triplets=str(tsv), output=str(out), batch_size=4, epochs=2, holdout=0.2,
                device="cpu", precision="fp32", show_progress=False, lr=1e-3, warmup=0.1, seed=3)
    base.update(kw)
    return GlossPretrainConfig(**base)


def test_mt_pretrain_writes_hf_mlm_with_history(tiny_bert, tsv, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    out = tmp_path / "gr"
    res = pretrain(_cfg(tiny_bert, tsv, out, mlm_prob=0.15))
    assert res.output == out and not res.interrupted
    # 16 training triplets / batch 4 = 4 steps per epoch.
    assert res.steps == 8 and res.stats["train"] == 16 and res.stats["heldout"] == 4
    assert [h["epoch"] for h in res.history] == [0, 1, 2]
    assert res.best is not None and res.best["epoch"] in (1, 2)
    assert res.best["accuracy"] == max(h["accuracy"] for h in res.history[1:])
    info = loads_strict((out / "gr_training.json").read_text())
    assert info["method"] == "gr-bert" and info["arch"] == "mt" and info["config"]["warmup_steps"] == 1
    model = AutoModelForMaskedLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    start = AutoModelForMaskedLM.from_pretrained(tiny_bert)
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(model.state_dict()[name], start.state_dict()[name])
    assert not (tmp_path / "gr.checkpoints").exists()  # no checkpoints unless asked
    # Usable wherever an MLM is: the project's Encoder (and so `mirrorbert train --model`) loads it.
    from mirrorbert.encoder.model import Encoder

    vecs = Encoder.load(out, device="cpu").encode(["a dog ran in the park", "the cat sat"])
    assert vecs.shape == (2, model.config.hidden_size)


def test_sc_pretrain_saves_one_mlm(tiny_bert, tsv, tmp_path):
    from transformers import AutoModelForMaskedLM

    out = tmp_path / "sc"
    res = pretrain(_cfg(tiny_bert, tsv, out, arch="sc", epochs=1, holdout=0.0))
    assert res.history == [] and res.best is None
    back = AutoModelForMaskedLM.from_pretrained(out)
    start = AutoModelForMaskedLM.from_pretrained(tiny_bert)
    assert sum(p.numel() for p in back.parameters()) == sum(p.numel() for p in start.parameters())
    assert json.loads((out / "gr_training.json").read_text())["arch"] == "sc"


def test_resume_reproduces_uninterrupted_run(tiny_bert, tsv, tmp_path):
    from transformers import AutoModelForMaskedLM

    common = dict(epochs=2, holdout=0.0, save_every=3, mlm_prob=0.2)
    straight = pretrain(_cfg(tiny_bert, tsv, tmp_path / "a", checkpoint_dir=str(tmp_path / "ck_a"), **common))
    assert straight.steps == 10  # 20 triplets / 4 = 5 steps per epoch
    assert (tmp_path / "ck_a" / "step-10").is_dir() and (tmp_path / "ck_a" / "step-9").is_dir()
    # A fresh run that resumes from step 9 of the first one must end with identical weights.
    resumed = pretrain(_cfg(tiny_bert, tsv, tmp_path / "b", checkpoint_dir=str(tmp_path / "ck_b"),
                            resume=str(tmp_path / "ck_a" / "step-9"), **common))
    assert resumed.steps == 10
    a = AutoModelForMaskedLM.from_pretrained(tmp_path / "a").state_dict()
    b = AutoModelForMaskedLM.from_pretrained(tmp_path / "b").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and so are the reported losses: the window (one epoch: 5 steps) and the epoch mean reach back before step 9
    info_a, info_b = (loads_strict((tmp_path / n / "gr_training.json").read_text()) for n in "ab")
    losses = ("final_loss", "final_loss_window_steps", "last_batch_loss", "mean_loss_last_epoch")
    assert [info_b[k] for k in losses] == [info_a[k] for k in losses] and info_a["final_loss_window_steps"] == 5
    assert info_a["final_loss"] == info_a["mean_loss_last_epoch"] != info_a["last_batch_loss"]
    # Resuming with other triplets is refused.
    other = tmp_path / "other.tsv"
    other.write_text("".join(f"{w}\t{s}\t{g}\n" for w, s, g in ROWS[:-1]), encoding="utf-8")
    with pytest.raises(UserError, match="triplets differ"):
        pretrain(_cfg(tiny_bert, other, tmp_path / "c", resume=str(tmp_path / "ck_a"), **common))


def test_user_errors(tiny_bert, tsv, tmp_path):
    with pytest.raises(UserError, match="^batch_size=1: must be an integer >= 2"):  # Python names the argument
        pretrain(_cfg(tiny_bert, tsv, tmp_path / "x", batch_size=1))
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError, match="already exists"):
        pretrain(_cfg(tiny_bert, tsv, tmp_path / "exists"))
    with pytest.raises(UserError, match="--model .*no-such-model"):  # the shared preflight message
        pretrain(_cfg(tmp_path / "no-such-model", tsv, tmp_path / "y"))
    bad = tmp_path / "bad.tsv"
    bad.write_text("cat\tthe cat sat\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.tsv:1"):
        pretrain(_cfg(tiny_bert, bad, tmp_path / "z"))
    with pytest.raises(UserError, match="WordNet 3.0 not found"):
        (tmp_path / "empty-data").mkdir()  # an output may not lie inside an input folder
        pretrain(_cfg(tiny_bert, "wordnet", tmp_path / "w", data_dir=str(tmp_path / "empty-data")))


def test_cli_gloss_pretrain(tiny_bert, tsv, tmp_path, capsys):
    from mirrorbert.cli.gloss import add_gloss_parser

    parser = argparse.ArgumentParser()
    add_gloss_parser(parser.add_subparsers())
    out = tmp_path / "cli"
    args = parser.parse_args(["gloss-pretrain", "--model", str(tiny_bert), "--triplets", str(tsv), "--output", str(out),
                              "--batch-size", "5", "--epochs", "1", "--device", "cpu", "--precision", "bf16",
                              "--no-progress", "--arch", "sc", "--lambda", "1.5"])
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and summary["triplets"]["triplets"] == 20
    info = loads_strict((out / "gr_training.json").read_text())
    assert info["config"]["lam"] == 1.5 and info["precision"] == "bf16"


# --------------------------------------------------------------------------- finetune-sts
def test_cosine_regression_loss_and_subsets():
    from mirrorbert.gloss.finetune_sts import cosine_regression_loss, subset_indices

    u = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    v = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    target = torch.tensor([0.5, 0.8])
    expected = ((0.0 - 0.5) ** 2 + (1.0 - 0.8) ** 2) / 2
    assert cosine_regression_loss(u, v, target).item() == pytest.approx(expected)
    a = subset_indices(100, 0.2, seed=1)
    assert len(a) == 20 and a == subset_indices(100, 0.2, seed=1) and a != subset_indices(100, 0.2, seed=2)
    assert subset_indices(10, 1.0, seed=5) == list(range(10))


def test_finetune_sts_command(tiny_bert, tmp_path, capsys):
    from mirrorbert.cli.gloss import add_finetune_sts_parser
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig, finetune_once
    from mirrorbert.evaluation.sts import load_set

    root = _write_stsb(tmp_path / "data")
    parser = argparse.ArgumentParser()
    add_finetune_sts_parser(parser.add_subparsers())
    out = tmp_path / "sts.json"  # outside the data directory (the write policy)
    args = parser.parse_args(["finetune-sts", "--model", str(tiny_bert), "--data-dir", str(root), "--fractions", "1,0.5",
                              "--seeds", "0,1", "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--device", "cpu",
                              "--no-progress", "--output", str(out)])
    assert args.func(args) == 0
    res = json.loads(out.read_text())
    assert set(res["results"]) == {"1", "0.5"}
    assert res["results"]["0.5"]["train_pairs"] == 12 and len(res["runs"]) == 4
    scores = res["results"]["1"]["scores"]
    assert res["results"]["1"]["mean"] == pytest.approx(sum(scores) / 2, abs=0.01)
    # Seeded: re-running one (fraction, seed) reproduces its score.
    cfg = FinetuneStsConfig(model=str(tiny_bert), data_dir=str(root), epochs=1, batch_size=8, lr=1e-3, device="cpu",
                            show_progress=False)
    train, test = load_set(root, "stsb", "train"), load_set(root, "stsb", "test")
    run = finetune_once(cfg, train, test, 1.0, 0)
    assert run.test_spearman == pytest.approx(scores[0], abs=0.01)
    assert run.steps == 3


def test_finetune_summary_has_no_spread_for_one_seed():
    from mirrorbert.cli.gloss import format_finetune_summary

    one = format_finetune_summary({"1.0": {"train_pairs": 5749, "mean": 56.5, "std": 0.0}}, 1, "m")
    assert "+-" not in one and "±" not in one and "one seed" in one and "STS-B test split" in one
    three = format_finetune_summary({"1.0": {"train_pairs": 5749, "mean": 56.5, "std": 0.4}}, 3, "m")
    assert "56.50 +- 0.40" in three and "over 3 seeds" in three
