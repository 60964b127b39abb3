"""The training engine: rotation that never loses the newest good checkpoint, a final save that never
loses the trained state, and resume after kill -9 for each of the three trainers."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorbert.cli import main
from mirrorbert.training.checkpoints import CheckpointManager, verify_checkpoint
from mirrorbert.trainer import train
from test_checkpoints import assert_same_weights, cfg_for

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("engine-data") / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-") and p.name[5:].isdigit())


def _damage(checkpoint: Path) -> None:
    state = checkpoint / "training_state.pt"
    state.write_bytes(state.read_bytes()[:100])  # truncated, as by a crash or a full disk


# --------------------------------------------------------------------------- rotation (issue 17, case 10)
def test_rotation_after_falling_back_past_a_damaged_checkpoint_keeps_the_good_one(tmp_path, tiny_bert, data_file):
    """Newest step-3 damaged; resuming falls back to step-2. With --keep-checkpoints 1 the old rotation
    deleted the good step-2 and left the damaged step-3 as the newest; now step-3 is set aside (renamed,
    not deleted) and every save keeps the checkpoint it has just written and verified."""
    out = tmp_path / "out"
    train(cfg_for(tiny_bert, data_file, out, steps=3, save_every=1, keep_checkpoints=2))
    root = tmp_path / "out.checkpoints"
    assert _steps(root) == ["step-2", "step-3"]
    _damage(root / "step-3")
    shutil.rmtree(out)
    resumed = train(cfg_for(tiny_bert, data_file, out, steps=4, save_every=1, keep_checkpoints=1, resume=str(root)))
    assert resumed.steps == 4
    assert _steps(root) == ["step-4"]
    assert verify_checkpoint(root / "step-4")["step"] == 4
    (aside,) = root.glob("step-3.damaged-*")  # kept for inspection, out of the step-N namespace
    assert (aside / "training_state.pt").stat().st_size == 100
    whole = tmp_path / "whole"
    train(cfg_for(tiny_bert, data_file, whole, steps=4))
    assert_same_weights(out, whole)


def test_an_incomplete_checkpoint_never_counts_as_the_newest(tmp_path, tiny_bert, data_file):
    out = tmp_path / "out"
    train(cfg_for(tiny_bert, data_file, out, steps=2, save_every=1, keep_checkpoints=3))
    root = tmp_path / "out.checkpoints"
    half = root / "step-9"  # a folder of that name whose files were never all written
    shutil.copytree(root / "step-2", half)
    (half / "manifest.json").unlink()
    (half / "training_state.pt").unlink()
    latest = CheckpointManager(root).latest()
    assert latest is not None and latest.step == 2
    assert not half.exists() and len(list(root.glob("step-9.damaged-*"))) == 1


def test_rotation_keeps_only_verified_writes(tmp_path, monkeypatch):
    """A write that does not read back as written never replaces anything and never prunes."""
    import torch

    from mirrorbert.training import checkpoints as ck

    manager = CheckpointManager(tmp_path / "ckpt", keep=1)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def save_model(folder):
        folder.mkdir(parents=True)
        torch.save(model.state_dict(), folder / "weights.pt")

    manager.save(1, save_model, optimizer)
    real_manifest = ck.write_manifest

    def corrupting_manifest(folder):
        path = real_manifest(folder)
        (Path(folder) / "model" / "weights.pt").write_bytes(b"garbage")  # changes after the manifest
        return path

    monkeypatch.setattr(ck, "write_manifest", corrupting_manifest)
    with pytest.raises(ck.CheckpointDamaged):
        manager.save(2, save_model, optimizer)
    assert _steps(tmp_path / "ckpt") == ["step-1"]
    assert verify_checkpoint(tmp_path / "ckpt" / "step-1")["step"] == 1


# --------------------------------------------------------------------------- the final save (case 9)
def _sabotage_before_final_save(monkeypatch, action) -> None:
    import mirrorbert.trainer as trainer

    real = trainer._run_info

    def run_info(*args, **kwargs):  # runs after the last step, just before the model is written
        action()
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "_run_info", run_info)


def test_output_replaced_by_a_file_mid_run_keeps_the_state_in_a_checkpoint(tmp_path, tiny_bert, data_file,
                                                                          monkeypatch, capsys):
    out = tmp_path / "out"
    _sabotage_before_final_save(monkeypatch, lambda: out.write_text("someone else's file\n"))
    code = main(["train", "--model", str(tiny_bert), "--data", str(data_file), "--output", str(out), "--steps", "3",
                 "--batch-size", "4", "--max-length", "16", "--lr", "1e-3", "--temperature", "0.05", "--mask-span",
                 "1", "--pooling", "cls", "--device", "cpu", "--no-progress"])
    assert code != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(errors) == 1
    kept = tmp_path / "out.checkpoints" / "step-3"
    assert f"kept in {kept}" in errors[0] and "--resume" in errors[0]
    assert out.read_text() == "someone else's file\n"  # the user's file is untouched
    assert verify_checkpoint(kept)["step"] == 3
    monkeypatch.undo()
    elsewhere = tmp_path / "elsewhere"
    train(cfg_for(tiny_bert, data_file, elsewhere, steps=3, resume=str(kept)))
    whole = tmp_path / "whole"
    train(cfg_for(tiny_bert, data_file, whole, steps=3))
    assert_same_weights(elsewhere, whole)


def test_parent_removed_mid_run_keeps_the_weights_in_a_temporary_folder(tmp_path, tiny_bert, data_file,
                                                                       monkeypatch):
    from mirrorbert.errors import UserError

    parent = tmp_path / "runs"
    parent.mkdir()

    def remove_parent():
        shutil.rmtree(parent)
        parent.write_text("not a folder any more\n")  # nothing can be created under it, even as root

    _sabotage_before_final_save(monkeypatch, remove_parent)
    with pytest.raises(UserError) as caught:
        train(cfg_for(tiny_bert, data_file, parent / "out", steps=2))
    message = str(caught.value)
    assert "\n" not in message and "the trained weights are kept in " in message
    kept = Path(message.rsplit("kept in ", 1)[1])
    try:
        assert (kept / "model.safetensors").is_file()
        from mirrorbert.encoder import Encoder

        assert Encoder.load(str(kept), device="cpu").encode(["a cat"]).shape[0] == 1
    finally:
        shutil.rmtree(kept, ignore_errors=True)
