"""Limits of the process and of the system, named as what they are, in one line (class 2 of the fault suite): the
file-size limit at every file a command writes, a full disk, too few open files, too little memory, a working
folder deleted or deeper than PATH_MAX, a closed pipe, an output that cannot show a character, half-set torchrun
variables, permission denied, and a text holding a lone surrogate.

Commands run in a subprocess where a limit would reach the test process itself (`fault_tools.run_mirrorbert`).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fault_tools import TRACEBACK, assert_one_line, command_env, leftovers, run_mirrorbert, text

from mirrorbert.cli.app import main

MB = 1 << 20


def _sizes(*folders: Path) -> list[int]:
    """The distinct sizes of every file below `folders`."""
    return sorted({f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file()})


COMMANDS = {
    "train": lambda m, data, out: ["train", "--model", m, "--data", data, "--output", out, "--steps", "2",
                                   "--batch-size", "4", "--max-length", "16", "--no-progress", "--save-every", "1"],
    "encode": lambda m, data, out: ["encode", "--model", m, "--input", data, "--output", f"{out}.npy", "--no-progress"],
    "index": lambda m, data, out: ["index", "--model", m, "--corpus", data, "--output", out, "--no-progress"],
    "export": lambda m, data, out: ["export", "--model", m, "--output", out],
    "pretrain-mlm": lambda m, data, out: ["pretrain-mlm", "--model", m, "--corpus", data, "--output", out,
                                          "--seq-length", "16", "--batch-size", "4", "--max-tokens", "128",
                                          "--eval-fraction", "0.1", "--no-progress"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_file_size_limit_at_every_file_a_command_writes(command, tmp_path, tiny_bert, strings_file):
    """For each size of file the command writes (output, checkpoints, cache), a run whose RLIMIT_FSIZE stops
    just below it: one line naming the limit (before any work where it can be seen then), nothing left behind,
    and where the line says a model is kept, it is there."""
    if command == "export":
        pytest.importorskip("onnxruntime")
    cache = tmp_path / "cache"
    env = command_env(MIRRORBERT_CACHE=str(cache))
    free = run_mirrorbert(COMMANDS[command](tiny_bert, strings_file, tmp_path / "free" / "out"), env=env)
    assert free.returncode == 0, text(free.stderr)[-2000:]
    sizes = [s for s in _sizes(tmp_path / "free", cache) if s > 1]
    refused = 0
    for size in sizes:
        shutil.rmtree(cache, ignore_errors=True)
        where = tmp_path / f"limit-{size}"
        where.mkdir()
        result = run_mirrorbert(COMMANDS[command](tiny_bert, strings_file, where / "out"), env=env,
                                limits={resource.RLIMIT_FSIZE: size - 1})
        err = text(result.stderr)
        assert TRACEBACK not in err, (size, err[-3000:])
        if result.returncode != 0:
            refused += 1
            line = assert_one_line(result)
            assert "ulimit -f" in line or "file too large" in line, (size, line)
            if "kept in" in line:
                kept = Path(line.split("kept in ", 1)[1].split(";")[0])
                assert kept.exists(), line
                shutil.rmtree(kept, ignore_errors=True)
        assert leftovers(where, cache) == [], size
    assert refused, sizes  # the limit did stop a write


@pytest.mark.slow
def test_a_full_tmpfs_during_the_final_save_keeps_the_model(tmp_path, tiny_bert, strings_file):
    """A real full disk (a 400 KB tmpfs that another writer fills once training is done): tokenizers or
    safetensors raise their own errors; the model is kept elsewhere and the line says how to finish the save."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and permission to mount a tmpfs")
    try:
        script = tmp_path / "fill.py"
        script.write_text(FILL_THEN_TRAIN, encoding="utf-8")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        result = subprocess.run([sys.executable, str(script), str(disk / "filler"), "train", "--model",
                                 str(tiny_bert), "--data", str(strings_file), "--output", str(disk / "out"),
                                 "--steps", "2", "--batch-size", "4", "--no-progress"],
                                env=command_env(TMPDIR=str(elsewhere)), capture_output=True, timeout=600)
        line = assert_one_line(result, "no space left", "finish the save")
        kept = Path(line.split("kept in ", 1)[1].split(";")[0])
        assert (kept / "model.safetensors").is_file() and kept.is_relative_to(elsewhere)
        assert sorted(os.listdir(disk)) == ["filler"] and leftovers(elsewhere) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


FILL_THEN_TRAIN = """
import os, sys
import mirrorbert.training.engine as engine
from mirrorbert.cli.app import main

real = engine.Engine.save_final

def save_final(self, *args, **kwargs):  # another writer fills the disk once the steps are done
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    os.close(fd)
    return real(self, *args, **kwargs)

engine.Engine.save_final = save_final
sys.exit(main(sys.argv[2:]))
"""


# --------------------------------------------------------------------------- open files and memory
def test_too_few_open_files_is_one_line_before_any_work(tmp_path, tiny_bert, strings_file):
    out = tmp_path / "out"
    result = run_mirrorbert(["encode", "--model", tiny_bert, "--input", strings_file, "--output", out / "v.npy"],
                            limits={resource.RLIMIT_NOFILE: 16})
    assert_one_line(result, "open-files limit (ulimit -n) is 16", "raise it")
    assert not out.exists()


def test_a_low_soft_open_files_limit_is_raised_to_what_the_hard_one_allows(tmp_path, tiny_bert, strings_file):
    def low_soft():
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    result = run_mirrorbert(["encode", "--model", tiny_bert, "--input", strings_file, "--output", tmp_path / "v.npy"],
                            before=low_soft)
    assert result.returncode == 0, text(result.stderr)[-2000:]
    assert np.load(tmp_path / "v.npy").shape == (12, 32)


def test_too_many_open_files_mid_run_is_named_and_nothing_is_called_damaged(tmp_path, tiny_bert, strings_file,
                                                                            monkeypatch, capsys):
    """EMFILE while the model's files are read: one line naming the limit, never "damaged"."""
    real = os.open

    def no_descriptors(path, flags, *args, **kwargs):
        if str(os.fsdecode(path)).endswith((".safetensors", "config.json", "tokenizer.json")):
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_descriptors)
    status = main(["encode", "--model", str(tiny_bert), "--input", str(strings_file), "--output",
                   str(tmp_path / "v.npy"), "--no-progress"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert status == 2 and len(lines) == 1 and TRACEBACK not in err, err[-2000:]
    assert "too many open files" in lines[0].lower() and "damaged" not in lines[0], lines[0]
    assert not (tmp_path / "v.npy").exists() and leftovers(tmp_path) == []


def test_an_address_space_too_small_for_torch_is_one_line_before_any_work(tmp_path, tiny_bert, strings_file):
    result = run_mirrorbert(["encode", "--model", tiny_bert, "--input", strings_file, "--output", tmp_path / "v.npy"],
                            limits={resource.RLIMIT_AS: 600 * MB})
    assert_one_line(result, "address-space limit (ulimit -v) is 600 MB", "raise it")


@pytest.mark.parametrize("failure", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:117] . "
                                                                  "DefaultCPUAllocator: can't allocate memory: you "
                                                                  "tried to allocate 123 bytes."),
                                     RuntimeError("std::bad_alloc")])
def test_memory_that_runs_out_mid_run_is_one_line(failure, tmp_path, tiny_bert, strings_file, monkeypatch, capsys):
    from mirrorbert.encoder.model import Encoder

    def out_of_memory(self, *args, **kwargs):
        raise failure

    monkeypatch.setattr(Encoder, "encode", out_of_memory)
    status = main(["encode", "--model", str(tiny_bert), "--input", str(strings_file), "--output",
                   str(tmp_path / "v.npy"), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and TRACEBACK not in err and "mirrorbert: error: out of memory" in err, err[-2000:]
    assert leftovers(tmp_path) == [] and not (tmp_path / "v.npy").exists()


def test_permission_denied_mid_run_is_one_line(tmp_path, tiny_bert, strings_file, monkeypatch, capsys):
    """We run as root (chmod stops nothing): an EACCES from a library is made by construction."""
    from mirrorbert.encoder.model import Encoder

    def denied(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", "/some/where/cache.bin")

    monkeypatch.setattr(Encoder, "encode", denied)
    assert main(["encode", "--model", str(tiny_bert), "--input", str(strings_file), "--output",
                 str(tmp_path / "v.npy"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert TRACEBACK not in err and "mirrorbert: error: /some/where/cache.bin: permission denied" in err


# --------------------------------------------------------------------------- the working folder
@pytest.mark.parametrize("paths", ["absolute", "relative"])
def test_a_deleted_working_folder_is_one_line(paths, tmp_path, tiny_bert, strings_file):
    gone = tmp_path / "gone"
    gone.mkdir()
    shutil.copy(strings_file, gone / "s.txt")
    data = str(gone / "s.txt") if paths == "absolute" else "s.txt"
    result = run_mirrorbert(["encode", "--model", tiny_bert, "--input", data, "--output", tmp_path / "v.npy"],
                            cwd=gone, before=lambda: shutil.rmtree(gone))
    assert_one_line(result, "the working folder no longer exists")
    assert "FATAL" not in text(result.stderr) and not (tmp_path / "v.npy").exists()


def test_a_working_folder_deeper_than_path_max_is_one_line(tmp_path, tiny_bert, strings_file):
    name = "d" * 200
    depth = int(os.pathconf("/", "PC_PATH_MAX")) // (len(name) + 1) + 2
    fd = os.open(tmp_path, os.O_RDONLY)
    for _ in range(depth):  # made through descriptors: no path of that length is ever passed
        os.mkdir(name, dir_fd=fd)
        fd_next = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = fd_next

    def go_deep():
        os.chdir(tmp_path)
        for _ in range(depth):
            os.chdir(name)

    try:
        result = run_mirrorbert(["encode", "--model", tiny_bert, "--input", strings_file, "--output", "v.npy"],
                                before=go_deep)
        assert_one_line(result, "longer than the system's limit for a path (PATH_MAX")
        assert "FATAL" not in text(result.stderr)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the streams
def test_a_closed_pipe_ends_search_quietly(tmp_path, tiny_bert, strings_file):
    queries = tmp_path / "q.txt"
    queries.write_text("".join(f"query number {i} about a bank\n" for i in range(3000)), encoding="utf-8")
    args = [sys.executable, "-m", "mirrorbert", "search", "--model", str(tiny_bert), "--corpus", str(strings_file),
            "--queries", str(queries), "--no-progress"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=command_env())
    first = process.stdout.readline()  # `| head -1`
    process.stdout.close()
    err = process.stderr.read().decode("utf-8", "replace")
    process.wait(timeout=600)
    assert json.loads(first)["hits"]
    assert process.returncode == 141 and TRACEBACK not in err and "BrokenPipe" not in err, err[-2000:]


def test_an_output_encoding_without_the_characters_writes_json_escapes(tmp_path, tiny_bert):
    corpus = tmp_path / "c.txt"
    corpus.write_text("café au lait\nnaïve\n東京\nbank\n", encoding="utf-8")
    result = run_mirrorbert(["search", "--model", tiny_bert, "--corpus", corpus, "--query", "café", "--top-k", "4",
                             "--no-progress"], env=command_env(PYTHONIOENCODING="ascii"))
    assert result.returncode == 0 and TRACEBACK not in text(result.stderr), text(result.stderr)[-2000:]
    result.stdout.decode("ascii")  # nothing but ASCII reached the stream
    found = json.loads(result.stdout)
    assert found["query"] == "café" and {h["text"] for h in found["hits"]} == {"café au lait", "naïve", "東京", "bank"}


# --------------------------------------------------------------------------- torchrun variables
@pytest.mark.parametrize("variables, words", [
    ({"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR and MASTER_PORT are not set"),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not set"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "RANK must be below"),
])
def test_half_set_torchrun_variables_are_one_line_before_any_work(variables, words, tmp_path, tiny_bert,
                                                                   strings_file):
    env = {k: v for k, v in command_env().items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                "MASTER_PORT")}
    result = run_mirrorbert(["train", "--model", tiny_bert, "--data", strings_file, "--output", tmp_path / "out",
                             "--steps", "1", "--no-progress"], env={**env, **variables})
    assert_one_line(result, words)
    assert sorted(os.listdir(tmp_path)) == [strings_file.name]


# --------------------------------------------------------------------------- text that is not text
def test_a_lone_surrogate_is_refused_in_one_line(tiny_bert):
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.errors import UserError

    encoder = Encoder.load(str(tiny_bert), device="cpu")
    with pytest.raises(UserError, match=r"^texts\[1\] holds a lone surrogate \(U\+D800 at character 2\)"):
        encoder.encode(["fine", "a \ud800 b"])
    assert encoder.encode(["a \ufffd b"]).shape == (1, 32)  # what errors='replace' gives is text
