"""`mirrorbert train`: the loss of the progress lines' end is the loss of the summary (both the mean of the last
steps, training/loss_record.py), not one short batch's beside an epoch's mean."""

from __future__ import annotations

import logging
import re

from mirrorbert.cli.app import main
from tiny_models import CORPUS


def test_the_last_progress_line_and_the_summary_show_the_same_loss(tiny_bert, tmp_path, monkeypatch, caplog, capsys):
    data = tmp_path / "ten.txt"
    data.write_text("\n".join(CORPUS[:10]) + "\n", encoding="utf-8")  # batches of 4, 4, 2: a short last batch
    monkeypatch.setenv("MIRRORBERT_PROGRESS_INTERVAL", "0.001")  # a line at every step
    caplog.set_level(logging.INFO)
    assert main(["train", "--model", str(tiny_bert), "--data", str(data), "--output", str(tmp_path / "m"),
                 "--batch-size", "4", "--epochs", "1", "--max-length", "16", "--device", "cpu"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "mirrorbert.progress" and "steps (" in r.getMessage()]
    ends = [line for line in lines if "(100%)" in line]
    assert len(ends) == 1, lines  # one line at the end, not two
    shown = re.search(r"loss=([0-9.]+)", ends[0]).group(1)
    summary = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("done: "))
    assert f"-> {shown} (mean of the last 3 steps, the progress lines' loss)" in summary, (ends[0], summary)
