"""A run that finishes says which checkpoints it leaves, and a resumed one names the folder it resumed from."""

from __future__ import annotations

import logging

from mirrorbert.mirror.train import train
from support import cpu_cfg_for as cfg_for

ENGINE = "mirrorbert.training.engine"


def _left_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ENGINE and "left" in r.getMessage()]


def test_a_resume_into_another_output_names_both_folders(tmp_path, tiny_bert, strings_file, caplog):
    first = tmp_path / "first"
    with caplog.at_level(logging.INFO, logger=ENGINE):
        train(cfg_for(tiny_bert, strings_file, first, steps=2, save_every=1, keep_checkpoints=2))
    assert _left_lines(caplog) == [f"checkpoints left in {tmp_path / 'first.checkpoints'}: step-1, step-2 "
                                   "(--keep-checkpoints 2); remove the folder once the model is safe"]
    caplog.clear()
    second = tmp_path / "second"
    with caplog.at_level(logging.INFO, logger=ENGINE):
        train(cfg_for(tiny_bert, strings_file, second, steps=4, keep_checkpoints=2,
                      resume=str(tmp_path / "first.checkpoints" / "step-1")))
    assert _left_lines(caplog) == [
        f"checkpoints left in {tmp_path / 'second.checkpoints'}: step-4 (--keep-checkpoints 2); remove the folder "
        f"once the model is safe; the checkpoints this run resumed from, in {tmp_path / 'first.checkpoints'}, are "
        "left as they were: remove them once no run needs to resume from them"]
    assert sorted(p.name for p in (tmp_path / "first.checkpoints").glob("step-*")) == ["step-1", "step-2"]


def test_a_resume_in_place_prunes_by_the_keep_rule_and_says_what_stays(tmp_path, tiny_bert, strings_file, caplog):
    out = tmp_path / "out"
    train(cfg_for(tiny_bert, strings_file, out, steps=2, save_every=1, keep_checkpoints=2))
    caplog.clear()  # the first run's own lines (captured when an earlier test left the logger at INFO)
    with caplog.at_level(logging.INFO, logger=ENGINE):
        train(cfg_for(tiny_bert, strings_file, out, steps=4, save_every=1, keep_checkpoints=2, overwrite=True,
                      resume=str(tmp_path / "out.checkpoints")))
    assert sorted(p.name for p in (tmp_path / "out.checkpoints").glob("step-*")) == ["step-3", "step-4"]
    assert _left_lines(caplog) == [f"checkpoints left in {tmp_path / 'out.checkpoints'}: step-3, step-4 "
                                   "(--keep-checkpoints 2); remove the folder once the model is safe"]


def test_a_run_without_checkpoints_says_nothing_about_them(tmp_path, tiny_bert, strings_file, caplog):
    with caplog.at_level(logging.INFO, logger=ENGINE):
        train(cfg_for(tiny_bert, strings_file, tmp_path / "out", steps=2))
    assert _left_lines(caplog) == []
    assert not (tmp_path / "out.checkpoints").exists()
