"""The training engine: rotation that never loses the newest good checkpoint, a final save that never
loses the trained state, and resume after kill -9 for each of the three trainers."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mirrorbert.cli.app import main
from mirrorbert.training.checkpoints import CheckpointManager, verify_checkpoint
from mirrorbert.mirror.train import train
from support import assert_same_weights
from support import cpu_cfg_for as cfg_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("engine-data") / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-") and p.name[5:].isdigit())


def _damage(checkpoint: Path) -> None:
    state = checkpoint / "training_state.safetensors"
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
    assert (aside / "training_state.safetensors").stat().st_size == 100
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
    (half / "training_state.safetensors").unlink()
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
    import mirrorbert.mirror.train as trainer

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
    assert "\n" not in message and "the trained model is kept in " in message and "finish the save" in message
    kept = Path(re.search(r"kept in (\S+);", message).group(1))
    try:
        assert (kept / "model.safetensors").is_file()
        from mirrorbert.encoder.model import Encoder

        assert Encoder.load(str(kept), device="cpu").encode(["a cat"]).shape[0] == 1
    finally:
        shutil.rmtree(kept, ignore_errors=True)


# --------------------------------------------------------------------------- kill -9 at a random step
KILL_SCRIPT = """
import importlib, json, sys, time
import mirrorbert.training.engine as engine

real = engine.Engine.check_finite

def slowed(self, loss):  # every step takes >= 0.15 s, so the test can kill it mid-run
    time.sleep(0.15)
    return real(self, loss)

engine.Engine.check_finite = slowed
spec = json.loads(sys.argv[1])
config_module, config_name = spec["config"].split(":")
run_module, run_name = spec["run"].split(":")
config = getattr(importlib.import_module(config_module), config_name)(**spec["kwargs"])
getattr(importlib.import_module(run_module), run_name)(config)
"""


def _kill_at_random_step(spec: dict, root: Path, cwd: Path) -> str:
    """Start the run in a subprocess, SIGKILL it at a random moment after its first checkpoint."""
    import json

    seed = int.from_bytes(os.urandom(4), "little")
    delay = random.Random(seed).uniform(0.0, 0.8)  # the run lasts >= 1.3 s beyond its first checkpoint
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, json.dumps(spec)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (root / "step-1").exists():
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        time.sleep(delay)
        assert proc.poll() is None, f"the run finished before the kill (seed {seed})"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        proc.stderr.close()
    return f"kill seed {seed}, delay {delay:.2f} s, checkpoints then: {_steps(root)}"


def _equal_weights(a: Path, b: Path, where: str) -> None:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"{key} differs ({where})"


@pytest.mark.slow  # reason: a subprocess killed mid-run plus two training runs per trainer (~25 s each)
@pytest.mark.parametrize("trainer", ["mirror", "mlm", "gloss"])
def test_kill_9_at_a_random_step_then_resume_equals_an_uninterrupted_run(trainer, tmp_path, tiny_bert, corpus):
    if trainer == "mirror":
        data = tmp_path / "strings.txt"
        data.write_text("\n".join(corpus) + "\n", encoding="utf-8")
        kwargs = dict(model=str(tiny_bert), data=str(data), batch_size=4, max_length=16, device="cpu",
                      show_progress=False, lr=1e-3, temperature=0.05, mask_span=1, pooling="cls", steps=10)
        config, run = "mirrorbert.mirror.config:TrainConfig", "mirrorbert.mirror.train:train"
    elif trainer == "mlm":
        text = tmp_path / "toy.txt"
        text.write_text("\n\n".join("\n".join(corpus[i % 3] for i in range(j, j + 3)) for j in range(60)) + "\n",
                        encoding="utf-8")
        kwargs = dict(model=str(tiny_bert), corpus=[str(text)], seq_length=32, batch_size=8, lr=2e-3,
                      eval_fraction=0.1, eval_every=4, log_every=2, cache_dir=str(tmp_path / "cache"),
                      show_progress=False, device="cpu", prefetch_batches=2, threads=1, max_tokens=10 * 8 * 32)
        config, run = "mirrorbert.mlm.pretrain:PretrainConfig", "mirrorbert.mlm.pretrain:pretrain"
    else:
        from support import ROWS

        tsv = tmp_path / "triplets.tsv"
        tsv.write_text("".join(f"{w}\t{s}\t{g}\n" for w, s, g in ROWS), encoding="utf-8")
        kwargs = dict(model=str(tiny_bert), triplets=str(tsv), batch_size=4, epochs=2, holdout=0.0, device="cpu",
                      precision="fp32", show_progress=False, lr=1e-3, warmup=0.1, seed=3, mlm_prob=0.2)
        config, run = "mirrorbert.gloss.pretrain:GlossPretrainConfig", "mirrorbert.gloss.pretrain:pretrain"
    import importlib

    make = getattr(importlib.import_module(config.split(":")[0]), config.split(":")[1])
    train_fn = getattr(importlib.import_module(run.split(":")[0]), run.split(":")[1])
    root = tmp_path / "killed.checkpoints"
    killed = dict(kwargs, output=str(tmp_path / "killed"), save_every=1, keep_checkpoints=3)
    where = _kill_at_random_step({"config": config, "run": run, "kwargs": killed}, root, tmp_path)
    assert not (tmp_path / "killed").exists(), where
    # the same thread count as the killed process (OMP_NUM_THREADS=1): float sums split over another number of
    # threads round differently, and bit-exact means the same arithmetic
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_fn(make(**killed, resume=str(root)))  # the checkpoint root: the newest intact checkpoint
        train_fn(make(**kwargs, output=str(tmp_path / "whole")))
    finally:
        torch.set_num_threads(threads)
    _equal_weights(tmp_path / "killed", tmp_path / "whole", where)


@pytest.mark.parametrize("trainer", ["mlm", "gloss"])
def test_pretraining_output_replaced_by_a_file_keeps_the_state(trainer, tmp_path, tiny_bert, corpus, monkeypatch):
    """The same final save serves MLM pre-training and GR-BERT."""
    from mirrorbert.errors import UserError

    out = tmp_path / "out"
    if trainer == "mlm":
        import mirrorbert.mlm.pretrain as module

        text = tmp_path / "toy.txt"
        text.write_text("\n\n".join(corpus) + "\n", encoding="utf-8")
        cfg = module.PretrainConfig(model=str(tiny_bert), corpus=[str(text)], output=str(out), seq_length=16,
                                    batch_size=2, max_tokens=2 * 2 * 16, eval_fraction=0.0, device="cpu",
                                    show_progress=False, cache_dir=str(tmp_path / "cache"), threads=1)
        run = module.pretrain
    else:
        import mirrorbert.gloss.pretrain as module
        from support import ROWS

        tsv = tmp_path / "triplets.tsv"
        tsv.write_text("".join(f"{w}\t{s}\t{g}\n" for w, s, g in ROWS), encoding="utf-8")
        cfg = module.GlossPretrainConfig(model=str(tiny_bert), triplets=str(tsv), output=str(out), batch_size=4,
                                         steps=2, holdout=0.0, device="cpu", show_progress=False)
        run = module.pretrain
    real = module._run_info

    def run_info(*args, **kwargs):
        out.write_text("someone else's file\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "_run_info", run_info)
    with pytest.raises(UserError) as caught:
        run(cfg)
    message = str(caught.value)
    kept = tmp_path / "out.checkpoints" / "step-2"
    assert "\n" not in message and f"kept in {kept}" in message
    assert verify_checkpoint(kept)["step"] == 2 and out.read_text() == "someone else's file\n"
