"""The run lifecycle (training/run.py): the order every trainer goes through, exact resume through it, and the
resume rules it applies for every method."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import option
from mirrorbert.settings.run_options import RunOptions
from mirrorbert.training import run as lifecycle
from mirrorbert.training.run import GuardedPaths, Recipe
from support import LinearMethod


@dataclass(kw_only=True)
class _Options(RunOptions):
    lr: float = option(0.1, help="learning rate")


class _Recipe(Recipe):
    label = "test"

    def __init__(self, cfg, total_steps=4, stop_after=None):
        super().__init__(cfg)
        self.total_steps, self.stop_after, self.calls = total_steps, stop_after, []

    def guarded_paths(self):
        self.calls.append("guard")
        return GuardedPaths(inputs={})

    def read_data(self, run_ctx):
        self.calls.append("data")

    def check_resume(self, resume, run_ctx):
        self.calls.append("check_resume")

    def build(self, run_ctx):
        self.calls.append("build")
        method = LinearMethod(self.total_steps)
        method.config = self.cfg.to_dict()
        if run_ctx.resume is not None:  # the weights come from the checkpoint, as every recipe's do
            from safetensors.torch import load_file

            method.layer.load_state_dict(load_file(str(run_ctx.resume.model_dir / "weights.safetensors")))
        return method

    def restore(self, method, extra, resume):
        self.calls.append("restore")
        method.steps_run = extra["steps_run"]

    def stop_at(self, step):
        return None if self.stop_after is None else step + self.stop_after

    def before_run(self, method, engine):
        self.calls.append("before_run")

    def close(self, method):
        self.calls.append("close")

    def stopped(self, method, outcome, run_ctx):
        self.calls.append("stopped")
        return outcome

    def finish(self, method, outcome, engine, run_ctx):
        self.calls.append("finish")
        engine.save_final(self.cfg.output, method.save_model, overwrite=self.cfg.overwrite)
        return method


def _options(tmp_path, **kw):
    return _Options(output=str(tmp_path / "out"), device="cpu", precision="fp32", show_progress=False, **kw)


def test_every_run_goes_through_the_same_steps_in_order(tmp_path):
    recipe = _Recipe(_options(tmp_path))
    method = lifecycle.run(recipe)
    assert recipe.calls == ["guard", "data", "build", "before_run", "close", "finish"]
    assert method.steps_run == 4 and (tmp_path / "out" / "weights.safetensors").is_file()


def test_a_stopped_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    from safetensors.torch import load_file

    whole = lifecycle.run(_Recipe(_options(tmp_path / "a")))
    stopped = _Recipe(_options(tmp_path / "b", save_every=1), stop_after=2)
    outcome = lifecycle.run(stopped)
    assert stopped.calls[-2:] == ["close", "stopped"] and outcome.steps == 2
    resumed = _Recipe(_options(tmp_path / "b", resume=str(outcome.checkpoint)))
    method = lifecycle.run(resumed)
    assert resumed.calls == ["guard", "data", "check_resume", "build", "restore", "before_run", "close", "finish"]
    assert method.steps_run == 4
    a = load_file(str(tmp_path / "a" / "out" / "weights.safetensors"))
    b = load_file(str(tmp_path / "b" / "out" / "weights.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a) and whole.steps_run == 4


def test_a_resume_with_a_changed_option_that_is_not_resume_safe_is_refused(tmp_path):
    outcome = lifecycle.run(_Recipe(_options(tmp_path, save_every=1), stop_after=1))
    with pytest.raises(UserError, match=r"--lr \(0\.1 -> 0\.2\)"):
        lifecycle.run(_Recipe(_options(tmp_path, resume=str(outcome.checkpoint), lr=0.2)))


def test_a_checkpoint_written_under_auto_resumes_under_auto_and_another_precision_is_refused(tmp_path):
    """A checkpoint records the precision asked for (`auto`, whatever it resolved to on that machine): `auto`
    resumes it; a checkpoint of another asked precision is refused under `auto`."""
    for asked in ("auto", "fp32"):
        folder = tmp_path / asked
        written = _Recipe(_Options(output=str(folder / "out"), device="cpu", precision=asked, show_progress=False,
                                   save_every=1), stop_after=1)
        outcome = lifecycle.run(written)
        resumed = _Recipe(_Options(output=str(folder / "out"), device="cpu", precision="auto", show_progress=False,
                                   resume=str(outcome.checkpoint)))
        if asked == "auto":
            assert lifecycle.run(resumed).steps_run == 4
        else:
            with pytest.raises(UserError, match=r"--precision \('fp32' -> 'auto'\)"):
                lifecycle.run(resumed)
