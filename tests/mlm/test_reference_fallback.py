"""The quickstart's offline fallback: the default model when reachable, else a time-bounded reference MLM,
pre-trained once and reused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mirrorbert.mlm import reference
from tiny_models import CORPUS


@pytest.fixture()
def tiny_data(tmp_path, tiny_bert) -> Path:
    """A data directory holding only what the fallback reads: the tokenizer folder."""
    data = tmp_path / "data"
    shutil.copytree(tiny_bert, data / reference.TOKENIZER)
    return data


def _write_corpus(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(CORPUS * 20) + "\n", encoding="utf-8")


def test_reachable_model_is_used_as_is(tiny_bert, tmp_path, tiny_data):
    said = []
    chosen = reference.model_or_fallback(str(tiny_bert), tmp_path / "work", tiny_data,
                                         lambda p: pytest.fail("no corpus needed"), say=said.append)
    assert chosen == str(tiny_bert) and said == []


def test_unreachable_default_falls_back_once_then_reuses(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is unreachable: bert-base-uncased cannot be had
    plan = reference.ReferencePlan(architecture="bert-tiny", budget_s=3, threads=1, batch_size=4, seq_length=16,
                                   calibration_steps=2, min_steps=3, device="cpu")
    said: list[str] = []
    chosen = reference.model_or_fallback("bert-base-uncased", tmp_path / "work", tiny_data, _write_corpus, plan,
                                         say=said.append)
    folder = Path(chosen)
    assert folder == reference.model_dir(tmp_path / "work", plan) and (folder / "config.json").is_file()
    assert len(said) == 1 and "bert-base-uncased cannot be downloaded" in said[0]
    info = json.loads((folder / "quickstart_reference.json").read_text(encoding="utf-8"))
    assert info["max_tokens"] >= 3 * 4 * 16 and info["calibration_tokens_per_s"] > 0
    assert not (tmp_path / "work" / "calibration").exists()

    from mirrorbert.encoder.model import Encoder

    assert Encoder.load(chosen).encode(["a cat"]).shape[0] == 1  # a usable MLM for the Mirror-BERT job

    # Second quickstart: the cached model, no corpus and no pre-training.
    monkeypatch.setattr("mirrorbert.mlm.pretrain.pretrain", lambda cfg: pytest.fail("pre-trained again"))
    said.clear()
    again = reference.model_or_fallback("bert-base-uncased", tmp_path / "work", tiny_data,
                                        lambda p: pytest.fail("corpus rebuilt"), plan, say=said.append)
    assert again == chosen and "cached" in said[0]


def test_missing_tokenizer_is_a_user_error(tmp_path):
    from mirrorbert.errors import UserError

    with pytest.raises(UserError, match="tokenizer not found"):
        reference.ensure_reference_mlm(tmp_path / "w", tmp_path, _write_corpus)


def test_command_line_prints_the_model_to_use(tiny_bert, tmp_path, tiny_data, capsys):
    """`python -m mirrorbert.cli.reference_mlm` (scripts/quickstart.sh): a reachable --model is printed as is."""
    from mirrorbert.cli import reference_mlm

    assert reference_mlm.main(["--model", str(tiny_bert), "--data-dir", str(tiny_data),
                               "--work", str(tmp_path / "work")]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_bert)
    args = reference_mlm.build_parser().parse_args(["--data-dir", "d"])
    plan = reference.ReferencePlan()
    assert (args.model, args.architecture, args.threads, args.budget_s) == ("bert-base-uncased", plan.architecture,
                                                                             plan.threads, plan.budget_s)
