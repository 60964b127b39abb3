"""Preemption (issue 26): SIGTERM becomes a flag, the processes agree at a step boundary, one checkpoint.

Single-process tests of the pieces: the flag (repeated SIGTERMs, Ctrl-C twice), the agreement
(`DistContext.agree` over a mocked all-reduce), the engine under a fake two-process context (a SIGTERM
seen by the other rank only; a failed agreement is a failure naming the last good checkpoint), and the
CLI (SIGTERM before the loop, the "preempted" line, a SIGTERM during the final save). The launches with
torchrun (SIGTERM to the launcher, to one worker, a crashed rank) are in tests/runtime/test_distributed.py.
"""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from mirrorbert.runtime.distributed import DistContext
from mirrorbert.errors import UserError
from mirrorbert.training.checkpoints import CheckpointManager, verify_checkpoint
from mirrorbert.training.engine import Engine, stop_message
from support import LinearMethod
from mirrorbert.training.signals import (NO_SIGNAL, SIGINT_SEEN, SIGTERM_SEEN, InterruptFlag, SignalStop,
                                         stop_on_signal)


def _handlers():
    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


# ------------------------------------------------------------------------------ the flag
def test_repeated_sigterm_is_one_preemption_not_an_abort():
    before = _handlers()
    with InterruptFlag() as flag:
        assert flag.code == NO_SIGNAL
        for _ in range(3):  # Slurm's copy, torchrun's copy, a user's kill
            os.kill(os.getpid(), signal.SIGTERM)
        assert flag.raised and flag.code == SIGTERM_SEEN and flag.repeats == 2
    assert _handlers() == before


def test_ctrl_c_twice_aborts_and_sigterm_after_ctrl_c_makes_it_a_preemption():
    flag = InterruptFlag()
    flag.handle(signal.SIGINT)
    assert flag.code == SIGINT_SEEN
    flag.handle(signal.SIGTERM)
    assert flag.code == SIGTERM_SEEN
    with pytest.raises(KeyboardInterrupt):
        flag.handle(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):  # SIGTERM first, then Ctrl-C: still a person's abort
        other = InterruptFlag()
        other.handle(signal.SIGTERM)
        other.handle(signal.SIGINT)


def test_stop_on_signal_raises_for_sigterm_and_restores_the_handler():
    before = _handlers()
    with pytest.raises(SignalStop, match="SIGTERM"):
        with stop_on_signal():
            os.kill(os.getpid(), signal.SIGTERM)
    assert _handlers() == before
    with stop_on_signal(), InterruptFlag() as flag:  # the loop's flag wins inside it
        os.kill(os.getpid(), signal.SIGTERM)
    assert flag.code == SIGTERM_SEEN


# ------------------------------------------------------------------------------ the agreement
def _fake_all_reduce(others: list[int], fail_at: int | None = None):
    """dist.all_reduce(MAX) of a job whose other ranks hold `others[i]` at the i-th call (fail_at: a dead peer)."""
    calls = []

    def all_reduce(tensor, op=None):
        calls.append(int(tensor.item()))
        if fail_at is not None and len(calls) >= fail_at:
            raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")
        tensor.copy_(torch.maximum(tensor, torch.tensor([others[len(calls) - 1]])))

    all_reduce.calls = calls
    return all_reduce


def test_agree_is_the_maximum_over_the_processes(monkeypatch):
    reduce = _fake_all_reduce([NO_SIGNAL, SIGTERM_SEEN, SIGINT_SEEN, NO_SIGNAL])
    monkeypatch.setattr("mirrorbert.runtime.distributed.dist.all_reduce", reduce)
    ctx = DistContext(rank=1, world_size=2)
    assert [ctx.agree(c) for c in (NO_SIGNAL, SIGINT_SEEN, SIGTERM_SEEN, SIGINT_SEEN)] == [0, 2, 2, 1]
    assert reduce.calls == [0, 1, 2, 1]  # this process's own codes went into the collective
    assert DistContext().agree(SIGTERM_SEEN) == SIGTERM_SEEN  # one process: no collective


class _TwoRanks(DistContext):
    """Rank 0 of a pretend two-process job: collectives mocked, rank 0's writes run here."""

    def on_main(self, work, others):
        return work()


def _engine(tmp_path, method, dist=None, save_every=0):
    return Engine(method, dist=dist, show_progress=False,
                  checkpoints=CheckpointManager(tmp_path / "ckpt", every=save_every, at_end=bool(save_every)))


def test_a_sigterm_seen_by_the_other_rank_stops_this_one_at_the_same_step_with_one_checkpoint(tmp_path, monkeypatch):
    # steps 1-2: nobody signalled; after step 3 the other rank reports SIGTERM (this one saw nothing)
    monkeypatch.setattr("mirrorbert.runtime.distributed.dist.all_reduce",
                        _fake_all_reduce([NO_SIGNAL, NO_SIGNAL, SIGTERM_SEEN] + [NO_SIGNAL] * 10))
    method = LinearMethod()
    outcome = _engine(tmp_path, method, dist=_TwoRanks(rank=0, world_size=2)).run()
    assert (outcome.steps, outcome.interrupted, outcome.signal) == (3, True, "SIGTERM")
    assert method.steps_run == 3
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith(".")) == ["step-3"]
    assert verify_checkpoint(outcome.checkpoint)["step"] == 3
    assert stop_message(outcome.signal, 3, outcome.checkpoint) == (
        f"preempted at step 3 (SIGTERM); checkpoint written to {outcome.checkpoint}; "
        f"resume with the same command plus --resume {outcome.checkpoint}")
    assert stop_message("SIGTERM", 3, outcome.checkpoint, rank=1).startswith("rank 1: preempted at step 3;")
    assert stop_message("SIGINT", 3, outcome.checkpoint).startswith("interrupted at step 3 (SIGINT);")


def test_a_failed_agreement_after_sigterm_is_a_failure_naming_the_last_good_checkpoint(tmp_path, monkeypatch):
    """A peer crashed and torchrun SIGTERMs this survivor: the flag is set, but the all-reduce fails."""
    method = LinearMethod()

    def step_then_signal(batch, engine, real=method.train_step):
        out = real(batch, engine)
        if method.steps_run == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    method.train_step = step_then_signal
    monkeypatch.setattr("mirrorbert.runtime.distributed.dist.all_reduce", _fake_all_reduce([NO_SIGNAL] * 10, fail_at=3))
    engine = _engine(tmp_path, method, dist=_TwoRanks(rank=0, world_size=2), save_every=2)
    with pytest.raises(UserError) as caught:
        engine.run()
    message = str(caught.value)
    assert message.startswith("rank 0: SIGTERM received, but the processes could not agree to stop: another "
                              "process of the job failed or timed out")
    assert message.endswith(f"last good checkpoint: {tmp_path / 'ckpt' / 'step-2'}"), message
    assert "preempted" not in message
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith(".")) == ["step-2"]


def test_a_failed_collective_without_a_signal_is_a_failure_too(tmp_path, monkeypatch):
    monkeypatch.setattr("mirrorbert.runtime.distributed.dist.all_reduce", _fake_all_reduce([NO_SIGNAL] * 10, fail_at=2))
    with pytest.raises(UserError, match=r"^rank 0: another process of the job failed or timed out \(.*Connection "
                                        r"closed by peer.*\); no checkpoint was written \(use --save-every N\)$"):
        _engine(tmp_path, LinearMethod(), dist=_TwoRanks(rank=0, world_size=2)).run()


def test_a_second_sigterm_during_the_checkpoint_write_does_not_abort_it(tmp_path):
    """The loss seen with SIGTERM to torchrun plus a direct one (Slurm's time limit): rank 0 died mid-write."""
    sent = []

    def signal_while_saving():
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    method = LinearMethod(on_save=signal_while_saving)
    real = method.train_step

    def step(batch, engine):
        out = real(batch, engine)
        if method.steps_run == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    method.train_step = step
    before = _handlers()
    outcome = _engine(tmp_path, method).run()
    assert _handlers() == before
    assert sent and outcome.signal == "SIGTERM" and outcome.steps == 2
    assert verify_checkpoint(outcome.checkpoint)["step"] == 2
    assert not [p for p in (tmp_path / "ckpt").iterdir() if ".tmp-" in p.name]


# ------------------------------------------------------------------------------ the command line
TRAIN = ["train", "--batch-size", "4", "--max-length", "16", "--lr", "1e-3", "--mask-span", "1", "--pooling", "cls",
         "--device", "cpu", "--no-progress", "--seed", "1"]


def _kill_self(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_while_the_model_loads_ends_train_with_one_line(tiny_bert, strings_file, tmp_path, monkeypatch,
                                                                 capsys):
    from mirrorbert.cli.app import main

    monkeypatch.setattr("mirrorbert.mirror.train.open_start_model", _kill_self)
    before = _handlers()
    status = main(TRAIN + ["--model", str(tiny_bert), "--data", str(strings_file), "--output",
                           str(tmp_path / "out"), "--steps", "3"])
    err = capsys.readouterr().err
    assert status == 130
    lines = [line for line in err.splitlines() if line.startswith("mirrorbert:")]
    assert lines == ["mirrorbert: stopped by SIGTERM before the first training step (loading the model or data): "
                     "nothing to checkpoint; run the same command again"], err
    assert "Traceback" not in err
    assert _handlers() == before
    assert not (tmp_path / "out").exists()


def test_sigterm_during_training_prints_preempted_and_exits_130(tiny_bert, strings_file, tmp_path, monkeypatch,
                                                               capsys):
    import mirrorbert.mirror.step as trainer
    from mirrorbert.cli.app import main

    real, calls = trainer.backward_and_step, []

    def stepping(*args, **kwargs):
        real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            _kill_self()

    monkeypatch.setattr(trainer, "backward_and_step", stepping)
    status = main(TRAIN + ["--model", str(tiny_bert), "--data", str(strings_file), "--output",
                           str(tmp_path / "out"), "--steps", "5"])
    err = capsys.readouterr().err
    checkpoint = tmp_path / "out.checkpoints" / "step-2"
    assert status == 130
    assert (f"preempted at step 2 (SIGTERM); checkpoint written to {checkpoint}; resume with the same command plus "
            f"--resume {checkpoint}") in err.splitlines(), err
    assert verify_checkpoint(checkpoint)["step"] == 2 and not (tmp_path / "out").exists()


def test_sigterm_after_the_last_step_waits_for_the_output(tiny_bert, strings_file, tmp_path, monkeypatch, caplog):
    """The steps are done: a SIGTERM during the run's bookkeeping or save must not lose them."""
    import mirrorbert.mirror.train as trainer
    from mirrorbert.cli.app import main

    real = trainer.check_collapse

    def collapse_then_signal(*args, **kwargs):
        _kill_self()
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "check_collapse", collapse_then_signal)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        status = main(TRAIN + ["--model", str(tiny_bert), "--data", str(strings_file), "--output",
                               str(tmp_path / "out"), "--steps", "2"])
    assert status == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert "SIGTERM received: finishing and saving the trained model first" in caplog.messages
