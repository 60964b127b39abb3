"""Mirror-BERT inside sentence-transformers' trainer (issue 19): the same loss as `mirrorbert train`, a masked
second view drawn reproducibly, and a trained model that loads everywhere."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")

from tiny_models import CORPUS, make_tiny_bert  # noqa: E402

from mirrorbert.errors import UserError  # noqa: E402
from mirrorbert.integrations.sentence_transformers import MirrorBertDataCollator, MirrorBertLoss  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_no_dropout(tmp_path_factory) -> Path:
    folder = make_tiny_bert(tmp_path_factory.mktemp("st") / "tiny")
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # both sides then see the same vectors
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def st_model(folder: Path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    encoder = Transformer(str(folder))
    return SentenceTransformer(modules=[encoder, Pooling(encoder.get_word_embedding_dimension(), "mean")], device="cpu")


def trainer_for(model, strings, tmp_path, loss, collator=None, max_steps=1):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=len(strings),
                                                max_steps=max_steps, learning_rate=1e-3, report_to=[], use_cpu=True,
                                                seed=0, save_strategy="no")
    kwargs = {"data_collator": collator} if collator is not None else {}
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": strings}),
                                      loss=loss, **kwargs)


def infonce_by_hand(first: torch.Tensor, second: torch.Tensor, temperature: float) -> float:
    """Independent formula: for each of the 2B views, -log softmax of its mirror among the other 2B-1 views."""
    views = torch.nn.functional.normalize(torch.cat([first, second]).double(), dim=-1)
    n = first.shape[0]
    total = 0.0
    for i in range(2 * n):
        mirror = (i + n) % (2 * n)
        logits = [float(views[i] @ views[j]) / temperature for j in range(2 * n) if j != i]
        positive = float(views[i] @ views[mirror]) / temperature
        total += -(positive - math.log(sum(math.exp(v) for v in logits)))
    return total / (2 * n)


def test_loss_matches_the_formula_and_mirrorbert_train(tiny_no_dropout, tmp_path):
    strings = CORPUS[:8]
    model = st_model(tiny_no_dropout)
    trainer = trainer_for(model, strings, tmp_path, MirrorBertLoss(model, temperature=0.05))
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        st_loss = float(trainer.compute_loss(model, batch))

    with torch.no_grad():
        vectors = model.encode(strings, convert_to_tensor=True)
    assert st_loss == pytest.approx(infonce_by_hand(vectors, vectors, 0.05), rel=1e-5)

    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mirror.train import train

    data = tmp_path / "strings.txt"
    data.write_text("\n".join(strings) + "\n", encoding="utf-8")
    result = train(TrainConfig(model=str(tiny_no_dropout), data=str(data), output=str(tmp_path / "ours"), steps=1,
                               batch_size=8, temperature=0.05, pooling="mean", mask_span=0, dropout=0.0,
                               show_progress=False, precision="fp32", device="cpu"))
    assert result.final_loss == pytest.approx(st_loss, rel=1e-4)


def test_first_step_gradients_match_mirrorbert_train(tiny_no_dropout, tmp_path):
    """The gradient of every encoder weight through the trainer equals that of `mirrorbert train`'s step loss."""
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.mirror.loss import build_loss
    from mirrorbert.mirror.step import mirror_step_loss

    strings = CORPUS[:8]
    model = st_model(tiny_no_dropout)
    trainer = trainer_for(model, strings, tmp_path, MirrorBertLoss(model, temperature=0.05))
    model.train()
    trainer.compute_loss(model, next(iter(trainer.get_train_dataloader()))).backward()
    theirs = {name: p.grad for name, p in model[0].auto_model.named_parameters() if p.grad is not None}

    encoder = Encoder.load(tiny_no_dropout, pooling="mean", device="cpu")
    encoder.train()
    ids = encoder.tokenize(strings)
    mirror_step_loss(encoder, ids, ids, build_loss("infonce", 0.05), precision="fp32").backward()
    ours = {name: p.grad for name, p in encoder.model.named_parameters() if p.grad is not None}
    assert set(theirs) == set(ours) and len(ours) > 10
    for name, grad in ours.items():
        torch.testing.assert_close(theirs[name], grad, rtol=1e-3, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_collator_masks_one_span_with_the_mask_token_reproducibly(tiny_no_dropout):
    model = st_model(tiny_no_dropout)
    long_strings = [s + " and then some more words" for s in CORPUS[:6]]
    rows = [{"text": s} for s in long_strings]

    def masked_views(seed):
        collator = MirrorBertDataCollator(model, mask_span=5, mask_min_chars=30, seed=seed)
        return [collator.masked_copies(long_strings) for _ in range(2)]  # two batches

    batch = MirrorBertDataCollator(model, mask_span=5, mask_min_chars=30)(rows)
    first, second = masked_views(seed=3)
    assert "text_input_ids" in batch and "text_mirror_input_ids" in batch
    for original, view in zip(long_strings, first):
        assert view.count("[MASK]") == 1
        prefix, suffix = view.split("[MASK]")
        assert original.startswith(prefix) and original.endswith(suffix)
        assert len(original) - len(prefix) - len(suffix) == 5
    assert first != second  # a new draw per batch
    assert masked_views(seed=3) == [first, second]  # the same seed, the same masks
    assert masked_views(seed=4)[0] != first


def test_token_unit_masks_a_span_of_real_tokens(tiny_no_dropout):
    model = st_model(tiny_no_dropout)
    tokenizer = model.tokenizer
    rows = [{"text": s} for s in CORPUS[:6]]
    batch = MirrorBertDataCollator(model, mask_span=2, mask_unit="token", seed=1)(rows)
    plain, masked = batch["text_input_ids"], batch["text_mirror_input_ids"]
    for before, after in zip(plain.tolist(), masked.tolist()):
        changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        assert len(changed) == 2 and changed[1] == changed[0] + 1  # one span of two positions
        assert all(after[i] == tokenizer.mask_token_id for i in changed)
        assert all(before[i] not in tokenizer.all_special_ids for i in changed)
    again = MirrorBertDataCollator(model, mask_span=2, mask_unit="token", seed=1)(rows)["text_mirror_input_ids"]
    assert torch.equal(again, masked)
    with pytest.raises(UserError, match="mask_unit"):
        MirrorBertDataCollator(model, mask_unit="word")


def test_short_strings_stay_whole_and_bad_settings_are_refused(tiny_no_dropout):
    model = st_model(tiny_no_dropout)
    with pytest.raises(UserError, match="mask_span"):
        MirrorBertDataCollator(model, mask_span=-1)
    with pytest.raises(UserError, match="temperature"):
        MirrorBertLoss(model, temperature=0)
    with pytest.raises(UserError, match="loss"):
        MirrorBertLoss(model, loss="triplet")
    from mirrorbert.mirror.loss import MirrorInfoNCE, MirrorMultiSimilarity

    infonce, ms = MirrorBertLoss(model, temperature=0.1), MirrorBertLoss(model, loss="ms")
    assert isinstance(infonce.loss, MirrorInfoNCE) and infonce.loss.temperature == 0.1  # the training loss itself
    assert isinstance(ms.loss, MirrorMultiSimilarity) and ms.get_config_dict()["loss"] == "ms"
    collator = MirrorBertDataCollator(model, mask_span=5, mask_min_chars=30)
    batch = collator([{"text": "a cat"}, {"text": "a dog"}])
    assert torch.equal(batch["text_input_ids"], batch["text_mirror_input_ids"])  # too short to mask
    with pytest.raises(UserError, match="one text column"):
        collator([{"a": "x", "b": "y"}])


@pytest.mark.parametrize("loss_name", ["infonce", "ms"])
def test_training_lowers_the_loss_and_the_model_loads_everywhere(tiny_no_dropout, tmp_path, loss_name):
    from sentence_transformers import SentenceTransformer

    from mirrorbert.encoder.model import Encoder

    strings = [s + " again and again" for s in CORPUS]
    model = st_model(tiny_no_dropout)
    loss = MirrorBertLoss(model, temperature=0.05, loss=loss_name)
    trainer = trainer_for(model, strings, tmp_path, loss, MirrorBertDataCollator(model, mask_span=3, mask_min_chars=10),
                          max_steps=15)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        before = float(loss(*trainer.collect_features(batch)))
    trainer.train()
    with torch.no_grad():
        after = float(loss(*trainer.collect_features(batch)))
    assert after < before

    out = tmp_path / "trained"
    model.save_pretrained(str(out))
    reloaded = SentenceTransformer(str(out), device="cpu").encode(strings[:3], convert_to_tensor=True)
    ours = Encoder.load(out, device="cpu").encode(strings[:3], normalize=False)
    assert torch.allclose(torch.as_tensor(ours).float(), reloaded.float(), atol=1e-5)


def test_example_script_trains_and_saves(tiny_no_dropout, tmp_path):
    data = tmp_path / "strings.txt"
    data.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "model"
    done = subprocess.run([sys.executable, "-W", "default", str(ROOT / "examples" / "sentence_transformers_trainer.py"),
                           str(tiny_no_dropout), str(data), str(out), "--max-steps", "2", "--batch-size", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "modules.json").exists() and (out / "model.safetensors").exists()
    printed = done.stdout + done.stderr  # no deprecation or load warnings (an MLM head, a missing pooler)
    # a library's own source compiled at import (sentence-transformers 3.0 at the floors) is not our call
    ours = "\n".join(line for line in printed.splitlines() if "invalid escape sequence" not in line)
    assert not re.search(r"Warning|deprecated|LOAD REPORT|UNEXPECTED|MISSING", ours), printed[-3000:]
    rates = re.findall(r"'learning_rate': '?([0-9.e+-]+)", printed)  # transformers 4.x logs it as a number  # logged every step: constant, as mirrorbert train
    assert len(rates) == 2 and set(rates) == {"2e-05"}, rates
    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(out), device="cpu").max_seq_length == 50  # the length it was trained at
    mine = tmp_path / "mine"  # the user's folder: refused in one line, untouched
    mine.mkdir()
    (mine / "notes.md").write_text("keep me\n", encoding="utf-8")
    again = subprocess.run([sys.executable, str(ROOT / "examples" / "sentence_transformers_trainer.py"),
                            str(tiny_no_dropout), str(data), str(mine), "--max-steps", "1"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "already exists" in again.stderr.strip().splitlines()[-1], again.stderr[-2000:]
    assert [p.name for p in mine.iterdir()] == ["notes.md"]
