"""Every JSON file and JSON line mirrorbert writes is strict JSON: no NaN/Infinity, `null` with the reason."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mirrorbert import jsonio

SRC = Path(__file__).resolve().parents[2] / "src" / "mirrorbert"


def test_non_finite_numbers_become_null_with_a_note():
    obj = {"loss": float("nan"), "best": np.float32(np.inf), "ok": 1.5, "n": 3, "flag": True,
           "history": [{"step": 1, "loss": -math.inf}], "array": np.array([1.0, np.nan]), "path": Path("a/b")}
    text = jsonio.dumps(obj)
    back = jsonio.loads_strict(text)  # a strict reader accepts it
    assert back["loss"] is None and back["loss_note"] == "not finite: nan"
    assert back["best"] is None and back["best_note"] == "not finite: inf"
    assert back["history"] == [{"step": 1, "loss": None, "loss_note": "not finite: -inf"}]
    assert back["array"] == [1.0, None] and back["path"] == "a/b"
    assert (back["ok"], back["n"], back["flag"]) == (1.5, 3, True)
    with pytest.raises(ValueError):
        jsonio.loads_strict(json.dumps({"x": float("nan")}))  # what Python's json would have written


def test_a_note_already_given_is_kept():
    back = jsonio.loads_strict(jsonio.dumps({"loss": float("nan"), "loss_note": "diverged at step 3"}))
    assert back == {"loss": None, "loss_note": "diverged at step 3"}


def test_every_json_writer_in_the_package_goes_through_jsonio():
    """A `json.dump(s)` call outside jsonio.py is allowed only for hashing (marked `# key, not output`)."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "jsonio.py":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("dump", "dumps")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"
                    and "# key, not output" not in lines[node.lineno - 1]):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not offenders, offenders
