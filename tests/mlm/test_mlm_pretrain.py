"""MLM pre-training loop: loss, learning, exact resume, saved folder, errors and the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mirrorbert.errors import UserError
from mirrorbert.cli.pretrain_mlm import add_pretrain_parser
from mirrorbert.mlm.masking import MlmMasker
from mirrorbert.encoder.masked_lm import lm_head_of
from mirrorbert.mlm.pretrain import INFO_FILE, PretrainConfig, mlm_loss, pretrain
from tiny_models import CORPUS

TINY_ARCH = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64}


@pytest.fixture()
def toy_corpus(tmp_path) -> Path:
    path = tmp_path / "toy.txt"
    # repetitive: three sentences over and over, three per document; easy to memorise
    docs = ["\n".join(CORPUS[i % 3] for i in range(j, j + 3)) for j in range(60)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def _cfg(tmp_path, corpus, **kw) -> PretrainConfig:
    base = dict(corpus=[str(corpus)], output=str(tmp_path / "out"), seq_length=32, batch_size=8, lr=2e-3,
                eval_fraction=0.1, eval_every=1000, log_every=5, cache_dir=str(tmp_path / "cache"),
                show_progress=False, device="cpu", prefetch_batches=2, threads=1)
    base.update(kw)
    return PretrainConfig(**base)


@pytest.mark.parametrize("which", ["bert", "roberta"])
def test_head_only_on_targets_equals_full_loss(which, tiny_bert, tiny_roberta):
    path = tiny_bert if which == "bert" else tiny_roberta
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(CORPUS[:6], padding=True, return_tensors="pt")
    ids, labels = MlmMasker.from_tokenizer(tok)(enc["input_ids"], enc["attention_mask"],
                                                torch.Generator().manual_seed(0))
    head = lm_head_of(model)
    assert head is not None
    with torch.no_grad():
        loss_sum, count, correct = mlm_loss(model, ids, enc["attention_mask"], labels, head)
        full = model(input_ids=ids, attention_mask=enc["attention_mask"], labels=labels)
        fallback = mlm_loss(model, ids, enc["attention_mask"], labels, None)
    assert count == int((labels != -100).sum()) > 0
    assert torch.allclose(loss_sum / count, full.loss, atol=1e-5)
    assert torch.allclose(fallback[0], loss_sum, atol=1e-4) and fallback[2] == correct
    targets = labels != -100
    assert correct == int((full.logits[targets].argmax(-1) == labels[targets]).sum())


def test_loss_falls_from_scratch_on_toy_corpus(tmp_path, toy_corpus, tiny_bert):
    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps(TINY_ARCH))
    cfg = _cfg(tmp_path, toy_corpus, architecture=str(arch), tokenizer=str(tiny_bert), epochs=4, eval_every=8,
               warmup_steps=3, lr=1e-2)
    result = pretrain(cfg)
    train = [h for h in result.history if "loss" in h]
    evals = [h for h in result.history if "eval_loss" in h]
    assert result.steps >= 20
    assert train[-1]["loss"] < 0.7 * train[0]["loss"], [round(h["loss"], 3) for h in train]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert train[-1]["accuracy"] > train[0]["accuracy"]
    # the output is a plain HF masked-LM folder with its tokenizer and a record of the run
    out = Path(result.output)
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert type(model).__name__ == "BertForMaskedLM"
    assert model.config.hidden_size == 32 and model.config.vocab_size == len(AutoTokenizer.from_pretrained(out))
    info = json.loads((out / INFO_FILE).read_text())
    assert info["steps"] == result.steps and info["history"] == json.loads(json.dumps(result.history))
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir()), "temporary folder left behind"
    # and `mirrorbert train` / the evaluation suite can start from it
    from mirrorbert.encoder.model import Encoder

    vectors = Encoder.load(out, device="cpu").encode(CORPUS[:3])
    assert vectors.shape == (3, 32)


def test_resume_is_exact(tmp_path, toy_corpus, tiny_bert):
    common = dict(model=str(tiny_bert), max_tokens=8 * 8 * 32 * 2, grad_accum=2, eval_every=3, seed=3)
    full = pretrain(_cfg(tmp_path / "a", toy_corpus, **common))
    assert full.steps == 8
    first = pretrain(_cfg(tmp_path / "b", toy_corpus, stop_after_steps=4, **common))
    assert first.output is None and first.steps == 4 and first.checkpoint.name == "step-4"
    resumed = pretrain(_cfg(tmp_path / "b", toy_corpus, resume=str(first.checkpoint), **common))
    assert resumed.steps == 8
    a = AutoModelForMaskedLM.from_pretrained(full.output).state_dict()
    b = AutoModelForMaskedLM.from_pretrained(resumed.output).state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the weights did change during training, so the equality above is not vacuous
    start = AutoModelForMaskedLM.from_pretrained(tiny_bert).state_dict()
    assert not torch.equal(start["bert.embeddings.word_embeddings.weight"], a["bert.embeddings.word_embeddings.weight"])
    # the recorded curve is the same too (throughput aside)
    def curve(history):
        return [{k: v for k, v in h.items() if k != "tokens_per_s"} for h in history]

    assert curve(resumed.history) == curve(full.history)
    # train_loss: the mean of the last logging window, named (steps 6-8 after the line at step 5)
    assert (resumed.train_loss, resumed.train_loss_window_steps) == (full.train_loss, 3)
    assert json.loads((Path(full.output) / INFO_FILE).read_text())["train_loss_window_steps"] == 3


def test_resume_refuses_changed_data_order(tmp_path, toy_corpus, tiny_bert):
    first = pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_bert), epochs=1, stop_after_steps=2))
    with pytest.raises(UserError, match="--batch-size"):
        pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_bert), epochs=1, batch_size=4, resume=str(first.checkpoint)))


def test_roberta_whole_word_bf16(tmp_path, toy_corpus, tiny_roberta):
    result = pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_roberta), max_tokens=3 * 8 * 32,
                           whole_word_mask=True, precision="bf16", eval_every=2))
    assert result.steps == 3 and result.eval_loss is not None
    model = AutoModelForMaskedLM.from_pretrained(result.output)
    assert type(model).__name__ == "RobertaForMaskedLM"
    assert next(model.parameters()).dtype == torch.float32


def test_user_errors(tmp_path, toy_corpus, tiny_bert):
    with pytest.raises(UserError, match="no such file"):
        pretrain(_cfg(tmp_path, tmp_path / "missing.txt", model=str(tiny_bert)))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(UserError, match="empty"):
        pretrain(_cfg(tmp_path, empty, model=str(tiny_bert)))
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    tok.mask_token = None
    tok.save_pretrained(tmp_path / "nomask")
    with pytest.raises(UserError, match="no mask token"):
        pretrain(_cfg(tmp_path, toy_corpus, architecture="bert-tiny", tokenizer=str(tmp_path / "nomask")))
    with pytest.raises(UserError, match="needs tokenizer="):  # Python names the argument
        pretrain(_cfg(tmp_path, toy_corpus, architecture="bert-tiny"))
    with pytest.raises(UserError, match="exactly one"):
        pretrain(_cfg(tmp_path, toy_corpus, architecture="bert-tiny", model=str(tiny_bert), tokenizer=str(tiny_bert)))
    with pytest.raises(UserError, match="not both"):
        pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_bert), epochs=1, max_tokens=100))
    with pytest.raises(UserError, match="at most 64"):
        pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_bert), seq_length=100))
    with pytest.raises(UserError, match="named size"):
        pretrain(_cfg(tmp_path, toy_corpus, architecture="bert-huge", tokenizer=str(tiny_bert)))
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="--overwrite"):
        pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_bert)))


def test_named_architecture_sizes(tiny_bert):
    from mirrorbert.mlm.models import architecture_config

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    sizes = {name: architecture_config(name, tok, 128) for name in ("bert-tiny", "bert-mini", "bert-small", "bert-medium")}
    got = {n: (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) for n, c in sizes.items()}
    assert got == {"bert-tiny": (2, 128, 2, 512), "bert-mini": (4, 256, 4, 1024),
                   "bert-small": (4, 512, 8, 2048), "bert-medium": (8, 512, 8, 2048)}
    assert all(c.vocab_size == len(tok) for c in sizes.values())


def _run_parser(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_pretrain_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def _cli_args(tmp_path, corpus, tokenizer) -> list[str]:
    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps(TINY_ARCH))
    return ["pretrain-mlm", "--corpus", str(corpus), "--architecture", str(arch), "--tokenizer", str(tokenizer),
            "--output", str(tmp_path / "cli-out"), "--seq-length", "32", "--batch-size", "8", "--max-tokens", "1024",
            "--cache-dir", str(tmp_path / "cache"), "--eval-fraction", "0.1", "--device", "cpu", "--threads", "1", "--no-progress"]


def test_command_end_to_end(tmp_path, toy_corpus, tiny_bert, capsys):
    assert _run_parser(_cli_args(tmp_path, toy_corpus, tiny_bert)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and Path(summary["output"]).is_dir()


def test_cli_main_end_to_end(tmp_path, toy_corpus, tiny_bert, capsys):
    from mirrorbert.cli import app as cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "pretrain-mlm" not in sub.choices:
        pytest.skip("mirrorbert.cli.app does not wire pretrain-mlm yet")
    assert cli.main(_cli_args(tmp_path, toy_corpus, tiny_bert)) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    (tmp_path / "again").mkdir()
    assert cli.main(_cli_args(tmp_path / "again", tmp_path / "missing.txt", tiny_bert)) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_quickstart_screen_shows_the_pretraining_headline(tmp_path, toy_corpus, tiny_bert, caplog):
    """The heartbeat counts every logged line; the quickstart's screen filter must not hide the headline, the
    last line before the first beat of the pre-training, or the screen goes silent for longer than the beat."""
    import logging
    import re

    quickstart = (Path(__file__).resolve().parents[2] / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    screen = re.compile(re.search(r"grep --line-buffered -E '([^']+)'", quickstart).group(1))
    caplog.set_level(logging.INFO)
    pretrain(_cfg(tmp_path, toy_corpus, model=str(tiny_bert), epochs=1, stop_after_steps=1))
    form = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    lines = [form.format(record) for record in caplog.records if record.name.startswith("mirrorbert.mlm.pretrain")]
    headline = next(line for line in lines if "train sequences" in line)
    assert screen.search(headline), headline
