"""A finished run is never lost: whatever its final save raises, the trained state is kept where it can be written and
one line says where and how to finish the save (class 1 of the fault suite).

The faults are raised from inside the library call that writes the weights (`PreTrainedModel.save_pretrained`),
as the libraries raise them: OSError with ENOSPC, EIO or EFBIG, numpy's short write (an OSError without errno),
tokenizers' bare `Exception("... (os error 28)")`, safetensors' `SafetensorError`, a `UnicodeEncodeError` or
faiss' `TypeError` for a path, and a type no one has heard of. The "disk" that fails is one folder: the output,
its checkpoint folder and a folder beside it are on it, the system's temporary folder is not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fault_tools import leftovers

from mirrorbert.cli.app import main


class LibraryFailure(Exception):
    """An exception type of some library: no errno, no `Error` in its name."""


def _safetensor_error(message: str) -> Exception:
    from safetensors import SafetensorError

    return SafetensorError(message)


# kind -> (what the library raises, words the one line carries)
KINDS = {
    "ENOSPC": (lambda: OSError(errno.ENOSPC, "No space left on device"), "no space left"),
    "EIO": (lambda: OSError(errno.EIO, "Input/output error"), "input/output error"),
    "EFBIG": (lambda: OSError(errno.EFBIG, "File too large"), "file too large"),
    "short write": (lambda: OSError("98852 requested and 51200 written"), "98852 requested and 51200 written"),
    "bare Exception": (lambda: Exception("No space left on device (os error 28)"), "no space left"),
    "SafetensorError": (lambda: _safetensor_error("Error while serializing: I/O error: File too large (os error 27)"),
                        "file too large"),
    "UnicodeEncodeError": (lambda: UnicodeEncodeError("utf-8", "x\udcff", 1, 2, "surrogates not allowed"),
                           "UnicodeEncodeError"),
    "TypeError": (lambda: TypeError("Wrong number or type of arguments for overloaded function 'write_index'."),
                  "TypeError"),
    "another type": (lambda: LibraryFailure("the disk went away"), "LibraryFailure: the disk went away"),
}


@pytest.fixture
def elsewhere(monkeypatch):
    """The system's temporary folder for this test (a fresh one, outside the test's own folders)."""
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="mirrorbert-faults-"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def disk(tmp_path, elsewhere) -> Path:
    """A folder on which every weights save fails (the kind is set by `fail_with`); saves work `elsewhere`."""
    folder = tmp_path / "disk"
    folder.mkdir()
    return folder


def fail_with(monkeypatch, disk: Path, kind: str) -> list[str]:
    """Make every `save_pretrained` into a folder on `disk` raise `kind`; returns where it failed."""
    import transformers

    real = transformers.PreTrainedModel.save_pretrained
    failed = []

    def save_pretrained(self, folder, *args, **kwargs):
        if Path(os.path.realpath(folder)).is_relative_to(os.path.realpath(disk)):
            failed.append(str(folder))
            raise KINDS[kind][0]()
        return real(self, folder, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", save_pretrained)
    return failed


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def _kept(line: str) -> Path:
    found = re.search(r"kept in (\S+);", line)
    assert found, line
    return Path(found.group(1))


def train_argv(model, data, output, *extra) -> list[str]:
    return ["train", "--model", str(model), "--data", str(data), "--output", str(output), "--steps", "2",
            "--batch-size", "4", "--max-length", "16", "--no-progress", "--device", "cpu", *extra]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_train_keeps_the_model_whatever_the_save_raises(kind, disk, elsewhere, tmp_path, tiny_bert, strings_file,
                                                        monkeypatch, capsys):
    from mirrorbert.encoder.model import Encoder

    failed = fail_with(monkeypatch, disk, kind)
    out = disk / "out"
    assert main(train_argv(tiny_bert, strings_file, out)) == 2
    line = _error_line(capsys)
    assert failed and f"--output {out}: the trained model cannot be written there" in line
    assert KINDS[kind][1] in line and "finish the save" in line, line
    kept = _kept(line)
    assert kept.is_relative_to(elsewhere) and f"mv {kept} {out}" in line
    monkeypatch.undo()
    vectors = Encoder.load(str(kept), device="cpu").encode(["a cat sat on the mat"])
    assert vectors.shape == (1, 32) and np.isfinite(vectors).all()
    assert not out.exists() and leftovers(tmp_path, elsewhere) == [] and os.listdir(disk) == []


def test_the_checkpoint_of_the_last_step_is_named_and_resuming_from_it_finishes_the_save(disk, tmp_path, tiny_bert,
                                                                                       strings_file, monkeypatch,
                                                                                       capsys):
    fail_with(monkeypatch, disk, "bare Exception")
    out, checkpoints = disk / "out", tmp_path / "ck"
    argv = train_argv(tiny_bert, strings_file, out, "--save-every", "1", "--checkpoint-dir", str(checkpoints))
    assert main(argv) == 2
    line = _error_line(capsys)
    step = checkpoints / "step-2"
    assert f"the trained state is kept in {step}; finish the save with the same command plus --resume {step}" in line
    monkeypatch.undo()  # room on the disk again: the line's advice finishes the save
    assert main(argv + ["--resume", str(step)]) == 0
    assert (out / "model.safetensors").is_file() and leftovers(tmp_path) == []


def test_a_failure_after_the_last_step_but_before_the_save_keeps_the_state(tmp_path, tiny_bert, strings_file,
                                                                           monkeypatch, capsys):
    """The record of the run (here the collapse check; `--eval-after` alike) fails before the output is written:
    the steps are kept in a checkpoint, and resuming from it writes the model."""
    import mirrorbert.mirror.train as trainer

    def broken(*args, **kwargs):
        raise RuntimeError("a library failed after training")

    monkeypatch.setattr(trainer, "check_collapse", broken)
    out = tmp_path / "out"
    argv = train_argv(tiny_bert, strings_file, out)
    assert main(argv) == 2
    line = _error_line(capsys)
    step = tmp_path / "out.checkpoints" / "step-2"
    assert "finished its 2 steps but failed before writing its output (RuntimeError: a library failed" in line
    assert f"kept in {step}; finish the save with the same command plus --resume {step}" in line
    monkeypatch.undo()
    assert main(argv + ["--resume", str(step)]) == 0
    assert (out / "model.safetensors").is_file() and leftovers(tmp_path) == []


def test_when_nothing_takes_the_model_the_line_says_so(disk, elsewhere, tmp_path, tiny_bert, strings_file,
                                                       monkeypatch, capsys):
    """The one case a run is lost: no place at all can be written. It is said, never hidden in a traceback."""
    failed = fail_with(monkeypatch, disk, "ENOSPC")
    fail_with(monkeypatch, elsewhere, "ENOSPC")  # the temporary folder too
    assert main(train_argv(tiny_bert, strings_file, disk / "out")) == 2
    line = _error_line(capsys)
    assert "could not be kept anywhere" in line and "the trained state is lost" in line and len(failed) >= 3
    assert leftovers(tmp_path, elsewhere) == [] and os.listdir(disk) == []
    assert not [name for name in os.listdir(elsewhere) if "kept" in name]


def _mlm_argv(model, corpus, output) -> list[str]:
    return ["pretrain-mlm", "--model", str(model), "--corpus", str(corpus), "--output", str(output), "--seq-length",
            "16", "--batch-size", "4", "--max-tokens", "128", "--eval-fraction", "0.1", "--no-progress", "--device",
            "cpu"]


def _gloss_argv(model, triplets, output) -> list[str]:
    return ["gloss-pretrain", "--model", str(model), "--triplets", str(triplets), "--output", str(output), "--steps",
            "1", "--batch-size", "2", "--no-progress", "--device", "cpu"]


TRIPLETS = ("bank\tthe bank raised interest rates again\ta financial institution that accepts deposits\n"
            "cat\tthe cat sat on the mat\ta small domesticated feline animal\n"
            "dog\ta dog ran in the park\ta domesticated carnivorous mammal kept as a pet\n"
            "fox\tthe quick brown fox jumps over the lazy dog\ta wild animal of the dog family\n")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["pretrain-mlm", "gloss-pretrain"])
@pytest.mark.parametrize("kind", ["bare Exception", "SafetensorError", "short write", "another type"])
def test_the_other_trainers_keep_their_model_too(command, kind, disk, elsewhere, tmp_path, tiny_bert, strings_file,
                                                 monkeypatch, capsys):
    fail_with(monkeypatch, disk, kind)
    out = disk / "out"
    if command == "pretrain-mlm":
        argv = _mlm_argv(tiny_bert, strings_file, out)
    else:
        triplets = tmp_path / "triplets.tsv"
        triplets.write_text(TRIPLETS, encoding="utf-8")
        argv = _gloss_argv(tiny_bert, triplets, out)
    assert main(argv) == 2
    line = _error_line(capsys)
    assert KINDS[kind][1] in line and "finish the save" in line, line
    kept = _kept(line)
    assert (kept / "config.json").is_file() and any(kept.glob("model*.safetensors")), sorted(os.listdir(kept))
    assert not out.exists() and leftovers(tmp_path, elsewhere) == []


def test_finetune_sts_prints_its_results_when_the_file_cannot_be_written(tmp_path, tiny_bert, monkeypatch, capsys):
    from support import write_stsb

    import mirrorbert.safeguards.writes.atomic as atomic

    data = write_stsb(tmp_path / "data")
    real = atomic.open_temporary

    def full(path, mode="wb"):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "open_temporary", full)
    out = tmp_path / "results.json"
    assert main(["finetune-sts", "--model", str(tiny_bert), "--data-dir", str(data), "--output", str(out),
                 "--epochs", "1", "--fractions", "1.0", "--seeds", "0", "--no-progress", "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and real is not None
    lines = [line for line in captured.err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(lines) == 1 and "no space left" in lines[0] and "printed above" in lines[0], lines
    record = json.loads(captured.out[captured.out.index("{"):])
    assert record["runs"] and "results" in record
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", ["bare Exception", "SafetensorError", "EIO"])
def test_export_that_cannot_write_is_one_line_and_leaves_nothing(kind, disk, elsewhere, tmp_path, tiny_bert,
                                                                 monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    fail_with(monkeypatch, disk, kind)
    out = disk / "served"
    assert main(["export", "--model", str(tiny_bert), "--output", str(out)]) == 2
    line = _error_line(capsys)
    assert f"--output {out}: cannot write it: {KINDS[kind][1]}" in line, line
    assert not out.exists() and leftovers(tmp_path) == [] and os.listdir(disk) == []


# --------------------------------------------------------------------------- decided by what happened
def test_a_short_write_at_the_file_size_limit_is_named_as_that(tmp_path):
    """numpy's short write carries no errno: the file stopped at the limit (RLIMIT_FSIZE) is what says EFBIG."""
    from mirrorbert.errors import UserError
    from mirrorbert.safeguards.writes import atomic_output_file

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50 << 10, hard))
    try:
        with pytest.raises(UserError) as caught:
            with atomic_output_file(tmp_path / "v.npy") as tmp:
                np.ones((400, 64), np.float32).tofile(str(tmp))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(caught.value)
    assert message.startswith(f"--output {tmp_path / 'v.npy'}: cannot write it: file too large: the file-size limit "
                              "(ulimit -f) is 50.0 KB") and "\n" not in message
    assert os.listdir(tmp_path) == []


def test_an_error_without_errno_is_a_full_disk_only_when_the_disk_is_full(tmp_path, monkeypatch):
    from mirrorbert.safeguards.writes.failures import write_failure

    short = OSError("98852 requested and 51200 written")
    assert write_failure(short, tmp_path / "x.npy") is None  # room enough: not a full disk, whatever it says
    assert write_failure(Exception("No space left on device"), tmp_path / "x") is None  # words alone decide nothing
    real = os.statvfs(tmp_path)
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((*real[:3], 0, 0, *real[5:])))
    assert write_failure(short, tmp_path / "x.npy") == errno.ENOSPC
    assert write_failure(LibraryFailure("?"), tmp_path / "x.npy") == errno.ENOSPC
