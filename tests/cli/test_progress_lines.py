"""A command whose stderr is a file (nohup, a scheduler's log) writes a progress line per interval, not two lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys

LINE = re.compile(r"INFO mirrorbert\.progress: mirror: (\d+)/160 steps \(\d+%\), [0-9.]+ step/s, "
                  r"((ETA \S+, )?elapsed \S+|done in \S+)")  # no ETA before the first step


def _train(tiny_bert, strings_file, out, *extra, interval="0.02", steps=160):
    exe = os.path.join(os.path.dirname(sys.executable), "mirrorbert")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MIRRORBERT_PROGRESS_INTERVAL": interval}
    log = out.with_suffix(".log")
    with open(log, "w", encoding="utf-8") as err:  # a file, not a terminal
        run = subprocess.run([exe, "train", "--model", str(tiny_bert), "--data", str(strings_file), "--batch-size",
                              "4", "--steps", str(steps), "--output", str(out), *extra],
                             stdout=subprocess.PIPE, stderr=err, text=True, env=env, timeout=600)
    return run, log.read_text(encoding="utf-8")


def test_train_into_a_file_writes_periodic_progress_lines(tiny_bert, strings_file, tmp_path):
    run, log = _train(tiny_bert, strings_file, tmp_path / "out")
    assert run.returncode == 0, log
    # the heartbeat's "still ..." lines share the logger; at this interval they come between phases too
    found = [LINE.search(line) for line in log.splitlines() if "mirrorbert.progress" in line and ": still " not in line]
    assert found and all(found), log
    steps = [int(m.group(1)) for m in found]
    assert len(steps) >= 3 and steps == sorted(steps), steps  # a line per interval, the step growing
    assert found[-1].group(2).startswith("done in") and steps[-1] == 160
    assert "\r" not in log  # no tqdm redraws in a log file


def test_no_progress_means_no_progress_lines(tiny_bert, strings_file, tmp_path):
    run, log = _train(tiny_bert, strings_file, tmp_path / "out", "--no-progress", interval="0.0001", steps=5)
    assert run.returncode == 0, log
    assert "mirrorbert.progress" not in log


def test_a_bad_interval_is_one_line_before_any_work(tiny_bert, strings_file, tmp_path):
    run, log = _train(tiny_bert, strings_file, tmp_path / "out", interval="soon")
    assert run.returncode == 2
    assert log.strip().splitlines()[-1] == ("mirrorbert: error: MIRRORBERT_PROGRESS_INTERVAL='soon': expected a number "
                                            "of seconds > 0, e.g. 30")
    assert not (tmp_path / "out").exists()
