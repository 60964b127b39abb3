"""Helpers several test packages share (tests/ is on sys.path: `from support import ...`): configs, weight comparisons, GR-BERT rows, WordNet and STS-B fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from mirrorbert.mirror.config import TrainConfig

ROWS = [
    ("cat", "the cat sat on the mat", "a small domestic animal"),
    ("mat", "the cat sat on the mat", "a floor covering"),
    ("dog", "a dog ran in the park", "a domestic animal that barks"),
    ("park", "a dog ran in the park", "a public garden in a town"),
    ("fox", "the quick brown fox jumps over the lazy dog", "a wild animal with a bushy tail"),
    ("dog", "the quick brown fox jumps over the lazy dog", "an unattractive or boring thing"),
    ("guitar", "a man is playing a guitar", "a string instrument"),
    ("man", "a man is playing a guitar", "an adult male person"),
    ("woman", "a woman is slicing an onion", "an adult female person"),
    ("onion", "a woman is slicing an onion", "a bulb used as a vegetable"),
    ("football", "two children are playing football in the garden", "a ball game"),
    ("garden", "two children are playing football in the garden", "a plot of land for plants"),
    ("market", "the stock market fell sharply today", "a place where things are traded"),
    ("frog", "scientists discovered a new species of frog", "a small amphibian"),
    ("species", "scientists discovered a new species of frog", "a group of similar organisms"),
    ("bank", "the bank raised interest rates again", "a financial institution"),
    ("book", "she read a book about ancient history", "a written work"),
    ("history", "she read a book about ancient history", "the study of past events"),
    ("rain", "rain is expected tomorrow in the north", "water falling from clouds"),
    ("north", "rain is expected tomorrow in the north", "a direction on a compass"),
]


LICENCE = "  1 This software and database is being provided to you, the LICENSEE, by  \n"


HEAVY = ("torch", "transformers", "numpy", "scipy", "sentence_transformers", "tokenizers", "faiss", "sklearn")


def cfg_for(model, data, out, **kw) -> TrainConfig:
    base = dict(model=str(model), data=str(data), output=str(out), batch_size=4, max_length=16,
                show_progress=False, lr=1e-3, temperature=0.05, mask_span=1, pooling="cls")
    base.update(kw)
    return TrainConfig(**base)


def cpu_cfg_for(model, data, out, **kw) -> TrainConfig:
    return cfg_for(model, data, out, **{"device": "cpu", **kw})


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def write_stsb(root: Path, n_train: int = 24) -> Path:
    d = root / "sts" / "STSBenchmark"
    d.mkdir(parents=True)
    pairs = [("a man is playing a guitar", "a man is playing a guitar", 5.0),
             ("a dog ran in the park", "the cat sat on the mat", 0.4),
             ("a woman is slicing an onion", "a woman is slicing an onion", 4.8),
             ("the stock market fell sharply today", "rain is expected tomorrow in the north", 0.0),
             ("the cat sat on the mat", "a cat sat on a mat", 4.2),
             ("two children are playing football", "children are playing in the garden", 3.1)]
    for name, n in (("train", n_train), ("dev", 6), ("test", 6)):
        rows = [pairs[i % len(pairs)] for i in range(n)]
        (d / f"sts-{name}.csv").write_text(
            "".join(f"g\tf\t2012\t{i}\t{s:.1f}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows)), encoding="utf-8")
    return root


def heavy_modules_after(code: str) -> list[str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    probe = code + f"\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_cli(capsys, argv):
    """`mirrorbert ARGV` in this process: (exit code, stdout, stderr)."""
    from mirrorbert.cli.app import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def cli_hits(out: str):
    """The hit lists of `mirrorbert search`'s JSON lines."""
    return [json.loads(line)["hits"] for line in out.splitlines()]


class LinearMethod:
    """The smallest training method for the engine and the run lifecycle: one linear layer fitted to a fixed
    target; its steps are counted, `on_save` runs when its weights are written (a signal mid-save, say)."""

    def __init__(self, total_steps: int = 10, on_save=None):
        torch.manual_seed(0)
        self.total_steps, self.on_save, self.config, self.precision = total_steps, on_save, {}, "fp32"
        self.layer = torch.nn.Linear(3, 1)
        self.optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        self.scheduler = self.scaler = None
        self.steps_run = 0

    def batches(self):
        while True:
            yield torch.ones(4, 3)

    def train_step(self, batch, engine):
        loss = (self.layer(batch) - 1).pow(2).mean()
        engine.check_finite(loss)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps_run += 1
        return {}

    def after_step(self, step):
        return False

    def finish(self):
        pass

    def save_model(self, folder: Path):
        from safetensors.torch import save_file

        if self.on_save is not None:
            self.on_save()
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.layer.state_dict().items()}, str(folder / "weights.safetensors"))

    def checkpoint_state(self):
        return {"steps_run": self.steps_run}

    def checkpoint_meta(self):
        return {"config": self.config}


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` with its bytes (to show that a refused command changed nothing)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, *fragments: str) -> str:
    """The one `mirrorbert: error:` line on stderr (and no traceback), holding every fragment."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root on Linux): the tests of mount points need it."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    probe = tempfile.mkdtemp()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", probe], capture_output=True)
        return ok
    except OSError:
        return False
    finally:
        os.rmdir(probe)
