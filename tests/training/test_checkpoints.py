"""Checkpoints that survive damage (issue 11): manifests, skipping damaged ones, stale temps, SIGTERM, resume rules."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mirrorbert.training.checkpoints import MANIFEST, verify_checkpoint
from mirrorbert.errors import UserError
from mirrorbert.mirror.train import train
from support import assert_same_weights
from support import cpu_cfg_for as cfg_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("ckdata") / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_bert, data_file):
    """One uninterrupted 4-step run that checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("reference")
    train(cfg_for(tiny_bert, data_file, root / "out", steps=4, save_every=2, keep_checkpoints=3))
    return root


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def copy_checkpoints(reference: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ck"
    shutil.copytree(reference / "out.checkpoints", root)
    return root


def test_checkpoint_has_a_manifest_of_every_file(reference):
    step = reference / "out.checkpoints" / "step-4"
    files = json.loads((step / MANIFEST).read_text(encoding="utf-8"))["files"]
    on_disk = {p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file() and p.name != MANIFEST}
    assert set(files) == on_disk
    assert {"training_state.safetensors", "training_state.json", "checkpoint.json", "model/model.safetensors"} <= on_disk
    assert not any(name.endswith((".pt", ".bin", ".pkl")) for name in on_disk)  # no pickle anywhere
    import hashlib

    for name in ("training_state.safetensors", "training_state.json"):
        expected = hashlib.sha256((step / name).read_bytes()).hexdigest()
        assert files[name] == {"size": (step / name).stat().st_size, "sha256": expected}
    assert verify_checkpoint(step)["step"] == 4


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE = {
    "truncated weights": lambda s: _truncate(s / "model" / "model.safetensors"),
    "truncated training state": lambda s: _truncate(s / "training_state.safetensors"),
    "broken checkpoint.json": lambda s: (s / "checkpoint.json").write_text("{\"step\": 4,", encoding="utf-8"),
    "missing file": lambda s: (s / "model" / "config.json").unlink(),
    "no manifest (interrupted)": lambda s: ((s / MANIFEST).unlink(), (s / "training_state.safetensors").unlink()),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_skips_a_damaged_newest_checkpoint(reference, isolated, tiny_bert, data_file, caplog, damage):
    root = copy_checkpoints(reference, isolated)
    DAMAGE[damage](root / "step-4")
    with caplog.at_level(logging.WARNING, logger="mirrorbert.training.checkpoints"):
        result = train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, save_every=2, keep_checkpoints=3,
                               resume=str(root), checkpoint_dir=str(root)))
    warnings = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(warnings) == 1 and "step-4" in warnings[0]
    assert result.steps == 4
    assert_same_weights(isolated / "out", reference / "out")  # resumed from step 2, same end point
    assert verify_checkpoint(root / "step-4")["step"] == 4  # the damaged one was rewritten


@pytest.mark.parametrize("damage", ["truncated weights", "truncated training state", "broken checkpoint.json",
                                    "missing file"])
def test_a_damaged_named_checkpoint_is_one_error_line(reference, isolated, tiny_bert, data_file, damage,
                                                      monkeypatch):
    import mirrorbert.encoder.model

    monkeypatch.setattr(mirrorbert.encoder.model.Encoder, "load", lambda *a, **k: pytest.fail("model loaded"))
    root = copy_checkpoints(reference, isolated)
    DAMAGE[damage](root / "step-4")
    with pytest.raises(UserError) as info:
        train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, resume=str(root / "step-4")))
    message = str(info.value)
    assert "\n" not in message and "step-4" in message
    bad = {"truncated weights": "model.safetensors", "truncated training state": "training_state.safetensors",
           "broken checkpoint.json": "checkpoint.json", "missing file": "config.json"}[damage]
    assert bad in message


def test_no_intact_checkpoint_at_all(reference, isolated, tiny_bert, data_file):
    root = copy_checkpoints(reference, isolated)
    for step in ("step-2", "step-4"):
        _truncate(root / step / "training_state.safetensors")
    with pytest.raises(UserError, match="no intact checkpoint"):
        train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, resume=str(root)))


def test_stale_temp_folders_are_removed(reference, isolated, tiny_bert, data_file):
    root = copy_checkpoints(reference, isolated)
    stale = root / ".step-6.tmp-abc123"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(b"half")
    train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, resume=str(root), checkpoint_dir=str(root)))
    assert not stale.exists()


def test_resume_with_changed_hyperparameters_is_refused(reference, isolated, tiny_bert, data_file):
    root = copy_checkpoints(reference, isolated)
    with pytest.raises(UserError) as info:
        train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, lr=5e-4, batch_size=6, resume=str(root),
                      checkpoint_dir=str(root)))
    assert "--batch-size (4 -> 6)" in str(info.value) and "--lr (0.001 -> 0.0005)" in str(info.value)
    # bookkeeping and the budget may change: more steps, other logging, other checkpoint cadence
    result = train(cfg_for(tiny_bert, data_file, isolated / "out", steps=5, save_every=1, log_every=3,
                           resume=str(root), checkpoint_dir=str(root)))
    assert result.steps == 5


SIGTERM_SCRIPT = """
import os, signal, sys
import mirrorbert.mirror.step as trainer
real = trainer.backward_and_step
calls = 0
def stepping(*args, **kwargs):
    global calls
    real(*args, **kwargs)
    calls += 1
    if calls == 3:
        os.kill(os.getpid(), signal.SIGTERM)  # what a job scheduler sends on preemption
trainer.backward_and_step = stepping
from mirrorbert.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_writes_a_checkpoint_and_resume_is_exact(reference, isolated, tiny_bert, data_file):
    args = ["train", "--model", str(tiny_bert), "--data", str(data_file), "--output", "out", "--steps", "4",
            "--batch-size", "4", "--max-length", "16", "--lr", "1e-3", "--temperature", "0.05", "--mask-span", "1",
            "--pooling", "cls", "--device", "cpu", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HOME": str(isolated / "home")}
    proc = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT, *args], cwd=isolated, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "SIGTERM received" in proc.stderr
    checkpoint = isolated / "out.checkpoints" / "step-3"
    assert verify_checkpoint(checkpoint)["step"] == 3
    assert not (isolated / "out").exists()
    result = train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, resume=str(checkpoint)))
    assert result.steps == 4
    assert_same_weights(isolated / "out", reference / "out")


def test_interrupt_flag_restores_both_handlers():
    from mirrorbert.training.signals import InterruptFlag

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with InterruptFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.raised and flag.signal == signal.SIGTERM
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_pretrain_mlm_skips_a_damaged_newest_checkpoint(isolated, tiny_bert, corpus, caplog):
    from mirrorbert.mlm.pretrain import PretrainConfig, pretrain

    text = isolated / "corpus.txt"
    text.write_text("\n\n".join(corpus * 4) + "\n", encoding="utf-8")
    common = dict(corpus=[str(text)], model=str(tiny_bert), seq_length=16, batch_size=2, max_tokens=4 * 2 * 16,
                  eval_fraction=0.0, device="cpu", precision="fp32", show_progress=False, save_every=2,
                  keep_checkpoints=3, cache_dir=str(isolated / "cache"))
    full = pretrain(PretrainConfig(output=str(isolated / "a"), **common))
    root = isolated / "a.checkpoints"
    _truncate(root / "step-4" / "model" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="mirrorbert.training.checkpoints"):
        again = pretrain(PretrainConfig(output=str(isolated / "b"), resume=str(root), checkpoint_dir=str(root),
                                        **common))
    assert any("skipping" in r.getMessage() and "step-4" in r.getMessage() for r in caplog.records)
    assert again.steps == full.steps == 4
    assert_same_weights(isolated / "b", isolated / "a")
    with pytest.raises(UserError, match=r"changed options: --lr \(None -> 0\.001\), --weight-decay"):
        pretrain(PretrainConfig(output=str(isolated / "c"), resume=str(root), checkpoint_dir=str(root),
                                **{**common, "lr": 1e-3, "weight_decay": 0.1}))


def test_interrupted_first_write_does_not_block_a_new_run(isolated, tiny_bert, data_file):
    from mirrorbert.safeguards.writes import mark_folder

    root = isolated / "out.checkpoints"
    (root / ".step-1.tmp-zz9" / "model").mkdir(parents=True)
    mark_folder(root)
    (root / "my-notes.txt").write_text("keep", encoding="utf-8")
    result = train(cfg_for(tiny_bert, data_file, isolated / "out", steps=2, save_every=1))
    assert result.steps == 2 and not (root / ".step-1.tmp-zz9").exists()
    assert sorted(p.name for p in root.glob("step-*")) == ["step-1", "step-2"]
    # --overwrite discards only what mirrorbert wrote
    train(cfg_for(tiny_bert, data_file, isolated / "out", steps=1, save_every=1, overwrite=True))
    assert sorted(p.name for p in root.glob("step-*")) == ["step-1"]
    assert (root / "my-notes.txt").read_text(encoding="utf-8") == "keep"


# --------------------------------------------------------------------------- no pickle (issue 26)
class _Payload:
    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('ran')",))


def _same(a, b) -> bool:
    """Deep equality, tensors by value, dtype and shape; types (tuple vs list, int vs float) must match."""
    import numpy as np

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def _optimizer_state() -> dict:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    from mirrorbert.runtime.randomness import rng_state

    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": None,
            "rng": rng_state(), "extra": {"step": 3, "loss": float("nan"), "best": float("-inf"),
                                          "history": [{"epoch": 1, "accuracy": 0.5}], "pair": (1, "a"),
                                          "__tensor__": "a key that looks like a marker", 7: [True, None]}}


def test_training_state_round_trips_exactly_through_safetensors_and_json(tmp_path):
    from mirrorbert.training.state_format import load_state, save_state

    state = _optimizer_state()
    tensors, text = save_state(tmp_path, "training_state", state)
    loaded = load_state(tmp_path, "training_state", "--resume")
    assert _same(state, loaded)
    assert set(state["optimizer"]["state"]) == {0, 1, 2, 3}  # int parameter ids stay ints
    json.loads(text.read_text(encoding="utf-8"))  # strict JSON: no NaN literal
    assert "NaN" not in text.read_text(encoding="utf-8")
    assert tensors.read_bytes()[8:9] == b"{"  # a safetensors header, no pickle


def test_a_checkpoint_without_a_manifest_is_refused_in_one_line(reference, isolated, tiny_bert, data_file):
    """No manifest: not a checkpoint mirrorbert finished writing, whatever else it holds (here a crafted
    training_state.pt, which is never read)."""
    root = copy_checkpoints(reference, isolated)
    step = root / "step-2"
    state = _optimizer_state()
    state["extra"]["note"] = _Payload(isolated / "CANARY")
    torch.save(state, step / "training_state.pt")
    for name in ("training_state.safetensors", "training_state.json", MANIFEST):
        (step / name).unlink()
    with pytest.raises(UserError) as info:
        train(cfg_for(tiny_bert, data_file, isolated / "out", steps=4, resume=str(step)))
    message = str(info.value)
    assert "\n" not in message and str(step / MANIFEST) in message and "is missing" in message, message
    assert not (isolated / "CANARY").exists() and not (isolated / "out").exists()


def test_unsigned_arrays_round_trip_and_a_crafted_array_type_is_refused(tmp_path):
    """numpy's RNG key is uint32, which older safetensors cannot store: it goes in as int32 and comes back as the
    same bits; a training_state.json asking to view those bytes as anything else (objects) is one error line."""
    import numpy as np

    from mirrorbert.training.state_format import load_state, save_state

    key = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.uint32)
    _, text = save_state(tmp_path, "training_state", {"key": key, "wide": key.astype(np.uint64)})
    loaded = load_state(tmp_path, "training_state", "--resume")
    assert loaded["key"].dtype == np.uint32 and loaded["key"].tolist() == key.tolist()
    assert loaded["wide"].dtype == np.uint64 and loaded["wide"].tolist() == key.tolist()
    text.write_text(text.read_text(encoding="utf-8").replace('"<u4"', '"|O"'), encoding="utf-8")
    with pytest.raises(UserError, match="does not match"):
        load_state(tmp_path, "training_state", "--resume")
