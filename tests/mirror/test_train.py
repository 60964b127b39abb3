"""Trainer: dropout views, controlled dropout, determinism, exact resume, interruption, NaN handling."""

import json

import pytest
import torch

from mirrorbert.mirror.config import TrainConfig
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError
from mirrorbert.training.signals import InterruptFlag
from mirrorbert.mirror.loss import build_loss
from mirrorbert.mirror.step import mirror_step_loss
from mirrorbert.mirror.train import train
from mirrorbert.encoder.batching import pad_batch
from mirrorbert.mirror.views import tokenize_once
from support import assert_same_weights, cfg_for


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("data") / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


def _views(encoder, texts, controlled):
    ids = tokenize_once(encoder.tokenizer, texts, 16)
    batch = pad_batch(ids + ids, encoder.tokenizer.pad_token_id)
    encoder.train()
    if controlled:
        from mirrorbert.runtime.randomness import replay_rng

        half = len(texts)
        with replay_rng():
            a = encoder(**{k: v[:half] for k, v in batch.items()})
        b = encoder(**{k: v[half:] for k, v in batch.items()})
        return a, b
    out = encoder(**batch)
    return out[: len(texts)], out[len(texts):]


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_roberta"])
def test_views_differ_with_dropout_and_match_under_controlled_dropout(request, which, corpus):
    enc = Encoder.load(request.getfixturevalue(which), pooling="cls",
                       config_overrides={"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1})
    with torch.no_grad():
        a, b = _views(enc, corpus[:4], controlled=False)
        assert (a - b).abs().max() > 1e-4
        a, b = _views(enc, corpus[:4], controlled=True)
        assert torch.equal(a, b)


def test_controlled_dropout_loss_equals_one_with_identical_inputs(tiny_bert, corpus):
    """With identical inputs and identical masks, every positive pair has cosine 1."""
    enc = Encoder.load(tiny_bert, pooling="cls")
    enc.train()
    ids = tokenize_once(enc.tokenizer, corpus[:4], 16)
    with torch.no_grad():
        loss_ctrl = mirror_step_loss(enc, ids, ids, build_loss("infonce", 0.05), precision="fp32",
                                     controlled_dropout=True)
        loss_free = mirror_step_loss(enc, ids, ids, build_loss("infonce", 0.05), precision="fp32")
    assert loss_ctrl < loss_free


def test_training_reduces_loss_and_saves_metadata(tiny_bert, data_file, tmp_path, monkeypatch):
    import mirrorbert.mirror.step as trainer_module

    losses, real = [], trainer_module.mirror_step_loss

    def spy(*args, **kwargs):
        loss = real(*args, **kwargs)
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(trainer_module, "mirror_step_loss", spy)
    train(cfg_for(tiny_bert, data_file, tmp_path / "b", steps=30))
    # one batch's loss is noisy (4 strings); the first and the last two epochs cover the same strings
    assert len(losses) == 30 and sum(losses[-6:]) < sum(losses[:6])
    meta = json.loads((tmp_path / "b" / "mirrorbert.json").read_text())
    assert meta["training"]["steps"] == 30
    assert meta["training"]["data"]["strings"] == 12
    assert meta["training"]["config"]["temperature"] == 0.05
    assert len(meta["training"]["data"]["sha256"]) == 64
    assert not list(tmp_path.glob(".b.tmp-*"))


def test_same_seed_same_weights(tiny_bert, data_file, tmp_path):
    kw = dict(steps=4, drophead=0.2)
    train(cfg_for(tiny_bert, data_file, tmp_path / "r1", **kw))
    train(cfg_for(tiny_bert, data_file, tmp_path / "r2", **kw))
    assert_same_weights(tmp_path / "r1", tmp_path / "r2")
    train(cfg_for(tiny_bert, data_file, tmp_path / "r3", seed=7, **kw))
    with pytest.raises(AssertionError):
        assert_same_weights(tmp_path / "r1", tmp_path / "r3")


def test_python_preset_is_what_trains_and_what_is_recorded(tiny_bert, data_file, tmp_path):
    """`TrainConfig(preset="word")` trains with the word settings (not the sentence defaults): the same
    weights as the CLI's `--preset word`, and mirrorbert.json records the values that were used."""
    from mirrorbert.cli.app import main

    common = dict(model=str(tiny_bert), data=str(data_file), batch_size=4, steps=3, show_progress=False)
    train(TrainConfig(preset="word", output=str(tmp_path / "py"), **common))
    argv = ["train", "--model", str(tiny_bert), "--data", str(data_file), "--preset", "word", "--batch-size", "4",
            "--steps", "3", "--no-progress", "--output", str(tmp_path / "cli")]
    assert main(argv) == 0
    assert_same_weights(tmp_path / "py", tmp_path / "cli")
    recorded = json.loads((tmp_path / "py" / "mirrorbert.json").read_text())["training"]["config"]
    assert (recorded["preset"], recorded["temperature"], recorded["max_length"], recorded["mask_span"]) == \
        ("word", 0.2, 25, 0)
    # and the sentence settings really give another model, so the comparison above can fail
    train(TrainConfig(preset="sentence", output=str(tmp_path / "sent"), **common))
    with pytest.raises(AssertionError):
        assert_same_weights(tmp_path / "py", tmp_path / "sent")


def test_a_sentence_transformers_start_keeps_its_pooling_unless_pooling_is_given(tiny_bert, data_file, tmp_path,
                                                                                 monkeypatch, caplog):
    """A sentence-transformers model (all-MiniLM-L6-v2 saves mean pooling) trains with its own pooling when none is
    given, saying so; --pooling wins; a raw MLM keeps the default (cls). The collapse advice knows which is raw."""
    import logging

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    import mirrorbert.mirror.train as trainer
    from mirrorbert.cli.app import main

    body, st_folder = Transformer(str(tiny_bert)), tmp_path / "st-model"
    SentenceTransformer(modules=[body, Pooling(body.get_word_embedding_dimension(), "mean")], device="cpu").save(
        str(st_folder))
    raw_mlm = []
    monkeypatch.setattr(trainer, "collapse_advice", lambda *args, **kw: raw_mlm.append(kw["raw_mlm"]) or "")

    def trained_pooling(model, out, *extra):
        argv = ["train", "--model", str(model), "--data", str(data_file), "--batch-size", "4", "--steps", "2",
                "--no-progress", "--output", str(tmp_path / out), *extra]
        assert main(argv) == 0
        return json.loads((tmp_path / out / "mirrorbert.json").read_text())["training"]["config"]["pooling"]

    with caplog.at_level(logging.INFO, logger="mirrorbert.mirror.train"):
        assert trained_pooling(st_folder, "kept") == "mean"
    assert any("sentence-transformers model" in r.getMessage() and "--pooling" in r.getMessage()
               for r in caplog.records)
    assert trained_pooling(st_folder, "given", "--pooling", "cls") == "cls"
    assert trained_pooling(tiny_bert, "raw") == "cls"
    assert raw_mlm == [False, False, True]
    given = TrainConfig(model=str(st_folder), output="o")
    assert not given.pooling_given
    given.pooling = "cls"  # set in Python after the config was made: given too
    assert given.pooling_given and TrainConfig(model="m", pooling="cls", output="o").pooling_given


@pytest.mark.parametrize("which,mask_unit", [("tiny_bert", "char"), ("tiny_roberta", "char"), ("tiny_bert", "token")])
def test_resume_is_exact(request, which, mask_unit, data_file, tmp_path):
    """N steps, checkpoint, resume for N more == 2N steps straight.

    12 strings in batches of 4 make 3 batches per epoch: the checkpoint at step 4 lies inside epoch 1,
    so the resumed run rebuilds epoch 1's order and masks, which the straight run must also have used.
    """
    model = request.getfixturevalue(which)
    kw = dict(steps=8, schedule="linear", warmup_steps=1, max_grad_norm=1.0, mask_span=2, mask_unit=mask_unit)
    train(cfg_for(model, data_file, tmp_path / "straight", save_every=4, keep_checkpoints=3, **kw))
    ckpt = tmp_path / "straight.checkpoints" / "step-4"
    assert (ckpt / "training_state.safetensors").exists() and (ckpt / "training_state.json").exists()
    train(cfg_for(model, data_file, tmp_path / "resumed", resume=str(ckpt), **kw))
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")


def test_views_made_ahead_in_a_thread_train_the_same_model_and_resume_exactly(tiny_bert, data_file, tmp_path,
                                                                               monkeypatch):
    """The GPU path makes the views in a prefetch thread; across epochs and through a resume it trains the
    model the inline (CPU) path trains."""
    from mirrorbert.mirror import step

    kw = dict(steps=8, mask_span=2, mask_unit="char")
    train(cfg_for(tiny_bert, data_file, tmp_path / "inline", **kw))
    monkeypatch.setattr(step, "prefetch_depth", lambda device: 2)
    train(cfg_for(tiny_bert, data_file, tmp_path / "ahead", save_every=4, keep_checkpoints=3, **kw))
    assert_same_weights(tmp_path / "inline", tmp_path / "ahead")
    train(cfg_for(tiny_bert, data_file, tmp_path / "resumed", resume=str(tmp_path / "ahead.checkpoints" / "step-4"),
                  **kw))
    assert_same_weights(tmp_path / "inline", tmp_path / "resumed")


def test_each_epoch_uses_its_own_order(tiny_bert, data_file, tmp_path, monkeypatch):
    import mirrorbert.mirror.step as trainer_module

    seen = []
    real = trainer_module.mirror_step_loss

    def spy(encoder, first, second, *args, **kwargs):
        seen.append(sorted(map(tuple, first)))
        return real(encoder, first, second, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "mirror_step_loss", spy)
    train(cfg_for(tiny_bert, data_file, tmp_path / "ep", epochs=2))
    assert len(seen) == 6
    assert seen[:3] != seen[3:]  # epoch 1 is reshuffled, not a replay of epoch 0
    flat = lambda batches: sorted(x for b in batches for x in b)  # noqa: E731
    assert flat(seen[:3]) == flat(seen[3:])  # and each epoch covers every string once


def test_interrupt_writes_checkpoint_then_resume_finishes(tiny_bert, data_file, tmp_path, monkeypatch):
    class InterruptAtOnce(InterruptFlag):
        def __enter__(self):
            super().__enter__()
            self.raised = True
            return self

    monkeypatch.setattr("mirrorbert.training.engine.InterruptFlag", InterruptAtOnce)
    result = train(cfg_for(tiny_bert, data_file, tmp_path / "int", steps=3))
    assert result.interrupted and result.steps == 1 and not (tmp_path / "int").exists()
    assert result.checkpoint.name == "step-1"
    monkeypatch.setattr("mirrorbert.training.engine.InterruptFlag", InterruptFlag)
    done = train(cfg_for(tiny_bert, data_file, tmp_path / "int", steps=3, resume=str(result.checkpoint.parent)))
    assert done.steps == 3 and (tmp_path / "int" / "model.safetensors").exists()


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tiny_bert, data_file, tmp_path, monkeypatch):
    import mirrorbert.mirror.loss as loss_module

    real = loss_module.MirrorInfoNCE.forward
    calls = {"n": 0}

    def poisoned(self, emb):
        calls["n"] += 1
        loss = real(self, emb)
        return loss * float("nan") if calls["n"] >= 3 else loss

    monkeypatch.setattr(loss_module.MirrorInfoNCE, "forward", poisoned)
    with pytest.raises(UserError, match=r"loss is nan at step 3.*step-2"):
        train(cfg_for(tiny_bert, data_file, tmp_path / "nan", steps=5, save_every=1))
    assert not (tmp_path / "nan").exists()
    assert (tmp_path / "nan.checkpoints" / "step-2").exists()


def test_batch_larger_than_data_is_clamped(tiny_bert, data_file, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        result = train(cfg_for(tiny_bert, data_file, tmp_path / "clamp", batch_size=500, epochs=1))
    assert "larger than the data" in caplog.text
    assert result.steps == 1 and result.info["config"]["batch_size"] == 12


def test_bf16_training_runs_on_cpu(tiny_bert, data_file, tmp_path):
    result = train(cfg_for(tiny_bert, data_file, tmp_path / "bf16", steps=2, precision="bf16"))
    assert result.final_loss == result.final_loss  # finite, not NaN


def test_fp16_training_runs_on_cpu_with_its_loss_scaler(tiny_bert, data_file, tmp_path):
    result = train(cfg_for(tiny_bert, data_file, tmp_path / "fp16", steps=2, precision="fp16", device="cpu"))
    assert result.final_loss == result.final_loss and result.info["precision"] == "fp16"


def test_output_folder_is_protected(tiny_bert, data_file, tmp_path):
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        train(cfg_for(tiny_bert, data_file, tmp_path / "exists", steps=1))
    assert (tmp_path / "exists" / "keep.txt").read_text() == "mine"
    with pytest.raises(UserError, match="only replaces a folder mirrorbert wrote"):  # not ours: never replaced
        train(cfg_for(tiny_bert, data_file, tmp_path / "exists", steps=1, overwrite=True))
    assert (tmp_path / "exists" / "keep.txt").read_text() == "mine"
    train(cfg_for(tiny_bert, data_file, tmp_path / "ours", steps=1))
    (tmp_path / "ours" / "extra.txt").write_text("old")
    with pytest.raises(UserError, match="extra.txt, which mirrorbert did not write"):  # a file mirrorbert never wrote
        train(cfg_for(tiny_bert, data_file, tmp_path / "ours", steps=1, overwrite=True))
    assert (tmp_path / "ours" / "extra.txt").read_text() == "old"
    (tmp_path / "ours" / "extra.txt").unlink()
    train(cfg_for(tiny_bert, data_file, tmp_path / "ours", steps=1, overwrite=True))  # all of it ours: replaced
    assert (tmp_path / "ours" / "mirrorbert.json").is_file()


def test_tensorboard_scalars_are_written(tiny_bert, data_file, tmp_path):
    train(cfg_for(tiny_bert, data_file, tmp_path / "tb", steps=2, log_dir=str(tmp_path / "logs"), log_every=1))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "logs"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2]


# --------------------------------------------------------------------------- reported losses
@pytest.fixture
def short_batch_data(tmp_path, corpus):
    """10 strings in batches of 4: every epoch is 4, 4 and a short 2."""
    path = tmp_path / "ten.txt"
    path.write_text("\n".join(corpus[:10]) + "\n", encoding="utf-8")
    return path


def _recording_losses(monkeypatch) -> list[float]:
    import mirrorbert.mirror.step as step_module

    losses, real = [], step_module.mirror_step_loss

    def spy(*args, **kwargs):
        loss = real(*args, **kwargs)
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(step_module, "mirror_step_loss", spy)
    return losses


def test_final_loss_is_a_window_mean_not_the_short_last_batch(tiny_bert, short_batch_data, tmp_path, monkeypatch):
    losses = _recording_losses(monkeypatch)
    result = train(cfg_for(tiny_bert, short_batch_data, tmp_path / "out", epochs=2))
    assert len(losses) == 6  # 3 batches an epoch: the window is one epoch (fewer steps than WINDOW_STEPS)
    window = losses[-3:]
    assert result.final_loss == sum(window) / 3 and result.final_loss_window_steps == 3
    assert result.last_batch_loss == losses[-1] != result.final_loss
    saved = json.loads((tmp_path / "out" / "mirrorbert.json").read_text())["training"]
    assert (saved["final_loss"], saved["final_loss_window_steps"], saved["last_batch_loss"]) == \
        (result.final_loss, 3, losses[-1])
    assert saved["mean_loss_last_epoch"] == sum(losses[3:]) / 3


@pytest.mark.parametrize("stop", [4, 5])
def test_resumed_run_reports_the_losses_of_the_straight_run(tiny_bert, short_batch_data, tmp_path, monkeypatch, stop):
    """Checkpoint inside epoch 1 (after 1 or 2 of its 3 batches), resume to its end: the epoch mean covers the
    whole epoch, the window reaches back before the resume, and every loss field is the straight run's."""
    losses = _recording_losses(monkeypatch)
    kw = dict(steps=6, schedule="linear", warmup_steps=1)
    straight = train(cfg_for(tiny_bert, short_batch_data, tmp_path / "straight", save_every=stop, **kw))
    assert len(losses) == 6 and straight.info["mean_loss_last_epoch"] == sum(losses[3:]) / 3
    resumed = train(cfg_for(tiny_bert, short_batch_data, tmp_path / "resumed",
                            resume=str(tmp_path / "straight.checkpoints" / f"step-{stop}"), **kw))
    assert len(losses) == 6 + 6 - stop  # only the steps after the checkpoint ran again
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    for key in ("final_loss", "final_loss_window_steps", "last_batch_loss", "mean_loss_last_epoch"):
        assert resumed.info[key] == straight.info[key], key
    assert resumed.info["collapse"]["first_loss"] == straight.info["collapse"]["first_loss"] == losses[0]


def test_loss_record_window_and_damaged_state():
    from mirrorbert.training.loss_record import WINDOW_STEPS, LossRecord

    record = LossRecord(steps_per_epoch=1000)
    for i in range(120):
        record.add(float(i))
    assert record.window == WINDOW_STEPS == 50 and record.final == sum(range(70, 120)) / 50
    again = LossRecord(steps_per_epoch=1000)
    again.restore({"losses": record.state()}, "--resume ckpt")
    assert again.fields() == record.fields()
    record.finish()
    assert record.mean_last_epoch == sum(range(120)) / 120
    for bad in ({"recent": "x", "epoch_steps": 0}, {"recent": [None], "epoch_steps": 0},
                {"recent": [1.0], "epoch_steps": 1, "first": "nan"}, [1.0], None):
        with pytest.raises(UserError, match=r"--resume ckpt: the training state is damaged"):
            LossRecord(3).restore({"losses": bad}, "--resume ckpt")
