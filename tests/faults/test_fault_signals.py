"""Signals at each phase of a command leave nothing behind (class 3 of the fault suite): Ctrl-C, SIGTERM and SIGHUP
sent at start-up (while the command line is still importing), while reading the input, right after the write
probe or the first temporary is made (inside the call that makes it), and at the final rename; a repeated
SIGTERM still ends a run with 130 after its checkpoint; SIGHUP under nohup changes nothing.

In-process runs send the signal to this process from a wrapped call: its handler runs at once, at a chosen
instant. A test-owned fallback handler stands in for the default one, so a signal mirrorbert does not handle
fails the test instead of killing the test process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fault_tools import SIGNALS, TRACEBACK, command_env, leftovers, text

from mirrorbert.cli.app import main


class NotHandled(BaseException):
    """A signal reached the test's fallback handler: mirrorbert did not handle it."""


@pytest.fixture(autouse=True)
def fallback_handlers():
    def fallback(signum, frame):
        raise NotHandled(signal.Signals(signum).name)

    before = {sig: signal.signal(sig, fallback) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield fallback
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _fire(sent: list, phase: str, sig: int) -> None:
    if not sent:
        sent.append(phase)
        os.kill(os.getpid(), sig)


def inject(monkeypatch, phase: str, sig: int, output: Path) -> list:
    """Send `sig` once, at `phase` of the command; returns a list that holds the phase once it was sent."""
    sent: list = []
    if phase == "reading":
        import mirrorbert.data.readers as readers
        import mirrorbert.data.strings as strings

        real = readers.open_input

        def open_input(*args, **kwargs):
            _fire(sent, phase, sig)
            return real(*args, **kwargs)

        for module in (readers, strings):
            if hasattr(module, "open_input"):
                monkeypatch.setattr(module, "open_input", open_input)
    elif phase in ("write probe", "first temporary"):
        mark = ".mirrorbert-write-test" if phase == "write probe" else ".tmp-"
        for name in ("mkstemp", "mkdtemp"):
            real_make = getattr(tempfile, name)

            def make(*args, _real=real_make, **kwargs):
                made = _real(*args, **kwargs)
                if mark in str(kwargs.get("prefix", "")):
                    _fire(sent, phase, sig)  # the temporary exists: its clean-up must already be registered
                return made

            monkeypatch.setattr(tempfile, name, make)
    elif phase == "final rename":
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if os.fsdecode(os.path.basename(dst)) == output.name:
                _fire(sent, phase, sig)
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", replace)
    return sent


def _trained(tmp_path_factory, tiny_bert, corpus) -> Path:
    data = tmp_path_factory.mktemp("signals-data") / "s.txt"
    data.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    out = data.parent / "trained"
    assert main(["train", "--model", str(tiny_bert), "--data", str(data), "--output", str(out), "--steps", "1",
                 "--batch-size", "4", "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert, corpus):
    return _trained(tmp_path_factory, tiny_bert, corpus)


def command(name: str, model: Path, data: Path, out: Path, trained_model: Path | None = None) -> list[str]:
    """The command line of `name` writing `out`."""
    return {
        "encode": ["encode", "--model", str(model), "--input", str(data), "--output", str(out), "--no-progress"],
        "index": ["index", "--model", str(model), "--corpus", str(data), "--output", str(out), "--no-progress"],
        "train": ["train", "--model", str(model), "--data", str(data), "--output", str(out), "--steps", "2",
                  "--batch-size", "4", "--max-length", "16", "--no-progress"],
        "pretrain-mlm": ["pretrain-mlm", "--model", str(model), "--corpus", str(data), "--output", str(out),
                         "--seq-length", "16", "--batch-size", "4", "--max-tokens", "128", "--eval-fraction", "0.1",
                         "--no-progress"],
        "export": ["export", "--model", str(model), "--output", str(out)],
        "push --dry-run": ["push", "--model", str(trained_model), "--repo", "user/name", "--dry-run", "--output",
                           str(out)],
    }[name]


OUTPUTS = {"encode": "v.npy", "index": "idx", "train": "model", "pretrain-mlm": "mlm", "export": "served",
           "push --dry-run": "upload"}


def check_run(status: int, err: str, out: Path, sent: list, *folders: Path) -> None:
    """The signal was sent; the command ended with 130 (or finished first: a signal waits during a final
    save); nothing is left behind; an output that exists is whole."""
    assert sent, "the phase was never reached"
    assert TRACEBACK not in err and "NotHandled" not in err, err[-3000:]
    assert status in (0, 130), (status, err[-3000:])
    if status == 130:
        assert "interrupted" in err or "stopped by" in err or "preempted" in err, err[-2000:]
    assert leftovers(*folders) == []
    if out.suffix == ".npy" and out.exists():
        assert np.load(out).shape[0] == 12
    elif out.exists():
        assert (out / ".mirrorbert-output").is_file() or (out / ".mirrorbert-index").exists() or any(out.iterdir())


PHASES = ["reading", "write probe", "first temporary", "final rename"]
FAST = ["encode", "index", "train"]


def _run_phase(name, phase, signame, tmp_path, tiny_bert, strings_file, monkeypatch, capsys, trained_model=None):
    if name == "export":
        pytest.importorskip("onnxruntime")
    if phase == "reading" and name in ("export", "push --dry-run"):
        pytest.skip(f"{name} reads a model only, no text input")
    out = tmp_path / "out" / OUTPUTS[name]
    sent = inject(monkeypatch, phase, SIGNALS[signame], out)
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP))
    status = main(command(name, tiny_bert, strings_file, out, trained_model))
    monkeypatch.undo()
    err = capsys.readouterr().err
    check_run(status, err, out, sent, tmp_path, Path(os.environ["MIRRORBERT_CACHE"]))
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == handlers


@pytest.mark.parametrize("signame", sorted(SIGNALS))
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("name", FAST)
def test_a_signal_at_each_phase_leaves_nothing_behind(name, phase, signame, tmp_path, tiny_bert, strings_file,
                                                      monkeypatch, capsys):
    if name == "train" and phase != "first temporary" and signame != "SIGHUP":
        pytest.skip("train: every signal at the first temporary, SIGHUP at every phase (the rest is slow)")
    _run_phase(name, phase, signame, tmp_path, tiny_bert, strings_file, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("signame", sorted(SIGNALS))
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("name", ["train", "pretrain-mlm", "export", "push --dry-run"])
def test_a_signal_at_each_phase_of_the_other_commands(name, phase, signame, tmp_path, tiny_bert, strings_file,
                                                      trained, monkeypatch, capsys):
    _run_phase(name, phase, signame, tmp_path, tiny_bert, strings_file, monkeypatch, capsys, trained)


# --------------------------------------------------------------------------- start-up
START_UP = """
import importlib.abc, os, runpy, signal, sys

MODULE, SIGNAL = sys.argv[1], getattr(signal, sys.argv[2])

class SendWhenImported(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIGNAL)
        return None

sys.meta_path.insert(0, SendWhenImported())
sys.argv = ["mirrorbert", *sys.argv[3:]]
runpy.run_module("mirrorbert", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("signame", sorted(SIGNALS))
@pytest.mark.parametrize("module", ["mirrorbert.cli.app", "torch"])
def test_a_signal_while_the_command_is_still_importing_is_a_quiet_130(module, signame, tmp_path, tiny_bert,
                                                                       strings_file):
    """`python -m mirrorbert` (the console script's code): a signal while the command line's modules, or the
    command's own (torch), are imported ends it with one word, not a traceback."""
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", START_UP, module, signame, "encode", "--model", str(tiny_bert),
                             "--input", str(strings_file), "--output", str(out / "v.npy")],
                            env=command_env(), capture_output=True, timeout=600)
    err = text(result.stderr)
    assert result.returncode == 130 and TRACEBACK not in err, (result.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "mirrorbert: interrupted"
    assert not out.exists() and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- repeated SIGTERM
REPEATED = """
import os, signal, sys
import mirrorbert.cli.app as app
import mirrorbert.training.engine as engine

real_step, real_save, real_main = engine.Engine.check_finite, engine.Engine.save_checkpoint, app.main

def check_finite(self, loss):  # a scheduler's SIGTERM at step 2
    if self.step == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return real_step(self, loss)

def save_checkpoint(self):  # its copies while the checkpoint is written
    os.kill(os.getpid(), signal.SIGTERM)
    try:
        return real_save(self)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)

def main(argv=None):  # and one more once the command has its status
    status = real_main(argv)
    os.kill(os.getpid(), signal.SIGTERM)
    return status

engine.Engine.check_finite, engine.Engine.save_checkpoint, app.main = check_finite, save_checkpoint, main
import runpy
sys.argv = ["mirrorbert", *sys.argv[1:]]
runpy.run_module("mirrorbert", run_name="__main__", alter_sys=True)
"""


def test_repeated_sigterms_still_end_the_run_with_130_after_its_checkpoint(tmp_path, tiny_bert, strings_file):
    out = tmp_path / "model"
    result = subprocess.run([sys.executable, "-c", REPEATED, "train", "--model", str(tiny_bert), "--data",
                             str(strings_file), "--output", str(out), "--steps", "50", "--batch-size", "4",
                             "--no-progress"], env=command_env(), capture_output=True, timeout=600)
    err = text(result.stderr)
    assert result.returncode == 130 and TRACEBACK not in err, (result.returncode, err[-3000:])
    assert "preempted at step 2" in err and "before the first training step" not in err, err[-2000:]
    assert (tmp_path / "model.checkpoints" / "step-2").is_dir() and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- nohup
NOHUP = """
import os, signal, sys
import mirrorbert.encoder.model as model

real = model.Encoder.encode

def encode(self, *args, **kwargs):  # the terminal closes mid-run
    os.kill(os.getpid(), signal.SIGHUP)
    return real(self, *args, **kwargs)

model.Encoder.encode = encode
import runpy
sys.argv = ["mirrorbert", *sys.argv[1:]]
runpy.run_module("mirrorbert", run_name="__main__", alter_sys=True)
"""


def test_under_nohup_a_closed_terminal_changes_nothing(tmp_path, tiny_bert, strings_file):
    out = tmp_path / "v.npy"
    result = subprocess.run([sys.executable, "-c", NOHUP, "encode", "--model", str(tiny_bert), "--input",
                             str(strings_file), "--output", str(out), "--no-progress"], env=command_env(),
                            capture_output=True, timeout=600,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert result.returncode == 0, text(result.stderr)[-2000:]
    assert np.load(out).shape == (12, 32)


# --------------------------------------------------------------------------- the window of a new temporary
@pytest.mark.parametrize("signame", sorted(SIGNALS))
@pytest.mark.parametrize("folder", [False, True])
def test_a_signal_inside_the_call_that_makes_a_temporary_leaves_nothing(folder, signame, tmp_path, monkeypatch):
    """The instant between creating a temporary and registering its clean-up is closed: a signal sent from
    inside `mkstemp`/`mkdtemp` (the file exists, the caller has not seen its name yet) leaves nothing."""
    from mirrorbert.safeguards.writes import make_temporary

    sent = inject(monkeypatch, "first temporary", SIGNALS[signame], tmp_path / "x")
    handler = signal.getsignal(SIGNALS[signame])
    signal.signal(SIGNALS[signame], lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with pytest.raises(KeyboardInterrupt):
            make_temporary(tmp_path / "x", folder=folder)
            for _ in range(100):  # where no clean-up is registered, the signal still arrives: here
                pass
    finally:
        signal.signal(SIGNALS[signame], handler)
    assert sent and os.listdir(tmp_path) == []
