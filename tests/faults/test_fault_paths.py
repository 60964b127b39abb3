"""Paths are bytes where the OS says so (class 4 of the fault suite): names that are not UTF-8, in every path option
and in the working folder, work for every command, and what mirrorbert writes into JSON keeps them exactly.

Folders and files are made with bytes paths (`os.mkdir(b"...\\xff")`); the command line holds them as Python does
(`os.fsdecode`: surrogate escapes), as `sys.argv` would.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from fault_tools import TRACEBACK, leftovers, run_mirrorbert, text

from mirrorbert.cli.app import main

ODD = b"caf\xe9-\xff"  # Latin-1 bytes: not UTF-8


def odd(folder: Path, name: bytes = ODD) -> Path:
    """`folder/name` for a name given as bytes (how Python holds it: surrogate escapes)."""
    return folder / os.fsdecode(name)


@pytest.fixture
def place(tmp_path, tiny_bert, corpus) -> Path:
    """A folder whose name is not UTF-8, holding the model, the data and a query file under odd names too."""
    folder = odd(tmp_path)
    os.mkdir(os.fsencode(folder))
    shutil.copytree(tiny_bert, odd(folder, b"model-\xfe"))
    odd(folder, b"data-\xfe.txt").write_bytes(("\n".join(corpus) + "\n").encode("utf-8"))
    odd(folder, b"queries-\xfe.txt").write_bytes(b"a cat\nthe bank\n")
    return folder


def _ok(status: int, capsys) -> str:
    err = capsys.readouterr()
    assert status == 0 and TRACEBACK not in err.err, err.err[-3000:]
    return err.out


def test_encode_index_and_search_with_odd_names_everywhere(place, capsys):
    model, data, queries = odd(place, b"model-\xfe"), odd(place, b"data-\xfe.txt"), odd(place, b"queries-\xfe.txt")
    vectors, index = odd(place, b"vectors-\xfe.npy"), odd(place, b"index-\xfe")
    record = json.loads(_ok(main(["encode", "--model", str(model), "--input", str(data), "--output", str(vectors),
                                  "--no-progress"]), capsys))
    assert os.fsencode(record["output"]) == os.fsencode(vectors) and np.load(vectors).shape == (12, 32)
    _ok(main(["index", "--model", str(model), "--corpus", str(data), "--output", str(index), "--no-progress"]), capsys)
    manifest = json.loads((index / "manifest.json").read_bytes())  # strict UTF-8 JSON: the odd bytes escaped
    recorded = [value for value in _strings(manifest) if value.endswith(os.fsdecode(b"data-\xfe.txt"))]
    assert recorded and os.fsencode(recorded[0]).endswith(os.fsencode(data)[-len(b"data-\xfe.txt"):])
    for extra in ([], ["--corpus", str(data)]):  # the manifest's paths read back and checked
        out = _ok(main(["search", "--index", str(index), *extra, "--queries", str(queries), "--top-k", "2",
                        "--no-progress"]), capsys)
        assert len(out.strip().splitlines()) == 2
    assert leftovers(place) == []


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_train_resume_and_its_record_with_odd_names_everywhere(place, capsys):
    from mirrorbert.encoder.model import Encoder

    model, data = odd(place, b"model-\xfe"), odd(place, b"data-\xfe.txt")
    out, checkpoints = odd(place, b"out-\xfe"), odd(place, b"ck-\xfe")
    base = ["train", "--model", str(model), "--data", str(data), "--batch-size", "4", "--max-length", "16",
            "--save-every", "1", "--checkpoint-dir", str(checkpoints), "--no-progress"]
    _ok(main(base + ["--steps", "2", "--output", str(out)]), capsys)
    meta = json.loads((out / "mirrorbert.json").read_bytes())
    config = meta["training"]["config"]
    assert os.fsencode(config["data"]) == os.fsencode(data) and os.fsencode(config["output"]) == os.fsencode(out)
    assert "\\udcff" in (out / "mirrorbert.json").read_text(encoding="utf-8")  # escaped, the file still UTF-8
    resumed = odd(place, b"resumed-\xfe")
    _ok(main(base + ["--steps", "3", "--output", str(resumed), "--resume", str(checkpoints / "step-2")]), capsys)
    assert Encoder.load(str(resumed), device="cpu").encode(["a cat"]).shape == (1, 32)
    assert leftovers(place) == []


def test_a_valid_model_in_an_odd_folder_is_read_as_what_it_is(place, capsys):
    """Never "model.safetensors damaged or truncated" for a path a library cannot encode."""
    from mirrorbert.encoder.model import Encoder

    model = odd(place, b"model-\xfe")
    assert Encoder.load(str(model), device="cpu").encode(["a cat"]).shape == (1, 32)
    status = main(["encode", "--model", str(model), "--input", str(odd(place, b"data-\xfe.txt")), "--output",
                   str(odd(place, b"v.npy")), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 0 and "damaged" not in err, err[-2000:]


@pytest.mark.slow
def test_export_and_push_dry_run_with_odd_names(place, capsys):
    pytest.importorskip("onnxruntime")
    model = odd(place, b"model-\xfe")
    served = odd(place, b"served-\xfe")
    _ok(main(["export", "--model", str(model), "--output", str(served)]), capsys)
    assert (served / "onnx" / "model.onnx").is_file()
    trained = odd(place, b"trained-\xfe")
    _ok(main(["train", "--model", str(model), "--data", str(odd(place, b"data-\xfe.txt")), "--output", str(trained),
              "--steps", "1", "--batch-size", "4", "--no-progress"]), capsys)
    upload = odd(place, b"upload-\xfe")
    _ok(main(["push", "--model", str(trained), "--repo", "user/name", "--dry-run", "--output", str(upload)]), capsys)
    assert (upload / "model.safetensors").is_file() or any(upload.rglob("*.safetensors"))
    assert leftovers(place) == []


@pytest.mark.parametrize("name", ["encode", "index", "train"])
def test_every_command_works_in_an_odd_working_folder(name, tmp_path, tiny_bert, corpus):
    """Relative paths inside a working folder that is not UTF-8 (the command is started there by the shell)."""
    here = os.fsencode(tmp_path) + b"/work-" + ODD
    os.mkdir(here)
    shutil.copytree(tiny_bert, os.fsdecode(here + b"/model"))
    with open(here + b"/data.txt", "wb") as fh:
        fh.write(("\n".join(corpus) + "\n").encode("utf-8"))
    argv = {"encode": ["encode", "--model", "model", "--input", "data.txt", "--output", "v.npy", "--no-progress"],
            "index": ["index", "--model", "model", "--corpus", "data.txt", "--output", "idx", "--no-progress"],
            "train": ["train", "--model", "model", "--data", "data.txt", "--output", "out", "--steps", "1",
                      "--batch-size", "4", "--no-progress"]}[name]
    result = run_mirrorbert(argv, cwd=here)
    assert result.returncode == 0 and TRACEBACK not in text(result.stderr), text(result.stderr)[-3000:]
    made = set(os.listdir(here)) - {b"model", b"data.txt"}
    assert made and leftovers(Path(os.fsdecode(here))) == []
    if name == "train":
        meta = json.loads(open(here + b"/out/mirrorbert.json", "rb").read())
        assert meta["training"]["config"]["output"] == "out"


def test_json_written_by_mirrorbert_keeps_an_odd_path_exactly(tmp_path):
    import mirrorbert.jsonio as jsonio

    path = os.fsdecode(b"/data/caf\xe9/\xff\xfe.txt")
    written = jsonio.dumps({"data": path, "note": "é"})
    written.encode("utf-8")  # UTF-8 text, as every JSON reader wants
    assert "é" in written and "\\udce9" in written
    assert os.fsencode(json.loads(written)["data"]) == b"/data/caf\xe9/\xff\xfe.txt"
    assert sys.getfilesystemencoding() == "utf-8"
