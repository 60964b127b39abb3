"""Several processes on CPU (gloo): gathered negatives, DDP, rank-0 output, resume across world sizes, encode.

The multi-process tests launch `torchrun --standalone --nproc_per_node 2` as users do, each bounded by
MIRRORBERT_DIST_TIMEOUT and PROCESS_TIMEOUT_S (the launcher, killed, forwards its SIGTERM to its workers).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mirrorbert.runtime.distributed import DistContext, combine_rows, encoding_rows, init_from_env
from mirrorbert.encoder.model import Encoder
from mirrorbert.training.checkpoints import verify_checkpoint

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
PROCESS_TIMEOUT_S = 300
TOLERANCE = 1e-5
STEP_LOSS = re.compile(r"step (\d+) loss ([0-9.]+)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MIRRORBERT_DIST_TIMEOUT="60", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS), env.get("PYTHONPATH", "")]))
    return env


def run_bounded(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a launcher with a hard wall-clock bound; on timeout stop it (it stops its workers) and fail."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {PROCESS_TIMEOUT_S} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(cwd: Path, *args: str, nproc: int = 2, log_dir: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    if log_dir is not None:  # one stdout/stderr file per rank
        cmd += ["--log-dir", str(log_dir), "--tee", "3"]
    return run_bounded(cmd + list(args), cwd)


def rank_log(log_dir: Path, rank: int, stream: str) -> str:
    (path,) = log_dir.glob(f"*/attempt_0/{rank}/{stream}.log")
    return path.read_text(encoding="utf-8")


def step_losses(text: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LOSS.finditer(text)}


def run_in_process(argv: list[str], cwd: Path) -> str:
    """`mirrorbert ARGV` in this process (one process needs no launcher); returns the library's log text."""
    from mirrorbert.cli.app import main

    lines: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: lines.append(record.getMessage())
    library = logging.getLogger("mirrorbert")
    previous = library.level
    library.addHandler(handler)
    library.setLevel(logging.DEBUG)
    here = Path.cwd()
    try:
        os.chdir(cwd)
        assert main([a for a in argv if a != "-v"]) == 0, "\n".join(lines[-20:])
    finally:
        os.chdir(here)
        library.removeHandler(handler)
        library.setLevel(previous)
    return "\n".join(lines)


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


# ------------------------------------------------------------------------------ one process, no group
def test_shards_are_contiguous_cover_the_batch_and_differ_by_at_most_one():
    batch = list(range(100, 111))
    for world in (1, 2, 3, 4):
        shards = [DistContext(rank=r, world_size=world).shard(batch) for r in range(world)]
        assert sum(shards, []) == batch  # global order kept, nothing lost or repeated
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    # more processes than strings: the empty shards hold a stand-in (dropped again by gather_views)
    assert [DistContext(rank=r, world_size=4).shard([7, 8]) for r in range(4)] == [[7], [8], [7], [7]]
    assert DistContext(rank=3, world_size=4).shard_sizes(2) == [1, 1, 0, 0]


def test_single_process_helpers_are_no_ops(tiny_bert, corpus):
    ctx = init_from_env("cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.enabled) == (0, 1, True, False)
    rows = torch.randn(6, 4)
    assert ctx.gather_views(rows, 3) is rows
    assert ctx.agree(2) == 2 and ctx.agree(0) == 0
    assert ctx.on_main(lambda: "written", "other") == "written"
    assert encoding_rows(5) == [0, 1, 2, 3, 4] and combine_rows(rows, 6) is rows
    encoder = Encoder.load(tiny_bert, pooling="cls")
    ctx.wrap(encoder)  # no DDP for one process
    assert not isinstance(encoder.model, torch.nn.parallel.DistributedDataParallel)


def test_python_dash_m_mirrorbert_is_the_cli(tmp_path):
    result = run_bounded([sys.executable, "-m", "mirrorbert", "--version"], tmp_path)
    assert result.returncode == 0 and "mirrorbert" in result.stdout


# ------------------------------------------------------------------------------ two processes (torchrun)
@pytest.fixture(scope="module")
def worker_run(tiny_bert, tmp_path_factory):
    """One torchrun launch of tests/dist_worker.py: gradients, sharded encoding, then a crashed rank."""
    outdir = tmp_path_factory.mktemp("dist-worker")
    result = torchrun(outdir, str(TESTS / "dist_worker.py"), str(tiny_bert), str(outdir))
    return outdir, result


@pytest.mark.slow  # reason: starts torchrun with 2 Python processes (~20 s on 2 shared cores)
def test_gathered_gradients_equal_one_process_holding_the_global_batch(worker_run):
    _, result = worker_run
    lines = [line for line in result.stdout.splitlines() if "RESULT " in line]
    assert len(lines) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    for passes, diffs in json.loads(lines[0].split("RESULT ", 1)[1]).items():
        assert diffs["loss_diff"] < TOLERANCE, passes
        # the factor matters: a missing W (or an extra one) would be off by half the gradient scale
        assert diffs["grad_diff"] < TOLERANCE * max(1.0, diffs["grad_scale"]), (passes, diffs)
    assert "PACKABLE null" in result.stdout, [line for line in result.stdout.splitlines() if "PACKABLE" in line]


@pytest.mark.slow  # reason: shares the launch above
def test_sharded_encoding_returns_the_rows_of_one_process_in_input_order(worker_run, tiny_bert):
    from dist_worker import ENCODE_TEXTS

    outdir, result = worker_run
    assert (outdir / "vectors.npy").exists(), result.stderr[-3000:]
    expected = Encoder.load(tiny_bert, pooling="mean", device="cpu").encode(ENCODE_TEXTS, batch_size=3)
    got = np.load(outdir / "vectors.npy")
    assert got.shape == expected.shape == (14, 32)
    assert np.abs(got - expected).max() < TOLERANCE


@pytest.mark.slow  # reason: starts torchrun with 2 Python processes
def test_torchrun_encode_writes_every_process_rows_into_one_file(tiny_bert, tmp_path, corpus):
    """No gather: each process encodes its contiguous rows into its slice of the output (encoder/sharded.py)."""
    texts = [f"{text} {i}" for i, text in enumerate(corpus * 2)][:23]  # 23 rows: shards of 12 and 11
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    result = torchrun(tmp_path, "-m", "mirrorbert", "encode", "--model", str(tiny_bert), "--input", "in.txt",
                      "--output", "out.npy", "--pooling", "mean", "--batch-size", "3", "--device", "cpu",
                      "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == len(texts)
    expected = Encoder.load(tiny_bert, pooling="mean", device="cpu").encode(texts, batch_size=3)
    got = np.load(tmp_path / "out.npy")
    assert got.shape == expected.shape and np.abs(got - expected).max() < TOLERANCE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npy"]  # no temporary left behind


@pytest.mark.slow  # reason: shares the launch above
def test_a_crashed_rank_ends_the_job_naming_the_checkpoint(worker_run):
    _, result = worker_run  # run_bounded already failed the test if the job had hung
    assert result.returncode != 0
    assert "last good checkpoint: ckpt/step-2" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def train_runs(tiny_bert, tmp_path_factory, corpus):
    """1 process, 2 processes (checkpoint every 2 steps), then 1 process resuming the 2-process step-2."""
    root = tmp_path_factory.mktemp("dist-train")
    (root / "strings.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    # 12 strings, batch 5: batches of 5, 5 and 2 per epoch, so 4 steps cross an epoch boundary; 5 strings
    # on 2 processes are uneven shards (3 + 2), 2 strings are shards of 1 + 1.
    common = ["-v", "train", "--model", str(tiny_bert), "--data", "strings.txt", "--batch-size", "5",
              "--steps", "4", "--dropout", "0", "--mask-span", "1", "--seed", "7", "--lr", "1e-3",
              "--pooling", "mean", "--max-length", "16", "--log-every", "1", "--no-progress",
              "--save-every", "2", "--device", "cpu", "--precision", "fp32"]
    one = run_in_process(common + ["--output", str(root / "one")], root)
    (root / "two").mkdir()
    logs = root / "logs"
    two = torchrun(root / "two", "-m", "mirrorbert", *[a.replace("strings.txt", "../strings.txt") for a in common],
                   "--output", "out", log_dir=logs)
    assert two.returncode == 0, two.stderr[-3000:]
    resumed = run_in_process(common + ["--output", str(root / "resumed"),
                                       "--resume", str(root / "two" / "out.checkpoints" / "step-2")], root)
    return {"root": root, "one": one, "two": two, "resumed": resumed, "logs": logs}


@pytest.mark.slow  # reason: three training launches, one of them torchrun with 2 processes
def test_two_processes_give_the_losses_and_weights_of_one(train_runs):
    root = train_runs["root"]
    one_losses = step_losses(train_runs["one"])
    two_losses = step_losses(rank_log(train_runs["logs"], 0, "stderr"))
    assert sorted(one_losses) == sorted(two_losses) == [1, 2, 3, 4]
    for step in one_losses:  # the reported loss is the global batch's, as one process reports it
        assert abs(one_losses[step] - two_losses[step]) < TOLERANCE, step
    assert max_weight_diff(root / "one", root / "two" / "out") < TOLERANCE
    info_one = json.loads((root / "one" / "mirrorbert.json").read_text())["training"]
    info_two = json.loads((root / "two" / "out" / "mirrorbert.json").read_text())["training"]
    assert info_two["world_size"] == 2 and info_one["world_size"] == 1
    assert abs(info_one["final_loss"] - info_two["final_loss"]) < TOLERANCE
    for rank in (0, 1):  # under DDP the steps still run packed where the model supports it
        assert "packing off" not in rank_log(train_runs["logs"], rank, "stderr")


@pytest.mark.slow  # reason: shares the launches of the test above
def test_only_rank_zero_writes_and_speaks(train_runs):
    folder = train_runs["root"] / "two"
    # one output folder and one checkpoint root, no temporary leftovers from a second writer
    assert sorted(p.name for p in folder.iterdir()) == ["out", "out.checkpoints"]
    assert sorted(p.name for p in (folder / "out.checkpoints").iterdir()) == [".mirrorbert-output", "step-2",
                                                                             "step-4"]  # marker: ours
    rank0_err, rank1_err = (rank_log(train_runs["logs"], r, "stderr") for r in (0, 1))
    assert "model written to" in rank0_err and "checkpoint written" in rank0_err
    assert "written" not in rank1_err and not STEP_LOSS.search(rank1_err)
    assert rank_log(train_runs["logs"], 1, "stdout").strip() == ""
    assert json.loads(rank_log(train_runs["logs"], 0, "stdout"))["steps"] == 4


@pytest.mark.slow  # reason: shares the launches of the tests above
def test_two_process_checkpoint_resumes_in_one_process(train_runs):
    root = train_runs["root"]
    assert sorted(step_losses(train_runs["resumed"])) == [3, 4]
    assert max_weight_diff(root / "resumed", root / "two" / "out") < TOLERANCE
    meta = json.loads((root / "two" / "out.checkpoints" / "step-2" / "checkpoint.json").read_text())
    assert meta["world_size"] == 2


def _children(pid: int) -> list[int]:
    import psutil

    return [child.pid for child in psutil.Process(pid).children(recursive=True)
            if "torch.distributed.run" not in " ".join(child.cmdline())]


def _preempted_then_resumed(tiny_bert, tmp_path: Path, corpus: list[str], target: str) -> dict:
    """A 2-process run stopped by SIGTERM once step 2 is logged, then resumed and run whole for comparison.

    target "rank1": SIGTERM to rank 1's worker only; "launcher": SIGTERM to the torchrun process itself
    (what Kubernetes sends to PID 1 and `kill` of the job does), which forwards it to every worker and
    sends SIGKILL after its shutdown timeout. No --save-every: any checkpoint is the preemption's.
    Returns the checkpoint, its step, the launcher's status, the per-rank logs and both final models.
    """
    import time

    (tmp_path / "strings.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    common = ["train", "--model", str(tiny_bert), "--batch-size", "5", "--dropout", "0", "--mask-span", "1",
              "--seed", "3", "--lr", "1e-3", "--pooling", "mean", "--max-length", "16", "--log-every", "1",
              "--no-progress", "--device", "cpu", "--precision", "fp32"]
    (tmp_path / "two").mkdir()
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--log-dir", str(logs),
           "--tee", "3", "-m", "mirrorbert", "-v", *common, "--data", "../strings.txt", "--steps", "100000",
           "--output", "out"]
    launcher = subprocess.Popen(cmd, cwd=tmp_path / "two", env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + PROCESS_TIMEOUT_S
        while time.time() < deadline:  # wait until training runs (step 2 logged), then preempt
            logged = list(logs.glob("*/attempt_0/0/stderr.log"))
            if logged and 2 in step_losses(logged[0].read_text(encoding="utf-8")):
                break
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            time.sleep(0.2)
        workers = _children(launcher.pid)
        assert len(workers) == 2
        if target == "launcher":
            os.kill(launcher.pid, signal.SIGTERM)
        else:
            rank1 = next(pid for pid in workers if "LOCAL_RANK=1" in open(
                f"/proc/{pid}/environ", encoding="utf-8", errors="replace").read().replace("\0", " ") + " ")
            os.kill(rank1, signal.SIGTERM)
        _, launcher_err = launcher.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    root = tmp_path / "two" / "out.checkpoints"
    checkpoints = sorted(root.glob("step-*"))
    assert len(checkpoints) == 1, (checkpoints, launcher_err[-3000:])
    checkpoint = checkpoints[0]
    steps = int(checkpoint.name.split("-")[1])
    run_logs = {}
    for name, extra in (("resumed", ["--resume", str(checkpoint)]), ("whole", [])):  # both on 2 processes again
        run_logs[name] = tmp_path / f"logs-{name}"
        run = torchrun(tmp_path / "two", "-m", "mirrorbert", "-v", *common, "--data", "../strings.txt",
                       "--steps", str(steps + 2), "--output", name, *extra, log_dir=run_logs[name])
        assert run.returncode == 0, run.stderr[-3000:]
    return {"checkpoint": checkpoint, "steps": steps, "returncode": launcher.returncode, "logs": logs,
            "launcher_err": launcher_err, "folder": tmp_path / "two", "root": root, "run_logs": run_logs}


def _assert_preempted_and_resumed_exactly(run: dict) -> None:
    checkpoint, steps, logs = run["checkpoint"], run["steps"], run["logs"]
    assert run["returncode"] != 0  # the job stopped before its budget (torchrun reports 1)
    assert steps >= 2
    assert not (run["folder"] / "out").exists()
    # one checkpoint, the preemption's (no --save-every), and no temporary left by an aborted write
    assert sorted(p.name for p in run["root"].iterdir()) == [".mirrorbert-output", checkpoint.name]
    expected = str(Path("out.checkpoints") / checkpoint.name)
    said = {0: f"preempted at step {steps} (SIGTERM); checkpoint written to {expected}; resume with the same "
               f"command plus --resume {expected}",
            1: f"rank 1: preempted at step {steps}; checkpoint (written by rank 0): {expected}"}
    for rank in (0, 1):
        text = rank_log(logs, rank, "stderr")
        assert [line for line in text.splitlines() if line == said[rank]] == [said[rank]], text[-2000:]
        assert "Traceback" not in text and "mirrorbert: error" not in text, text[-2000:]
    assert verify_checkpoint(checkpoint)["step"] == steps
    # the resumed run equals the run that was never stopped: same losses after the checkpoint, same weights
    resumed = step_losses(rank_log(run["run_logs"]["resumed"], 0, "stderr"))
    whole = step_losses(rank_log(run["run_logs"]["whole"], 0, "stderr"))
    assert sorted(resumed) == [steps + 1, steps + 2] and sorted(whole) == list(range(1, steps + 3))
    assert all(resumed[s] == whole[s] for s in resumed), (resumed, whole)
    diff = max_weight_diff(run["folder"] / "resumed", run["folder"] / "whole")
    print(f"preempted at step {steps}; resumed vs uninterrupted: max abs weight difference {diff}")
    assert diff < 1e-6


@pytest.mark.slow  # reason: three torchrun launches with 2 processes (~80 s on 2 shared cores)
def test_sigterm_to_one_process_of_a_two_process_job_checkpoints_and_resume_equals_uninterrupted(
        tiny_bert, tmp_path, corpus):
    """Preemption: SIGTERM reaches rank 1 only; both ranks agree at the next step, rank 0 writes step-N,
    each process prints one line naming it, and resuming gives the weights of a run that was never stopped."""
    _assert_preempted_and_resumed_exactly(_preempted_then_resumed(tiny_bert, tmp_path, corpus, "rank1"))


@pytest.mark.slow  # reason: three torchrun launches with 2 processes (~80 s on 2 shared cores)
def test_sigterm_to_the_launcher_checkpoints_and_resume_equals_uninterrupted(tiny_bert, tmp_path, corpus):
    """Preemption through the launcher: SIGTERM to torchrun itself reaches every worker at once;
    they agree at the next step boundary, rank 0 writes one checkpoint within torchrun's grace period,
    each names it, and the resumed run equals an uninterrupted one."""
    run = _preempted_then_resumed(tiny_bert, tmp_path, corpus, "launcher")
    _assert_preempted_and_resumed_exactly(run)
    assert "Received 15 death signal, shutting down workers" in run["launcher_err"]  # torchrun forwarded it
    assert "forcefully exiting via" not in run["launcher_err"]  # no worker needed torchrun's SIGKILL


@pytest.mark.slow  # reason: one torchrun launch with 2 processes (~25 s on 2 shared cores)
def test_a_rank_crashing_mid_training_is_a_failure_not_a_preemption(tiny_bert, tmp_path, corpus):
    """Rank 1 dies after step 3; torchrun SIGTERMs rank 0, which cannot agree with a dead peer: it ends
    with one error line naming the last good checkpoint (step-2), and writes no preemption checkpoint."""
    (tmp_path / "strings.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    logs = tmp_path / "logs"
    result = torchrun(tmp_path, str(TESTS / "dist_crash_train.py"), "train", "--model", str(tiny_bert),
                      "--data", "strings.txt", "--batch-size", "5", "--steps", "50", "--save-every", "2",
                      "--max-length", "16", "--no-progress", "--device", "cpu", "--precision", "fp32",
                      "--output", "out", log_dir=logs)
    assert result.returncode != 0
    text = rank_log(logs, 0, "stderr")
    errors = [line for line in text.splitlines() if line.startswith("mirrorbert: error: rank 0: ")]
    assert len(errors) == 1, text[-3000:]
    assert "another process of the job failed or timed out" in errors[0]
    assert errors[0].endswith("last good checkpoint: " + str(Path("out.checkpoints") / "step-2")), errors[0]
    assert "preempted" not in text
    assert sorted(p.name for p in (tmp_path / "out.checkpoints").glob("step-*")) == ["step-2"]
