"""Model card of every saved model, `train --eval-after`, and saving without pooler warnings."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from mirrorbert.cli.app import main
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError
from mirrorbert.mirror.train import check_eval_after
from mirrorbert.mirror.train import train
from support import cfg_for

TEXTS = ["a cat sat on the mat", "heart attack", "the bank raised rates"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("data") / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stsb_only(shared_data, tmp_path_factory) -> Path:
    """A data dir holding only the first 40 pairs of each STS-B split: `--eval-after sts` runs in a second."""
    root = tmp_path_factory.mktemp("eval-data")
    folder = root / "sts" / "STSBenchmark"
    folder.mkdir(parents=True)
    for name in ("sts-train.csv", "sts-dev.csv", "sts-test.csv"):
        lines = (shared_data / "sts" / "STSBenchmark" / name).read_text(encoding="utf-8").splitlines()[:40]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_train_eval_after_puts_scores_in_card_and_json(tiny_bert, data_file, stsb_only, tmp_path, capsys):
    out = tmp_path / "model"
    code = main(["train", "--model", str(tiny_bert), "--data", str(data_file), "--output", str(out),
                 "--batch-size", "4", "--steps", "2", "--max-length", "16", "--temperature", "0.05",
                 "--mask-span", "1", "--pooling", "mean", "--lr", "1e-3", "--no-progress",
                 "--eval-after", "sts", "--data-dir", str(stsb_only)])
    assert code == 0, capsys.readouterr().err
    meta = json.loads((out / "mirrorbert.json").read_text(encoding="utf-8"))
    evaluation = meta["training"]["eval_after"]
    assert evaluation["tasks"] == ["sts"] and evaluation["data_dir"] == str(stsb_only)
    metrics = evaluation["metrics"]
    assert "sts/stsb" in metrics and "sts/primary" in metrics

    # the recorded score is the one an independent evaluation of the saved model gives
    from mirrorbert.evaluation.sts import evaluate_sts

    again = evaluate_sts(Encoder.load(out, device="cpu"), stsb_only, sets=["stsb"])
    assert metrics["sts/stsb"] == pytest.approx(again["stsb"], abs=1e-6)

    card = (out / "README.md").read_text(encoding="utf-8")
    data = meta["training"]["data"]
    for expected in (
        f'base_model: "{Path(tiny_bert).name}"', "library_name: sentence-transformers", "Mirror-BERT",
        "| temperature | 0.05 |", "| mask_span | 1 |", "| dropout | 0.1 |", "| pooling | mean |",
        "**Output Dimensionality:** 32 dimensions", "| batch_size | 4 |", "| lr | 0.001 |", "| steps | 2 |",
        f"{data['strings']} strings", data["sha256"],
        "## Evaluation", f"| sts | stsb | {metrics['sts/stsb'] * 100:.2f} |",
        f"SentenceTransformer({out.name!r})", f"AutoModel.from_pretrained({out.name!r})",
        "@inproceedings{liu-etal-2021-fast", "Liu, Fangyu and Vuli{\\'c}, Ivan and Korhonen, Anna and Collier, Nigel",
        "Fast, Effective, and Self-Supervised: Transforming Masked Language Models into Universal Lexical and Sentence Encoders",
        "## Training Details", "### Training Dataset", "### Training Hyperparameters", "### Metrics",
        "- **Training Method:** Mirror-BERT", f"- dataset_size:{data['strings']}", "- mirror-bert",
        "@inproceedings{lin-etal-2022-improving",
        f"- final loss (mean of the last 2 steps): {meta['training']['final_loss']}",
    ):
        assert expected in card, expected


def test_card_lists_the_settings_the_run_named_in_their_order():
    """The trainer records which settings the card shows (its config's `card` fields); the card names none."""
    from mirrorbert.publish.model_card import render_model_card

    config = {"lr": 0.001, "seed": 3, "temperature": 0.05, "output": "out", "steps": None}
    info = {"method": "mirror-bert", "config": config, "card_settings": ["temperature", "lr", "steps", "seed", "gone"]}
    card = render_model_card({"training": info, "pooling": "cls"})
    rows = [line for line in card.splitlines() if line.startswith("| ") and not line.startswith("| setting")]
    assert rows == ["| temperature | 0.05 |", "| lr | 0.001 |", "| seed | 3 |"]
    assert "Settings (" not in render_model_card({"training": {**info, "card_settings": "lr"}, "pooling": "cls"})


def test_card_without_training_and_its_transformers_snippet_runs(tiny_bert, tmp_path):
    enc = Encoder.load(tiny_bert, pooling="mean", device="cpu")
    out = enc.save(tmp_path / "plain")
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "no training recorded" in card and "## Training" not in card and "## Evaluation" not in card
    # the card's transformers snippet gives the encoder's vectors (with the model name filled in)
    snippet = card.split("### Direct Usage (Transformers)")[1].split("```python")[1].split("```")[0]
    scope: dict = {}
    exec(snippet.replace("path/to/model", str(out)).replace('["a sentence", "another one"]', repr(TEXTS)), scope)
    np.testing.assert_allclose(scope["vectors"].numpy(), enc.encode(TEXTS), atol=1e-5)


SECTIONS = ("## Model Details", "### Model Description", "### Model Sources", "### Full Model Architecture", "## Usage",
            "### Direct Usage (Sentence Transformers)", "### Direct Usage (Transformers)", "### Direct Usage (mirrorbert)",
            "## Framework Versions", "## Citation", "### BibTeX", "#### Mirror-BERT", "#### GR-BERT")


@pytest.mark.parametrize("pooling", ["cls", "mean", "first-last"])
def test_card_follows_the_sentence_transformers_layout(tiny_bert, tmp_path, pooling):
    import re

    import sentence_transformers
    import transformers
    import yaml
    from sentence_transformers import SentenceTransformer

    out = Encoder.load(tiny_bert, pooling=pooling, device="cpu").save(tmp_path / "m")
    card = (out / "README.md").read_text(encoding="utf-8")
    # the front matter is valid YAML with the hub's keys
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "sentence-transformers" and front["pipeline_tag"] == "sentence-similarity"
    assert front["base_model"] == Path(tiny_bert).name and "language" not in front and "datasets" not in front
    assert {"sentence-transformers", "sentence-similarity", "feature-extraction"} <= set(front["tags"])
    # sentence-transformers' sections, in its order
    places = [card.index(section + "\n") for section in SECTIONS]
    assert places == sorted(places)
    for line in ("- **Model Type:** Sentence Transformer", "- **Maximum Sequence Length:** 64 tokens",
                 "- **Output Dimensionality:** 32 dimensions", "- **Similarity Function:** Cosine Similarity",
                 f"- **Pooling:** `{pooling}`", "- **Training Method:** none (no training recorded)",
                 f"- Transformers: {transformers.__version__}",
                 f"- Sentence Transformers: {sentence_transformers.__version__}"):
        assert line in card, line
    # the architecture (from modules.json and the module configs) is the modules sentence-transformers loads
    block = card.split("### Full Model Architecture")[1].split("```")[1].strip().splitlines()
    assert block[0] == "SentenceTransformer(" and block[-1] == ")"
    shown = [re.match(r"  \((\d+)\): (\w+)\(", line).groups() for line in block[1:-1]]
    loaded = SentenceTransformer(str(out), device="cpu")
    assert shown == [(str(i), type(module).__name__) for i, module in enumerate(loaded)]
    assert "'max_seq_length': 64" in block[1] and "'architecture': 'BertModel'" in block[1]
    assert f"'pooling_mode_cls_token': {pooling == 'cls'}" in block[-2]
    assert f"'pooling_mode_mean_tokens': {pooling != 'cls'}" in block[-2]


def test_card_cites_both_papers_in_well_formed_bibtex():
    from mirrorbert.publish.model_card import CITATION, CITATIONS, GR_BERT_CITATION, render_model_card

    card = render_model_card({"pooling": "mean", "dim": 8, "max_length": 16, "base_model": "bert-base-uncased"})
    for entry in (CITATION, GR_BERT_CITATION):
        assert f"```bibtex\n{entry}\n```" in card
        assert entry.count("{") == entry.count("}") and entry.startswith("@inproceedings{") and entry.endswith("}")
    assert list(CITATIONS) == ["Mirror-BERT", "GR-BERT"]
    for field in ('title = "Improving Contextual Representation with Gloss Regularized Pre-training"',
                  'booktitle = "Findings of the Association for Computational Linguistics: NAACL 2022"',
                  'year = "2022"', 'eprint = "2205.06603"', 'archivePrefix = "arXiv"', "An, Zhecheng"):
        assert field in GR_BERT_CITATION, field
    # a hub base model is linked; the untrained card's title and snippets use sentence-transformers' wording
    assert "[bert-base-uncased](https://huggingface.co/bert-base-uncased)" in card
    assert "# SentenceTransformer based on bert-base-uncased" in card and "SentenceTransformer('path/to/model')" in card
    assert "### Full Model Architecture" not in card  # no folder to read it from


def test_card_language_and_repo_name():
    import yaml

    from mirrorbert.publish.model_card import render_model_card

    meta = {"pooling": "cls", "dim": 8, "max_length": 16, "base_model": "bert-base-uncased",
            "training": {"method": "mirror-bert", "config": {"words_top": 100, "lang": "fr", "output": "/x/y/words"},
                         "data": {"strings": 100, "source": "wordfreq:fr"}}}
    card = render_model_card(meta)
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["language"] == ["fr"] and "dataset_size:100" in front["tags"] and "- **Language:** fr" in card
    assert "# words" in card and "SentenceTransformer('words')" in card
    pushed = render_model_card(meta, name="me/fr-words")
    assert "# fr-words" in pushed and "SentenceTransformer('me/fr-words')" in pushed and "'words'" not in pushed


@pytest.mark.parametrize("tasks, data_dir, message", [
    ("sts,nope", None, "unknown task"),
    ("sts", "/no/such/dir", "data directory not found"),
])
def test_eval_after_is_validated_before_training(tmp_path, data_file, capsys, tasks, data_dir, message):
    with pytest.raises(UserError, match=message):
        check_eval_after(tasks, data_dir)
    args = ["train", "--model", str(tmp_path / "no-model"), "--data", str(data_file), "--output", str(tmp_path / "o"),
            "--eval-after", tasks] + (["--data-dir", data_dir] if data_dir else [])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mirrorbert: error: --eval-after") and message in err[-1]
    assert not (tmp_path / "o").exists()


def _load_log(path) -> str:
    """What transformers logs while AutoModel loads ``path`` (at warning level, whatever was set before)."""
    import transformers
    from transformers import AutoModel

    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    hf_logger = transformers.utils.logging.get_logger()
    previous = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_warning()
    hf_logger.addHandler(handler)
    try:
        model = AutoModel.from_pretrained(path)
    finally:
        hf_logger.removeHandler(handler)
        transformers.utils.logging.set_verbosity(previous)
    return buffer.getvalue(), model


def test_saved_model_loads_without_newly_initialized_pooler(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    # the source MLM has no pooler: loading it with AutoModel reports one (the capture works)
    log, _ = _load_log(tiny_bert)
    assert "pooler.dense.weight" in log and "newly initialized" in log
    enc = Encoder.load(tiny_bert, pooling="cls", device="cpu")
    assert not any("pooler" in n for n, _ in enc.named_parameters())  # taken out: nothing of it trains
    out = enc.save(tmp_path / "saved")
    log, model = _load_log(out)
    assert "MISSING" not in log and "newly initialized" not in log and "pooler" not in log
    st = SentenceTransformer(str(out), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(st, Encoder.load(out, device="cpu").encode(TEXTS), atol=1e-5)


def test_pooler_weights_of_the_source_are_kept(tmp_path):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(3)
    source = BertModel(config)  # with a pooler, like bert-base-uncased's checkpoint
    source.save_pretrained(tmp_path / "src")
    from tiny_models import make_tiny_bert

    make_tiny_bert(tmp_path / "tok")  # borrow a tokenizer
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tmp_path / "tok").save_pretrained(tmp_path / "src")
    Encoder.load(tmp_path / "src", pooling="cls", device="cpu").save(tmp_path / "out")
    log, reloaded = _load_log(tmp_path / "out")
    assert "pooler" not in log
    assert torch.equal(reloaded.pooler.dense.weight, source.pooler.dense.weight)


def test_card_holds_no_absolute_path_of_the_training_machine(tiny_bert, data_file, stsb_only, tmp_path):
    """Base model, data, data directory and output are named by hub id or folder name, never by local path."""
    out = tmp_path / "deep" / "models" / "mine"
    train(cfg_for(tiny_bert, data_file, out, steps=2, eval_after="sts", data_dir=str(stsb_only)))
    card = (out / "README.md").read_text(encoding="utf-8")
    for local in (str(tmp_path), str(tiny_bert), str(data_file.parent), str(stsb_only), str(Path.home())):
        assert local not in card, local
    assert f"base_model: \"{Path(tiny_bert).name}\"" in card and f"`{data_file.name}`" in card
    assert 'SentenceTransformer("mine")' in card or "mine" in card.split("## Usage")[-1]
    # hub ids stay as they are
    from mirrorbert.publish.model_card import public_name

    assert public_name("bert-base-uncased") == "bert-base-uncased"
    assert public_name("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert public_name("/home/me/runs/mlm/") == "mlm" and public_name("C:\\models\\x") == "x"
