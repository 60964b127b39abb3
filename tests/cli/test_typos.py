"""A mistyped option is caught, in one line naming what was probably meant, before any work (cli/options.py).

No abbreviation is taken for a flag (`--epoch 2` is not `--epochs 2`); an unknown flag is one line with the
closest one; an implausible value is refused with the value likely meant; a missing required option is named
before anything is read (a FIFO as the data proves it: reading it would block).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mirrorbert.cli.app import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def refused(capsys, argv: list[str]) -> str:
    """The one error line of a command line the parser refuses (exit 2); nothing else on stderr."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "usage:" not in err, err
    return err.rstrip("\n")


@pytest.mark.parametrize("argv, line", [
    (["train", "--epoch", "2"], "unrecognized option --epoch; did you mean --epochs?"),
    (["train", "--epoch=2"], "unrecognized option --epoch; did you mean --epochs?"),
    (["train", "--output-dir", "runs/x"], "unrecognized option --output-dir; did you mean --output?"),
    (["train", "--learning-rate", "1e-5"], "unrecognized option --learning-rate; did you mean --lr?"),
    (["encode", "--bs", "8"], "unrecognized option --bs; did you mean --batch-size?"),
    (["search", "--max-len", "8"], "unrecognized option --max-len; did you mean --max-length?"),
    (["eval", "--task", "sts"], "unrecognized option --task; did you mean --tasks?"),
    (["train", "--bogus"], "unrecognized option --bogus (mirrorbert train --help lists the options)"),
    (["encode", "stray"], "unexpected argument 'stray' (mirrorbert encode --help lists the options)"),
    (["train", "--lr", "fast"], "--lr: invalid float value: 'fast'"),
    (["finetune-sts", "--seeds", "0,x"], "--seeds: expected comma-separated whole numbers, not '0,x'"),
    (["reproduce", "--train-option", "lr"], "--train-option: expected KEY=VALUE, e.g. lr=5e-5, not 'lr'"),
])
def test_a_mistyped_option_is_one_line_naming_the_likely_one(capsys, argv, line):
    assert refused(capsys, argv) == f"mirrorbert: error: {line}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_no_command_takes_an_abbreviation(capsys, command):
    flags = [s for a in _subcommands()[command]._actions for s in a.option_strings if s.startswith("--")]
    longest = max(flags, key=len)
    prefix = longest[:-2]  # unambiguous among this command's flags where argparse would take it
    assert refused(capsys, [command, prefix]).startswith(f"mirrorbert: error: unrecognized option {prefix}")


def test_search_without_a_corpus_or_an_index_names_both(capsys):
    assert main(["search", "--model", "m", "--query", "x"]) == 2
    assert capsys.readouterr().err == ("mirrorbert: error: search needs --corpus (the entries to search) or --index "
                                       "(a folder written by `mirrorbert index`)\n")


def test_an_implausible_value_and_a_missing_option_are_named_before_anything_is_read(tmp_path):
    """The data is a FIFO nobody writes to: a command that read it would block until the timeout."""
    fifo = tmp_path / "strings.fifo"
    os.mkfifo(fifo)
    cases = {
        "lr": ["train", "--data", fifo, "--output", tmp_path / "o", "--lr", "2e5"],
        "train output": ["train", "--data", fifo],
        "mlm output": ["pretrain-mlm", "--corpus", fifo, "--model", "m"],
        "gloss model": ["gloss-pretrain", "--triplets", fifo, "--output", tmp_path / "g"],
    }
    code = textwrap.dedent(f"""
        import sys
        from mirrorbert.cli.app import main
        for argv in {[[str(a) for a in argv] for argv in cases.values()]!r}:
            print(main(argv), file=sys.stderr, flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    lines = run.stderr.splitlines()
    assert run.returncode == 0 and "Traceback" not in run.stderr and "training " not in run.stderr, run.stderr
    assert lines == [
        "mirrorbert: error: --lr 200000.0: outside (0, 1]; did you mean 2e-05?", "2",
        "mirrorbert: error: --output is required (the trained model's folder)", "2",
        "mirrorbert: error: --output is required (the model's folder)", "2",
        "mirrorbert: error: --model is required (the masked LM to start from)", "2",
    ], run.stderr
