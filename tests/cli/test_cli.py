"""The `mirrorbert` command end to end, and every bad input giving one line and a non-zero exit."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mirrorbert.cli.app import main


def test_train_then_encode_console_script(tiny_bert, strings_file, tmp_path):
    """The real console script in a subprocess: exit codes, output files, vectors readable."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    exe = os.path.join(os.path.dirname(sys.executable), "mirrorbert")
    out = tmp_path / "out"
    run = subprocess.run([exe, "train", "--model", str(tiny_bert), "--data", str(strings_file), "--preset",
                          "sentence", "--batch-size", "4", "--steps", "3", "--output", str(out), "--no-progress"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["steps"] == 3
    # a short labelled summary on screen; the whole resolved configuration only with -v (and in mirrorbert.json)
    assert "preset sentence: temperature 0.04, span 5 chars" in run.stderr and '"mask_span": 5' not in run.stderr
    assert "done: 3 steps" in run.stderr and "mean pairwise cosine" in run.stderr
    assert "of real tokens hidden" in run.stderr  # what the augmentation did, logged
    meta = json.loads((out / "mirrorbert.json").read_text())
    assert meta["pooling"] == "mean"  # sentence preset, BERT-family model
    assert 0 < meta["training"]["masked_token_share"] < 1 and 0 < meta["training"]["masked_string_share"] < 1
    vec = tmp_path / "v.npy"
    run = subprocess.run([exe, "encode", "--model", str(out), "--input", str(strings_file), "--output", str(vec),
                          "--normalize"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    arr = np.load(vec)
    assert arr.shape == (12, 32) and np.allclose(np.linalg.norm(arr, axis=1), 1, atol=1e-5)


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def test_bad_inputs_give_one_line_errors(tiny_bert, strings_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = ["train", "--model", str(tiny_bert), "--no-progress", "--steps", "1"]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nfine\n\xff\n")
    few = tmp_path / "few.txt"
    few.write_text("a\na\n")
    exists = tmp_path / "exists"
    exists.mkdir()
    cases = [
        (["--data", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o")], "missing.txt: no such file"),
        (["--data", str(empty), "--output", str(tmp_path / "o")], "empty.txt: the file is empty"),
        (["--data", str(bad), "--output", str(tmp_path / "o")], "bad.txt:3: not valid UTF-8"),
        (["--data", str(few), "--output", str(tmp_path / "o")], "at least 2 distinct"),
        (["--data", str(strings_file), "--preset", "giant", "--output", str(tmp_path / "o")], "--preset giant: not one of word, phrase, sentence"),
        (["--data", str(strings_file), "--pooling", "max", "--output", str(tmp_path / "o")], "--pooling max: not one of cls, mean, first-last"),
        (["--data", str(strings_file), "--precision", "fp8", "--output", str(tmp_path / "o")], "--precision fp8: not one of"),
        (["--data", str(strings_file), "--mask-unit", "word", "--output", str(tmp_path / "o")], "--mask-unit word: not one of char, token"),
        (["--data", str(strings_file), "--loss", "triplet", "--output", str(tmp_path / "o")], "--loss triplet: not one of infonce, ms"),
        (["--data", str(strings_file), "--output", str(exists)], "already exists; pass --overwrite"),
        (["--data", str(strings_file)], "--output is required"),
        (["--data", str(strings_file), "--output", str(tmp_path / "o"), "--config", str(tmp_path / "no.yaml")], "--config"),
    ]
    for extra, message in cases:
        code, last = _error(capsys, base + extra)
        assert code == 2, (extra, last)
        assert last.startswith("mirrorbert: error:") and message in last, (message, last)
    code, last = _error(capsys, ["train", "--model", "no-such-model-anywhere", "--data", str(strings_file),
                                 "--output", str(tmp_path / "o")])
    assert code == 2 and "hub is unreachable" in last and "local folder" in last
    code, last = _error(capsys, ["train", "--model", str(tiny_bert), "--data", str(strings_file),
                                 "--output", str(tmp_path / "o"), "--drophead", "0.1", "--mask-span", "1",
                                 "--mask-unit", "token", "--loss", "ms", "--mask-min-chars", "10",
                                 "--steps", "1", "--no-progress", "--batch-size", "999"])
    assert code == 0
    assert not list(tmp_path.glob("o/.tmp*"))


def test_encode_errors(tiny_bert, strings_file, tmp_path, capsys):
    out = tmp_path / "v.npy"
    out.write_bytes(b"precious")
    code, last = _error(capsys, ["encode", "--model", str(tiny_bert), "--input", str(strings_file), "--output", str(out)])
    assert code == 2 and "already exists" in last and out.read_bytes() == b"precious"
    code, last = _error(capsys, ["encode", "--model", str(tiny_bert), "--input", str(tmp_path / "x.txt"),
                                 "--output", str(tmp_path / "w.npy")])
    assert code == 2 and "--input" in last and "no such file" in last
    code, last = _error(capsys, ["encode", "--model", str(tiny_bert), "--input", str(strings_file),
                                 "--output", str(tmp_path / "w.txt")])
    assert code == 2 and ".npy" in last


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "train" in out and "encode" in out


def test_one_progress_switch_spelled_the_same_everywhere():
    """Every command that draws progress bars turns them off with --no-progress; none shows another spelling."""
    from mirrorbert.cli.app import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    with_switch = []
    for name, command in sub.choices.items():
        visible = {o for a in command._actions if a.help != "==SUPPRESS==" for o in a.option_strings}
        assert "--progress" not in visible, name
        if "--no-progress" in visible:
            with_switch.append(name)
    assert {"train", "encode", "search", "eval", "pretrain-mlm", "gloss-pretrain"} <= set(with_switch)


def test_verbose_shows_the_resolved_configuration(tiny_bert, strings_file, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.DEBUG, logger="mirrorbert"):
        assert main(["-v", "train", "--model", str(tiny_bert), "--data", str(strings_file), "--batch-size", "4",
                     "--steps", "1", "--no-progress", "--output", str(tmp_path / "o")]) == 0
    assert any("resolved configuration" in r.getMessage() and '"temperature"' in r.getMessage()
               for r in caplog.records)


def _subcommands():
    from mirrorbert.cli.app import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices


def test_help_defaults_match_the_parsers_defaults():
    """Every option whose help states "(default X)" has X as its real default."""
    import re

    checked = 0
    for name, command in _subcommands().items():
        for action in command._actions:
            match = re.search(r"\(default:? ([^);,]+)\)", action.help or "")
            if not match or action.default is None or not action.option_strings:
                continue
            default = action.default
            if match.group(1).strip() == (",".join(map(str, default)) if isinstance(default, (list, tuple))
                                          else str(default)):  # a text or list default, stated whole
                checked += 1
                continue
            stated = match.group(1).strip().split()[0].rstrip(":")
            if stated in ("all", "none", "the", "torch's"):  # words, not values
                continue
            if isinstance(action.default, bool):  # a flag: "(default off)" means the flag is not given
                given = {"off": False, "false": False, "on": True, "true": True}.get(stated.lower())
                if given is None:
                    continue  # prose ("default: continue"), not a value
                stated = str(given != (action.__class__.__name__ == "_StoreFalseAction"))
            numeric = re.fullmatch(r"-?[\d.e+/-]+", stated) and isinstance(action.default, (int, float))
            if numeric and "/" in stated:
                top, bottom = stated.split("/")
                stated = repr(float(top) / float(bottom))
            assert str(action.default) == stated or repr(action.default) == stated or \
                (numeric and float(stated) == float(action.default)), \
                f"{name} {action.option_strings[0]}: help says {stated}, default is {action.default!r}"
            checked += 1
    assert checked >= 10


def test_packing_default_is_described_the_same_in_help_and_docs():
    from pathlib import Path

    # The packing section moved from the README to the training guide of the docs site.
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "training.md").read_text(encoding="utf-8")
    assert "The default `auto` packs wherever the model supports it and the packed batch costs fewer FLOPs" in guide
    assert "stay padded" in guide
    for name in ("train", "encode", "eval"):
        action = next(a for a in _subcommands()[name]._actions if "--packing" in a.option_strings)
        assert action.default in ("auto", None) and "fewer FLOPs than padding" in action.help
        assert "encode's length-sorted batches stay padded" in action.help
