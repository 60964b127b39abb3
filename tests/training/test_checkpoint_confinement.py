"""A checkpoint is read only inside its folder (issue 34): every path its manifest names resolves inside it and is
a regular file, its JSON files are bounded in size and depth, and a `step-N` under a root that leads out of the
root is skipped; each refusal is one line naming the file (and the path it names)."""

import json
import logging
import os

import pytest
import torch

from mirrorbert.errors import UserError
from mirrorbert.training import checkpoints
from mirrorbert.training.checkpoints import (CheckpointDamaged, CheckpointManager, load_checkpoint,
                                             read_training_state, verify_checkpoint)


def _save(root, step=1):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()

    def save_model(folder):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}", encoding="utf-8")

    return CheckpointManager(root, keep=5).save(step, save_model, optimizer, extra_state={"epoch": 0})


def _list(step, name, target=None):
    import hashlib

    manifest = json.loads((step / "manifest.json").read_text())
    data = target.read_bytes() if target is not None else b""
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside.bin"
    path.write_bytes(b"somebody else's file\n")
    return path


def _dotdot(step, outside):
    _list(step, "../../outside.bin", outside)
    return "names '../../outside.bin': leads out of the checkpoint"


def _absolute(step, outside):
    _list(step, str(outside), outside)
    return f"names {str(outside)!r}: leads out of the checkpoint"


def _link_out(step, outside):
    (step / "model" / "extra.bin").symlink_to(outside)
    _list(step, "model/extra.bin", outside)
    return "names 'model/extra.bin': leads out of the checkpoint"


def _fifo(step, outside):
    os.mkfifo(step / "model" / "pipe")
    _list(step, "model/pipe")
    return "names 'model/pipe': is a FIFO"


def _deep(step, outside):
    (step / "manifest.json").write_text("[" * 100_000)
    return "manifest.json: damaged (JSON nested deeper"


def _huge(step, outside):
    with open(step / "manifest.json", "wb") as fh:
        fh.truncate(checkpoints.MANIFEST_LIMIT + 1)
    return "manifest.json: 67108865 bytes, more than"


ENTRIES = {"..": _dotdot, "absolute": _absolute, "link out": _link_out, "fifo": _fifo, "deep JSON": _deep,
           "huge": _huge}


@pytest.mark.parametrize("attack", list(ENTRIES))
def test_a_named_checkpoint_whose_manifest_names_a_path_out_is_one_error_line(tmp_path, outside, attack):
    step = _save(tmp_path / "ck")
    expected = ENTRIES[attack](step, outside)
    with pytest.raises(UserError) as info:
        load_checkpoint(step)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--resume {step}:") and expected in message, message
    if attack not in ("deep JSON", "huge"):
        assert f"{step / 'manifest.json'} names" in message


@pytest.mark.parametrize("attack", list(ENTRIES))
def test_under_a_root_it_is_skipped_and_set_aside_for_the_older_one(tmp_path, outside, caplog, attack):
    root = tmp_path / "ck"
    _save(root, 1)
    ENTRIES[attack](_save(root, 2), outside)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        checkpoint = load_checkpoint(root)
    assert checkpoint.step == 1 and checkpoint.path == root / "step-1"
    assert [p.name.split(".damaged-")[0] for p in root.iterdir() if ".damaged-" in p.name] == ["step-2"]
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == 1


def test_a_step_folder_that_is_a_link_out_of_the_root_is_skipped(tmp_path, caplog):
    root = tmp_path / "ck"
    _save(root, 1)
    elsewhere = _save(tmp_path / "elsewhere", 5)
    (root / "step-5").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        assert load_checkpoint(root).step == 1
    assert any("step-5" in r.getMessage() and "leads out" in r.getMessage() for r in caplog.records)
    assert verify_checkpoint(elsewhere)["step"] == 5  # the link's target is left alone


OWN_FILES = [(name, attack) for name in ("checkpoint.json", "training_state.json", "training_state.safetensors")
             for attack in ("link out", "fifo", "deep JSON", "huge")
             if name.endswith(".json") or attack in ("link out", "fifo")]


@pytest.mark.parametrize("name,attack", OWN_FILES)
def test_the_checkpoints_own_files_are_read_only_inside_it(tmp_path, name, attack):
    step = _save(tmp_path / "ck")
    path = step / name
    if attack == "link out":
        copy = tmp_path / f"copy-{name}"
        copy.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(copy)
        expected = "leads out of the checkpoint"
    elif attack == "fifo":
        path.unlink()
        os.mkfifo(path)
        expected = "is a FIFO"
    elif attack == "deep JSON":
        path.write_text("[" * 100_000)
        expected = "nested deeper"
    else:
        with open(path, "wb") as fh:
            fh.truncate(checkpoints.META_LIMIT + 1)
        expected = "more than"
    if attack in ("deep JSON", "huge"):  # the manifest rehashed to match
        _list(step, name, path)
    with pytest.raises(UserError) as info:
        read_training_state(load_checkpoint(step).path)
    message = str(info.value)
    assert "\n" not in message and name in message and expected in message, message


def test_a_missing_checkpoint_json_and_a_stepless_one_are_damage(tmp_path):
    step = _save(tmp_path / "ck")
    (step / "checkpoint.json").write_text(json.dumps({"step": "4"}))
    with pytest.raises(CheckpointDamaged, match="has no step"):
        verify_checkpoint(step)
    (step / "checkpoint.json").unlink()
    with pytest.raises(CheckpointDamaged, match="checkpoint.json is missing"):
        verify_checkpoint(step)


def test_an_intact_checkpoint_still_verifies_and_restores(tmp_path):
    step = _save(tmp_path / "ck")
    assert verify_checkpoint(step)["step"] == 1
    state = read_training_state(step)
    assert state["extra"] == {"epoch": 0} and state["optimizer"]["state"]
