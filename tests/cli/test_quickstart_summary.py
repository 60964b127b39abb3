"""The quickstart's summary compares the user's run with itself only (src/mirrorbert/cli/quickstart_summary.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def _scores(path, dev):
    path.write_text(json.dumps({"tasks": {"sts": {"metrics": {"stsb_dev": dev}}}}), encoding="utf-8")
    return path


def _numbers(lines):
    return re.findall(r"\d[\d,.]*", " ".join(lines))


def test_the_summary_holds_this_runs_numbers_and_no_others(tmp_path):
    from mirrorbert.cli.quickstart_summary import summary_lines

    before, after = _scores(tmp_path / "b.json", 0.1790), _scores(tmp_path / "a.json", 0.6103)
    lines = summary_lines(before, after, "bert-base-uncased")
    assert lines[1] == ("STS-B dev split (1,500 pairs), Spearman x100 of cosine vs gold, this run: before 17.90 -> "
                        "after 61.03 (+43.13)")
    assert len(lines) == 3  # no "what to expect" from the paper or another machine
    model = tmp_path / "ref"
    model.mkdir()
    (model / "quickstart_reference.json").write_text(json.dumps(
        {"plan": {"architecture": "bert-mini"}, "max_tokens": 917504, "wall_time_s": 512.4, "eval_accuracy": 0.042}))
    lines = summary_lines(before, after, str(model))
    assert lines[-1] == ("The model trained from is the offline reference MLM (bert-mini) pre-trained here on 917,504 "
                         "tokens in 512 s (held-out masked accuracy 4.2%): its scores follow the tokens this machine "
                         "fitted in the budget (QUICKSTART_BUDGET_S).")
    # every number printed comes from this run's files, or is the dev split's size (line 2 names the files)
    assert set(_numbers(lines[:2] + lines[3:])) == {"1,500", "100", "17.90", "61.03", "43.13", "917,504", "512", "4.2"}


def test_the_quickstart_prints_it_through_the_module(tmp_path):
    quickstart = (Path(__file__).resolve().parents[2] / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    assert "python -m mirrorbert.cli.quickstart_summary" in quickstart
    assert "docs/results" not in quickstart.split("quickstart_summary", 1)[1]  # nothing quoted after it
    before, after = _scores(tmp_path / "b.json", 0.5), _scores(tmp_path / "a.json", 0.6)
    run = subprocess.run([sys.executable, "-m", "mirrorbert.cli.quickstart_summary", str(before), str(after), "m"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "before 50.00 -> after 60.00 (+10.00)" in run.stdout
