"""Strict JSON for everything mirrorbert writes or prints: no NaN or Infinity, ever.

Python's `json` writes `NaN`/`Infinity` by default, which is not JSON: jq, JavaScript and most strict
readers reject the whole file. Here a non-finite number becomes `null`, and inside a mapping a sibling
key `<name>_note` says why (`"not finite: nan"`), so a reader sees both that the value is missing and
the reason. numpy scalars and arrays, paths and tuples become their plain JSON forms; a path that is not
UTF-8 is kept exactly (`dumps`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import PurePath
from typing import Any

NOTE_SUFFIX = "_note"


def _non_finite(value: Any) -> str | None:
    """'nan', 'inf' or '-inf' for a non-finite float (numpy included), None otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if isinstance(value, (bool, int)) or math.isfinite(number):
        return None
    return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")


def strict(obj: Any) -> Any:
    """`obj` with every non-finite number replaced by None (and a `<key>_note` beside it in mappings)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            key = str(key)
            bad = _non_finite(value) if _is_number(value) else None
            out[key] = None if bad else strict(value)
            if bad and f"{key}{NOTE_SUFFIX}" not in obj:
                out[f"{key}{NOTE_SUFFIX}"] = f"not finite: {bad}"
        return out
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [strict(v) for v in (sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj)]
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy/torch scalars and arrays
        return strict(obj.tolist())
    if _is_number(obj) and _non_finite(obj):
        return None
    return obj


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or type(value).__module__ == "numpy" and hasattr(value, "dtype")


def dumps(obj: Any, **kwargs: Any) -> str:
    """`json.dumps` of `strict(obj)`; refuses (ValueError) anything that would still not be strict JSON.

    A lone surrogate (how Python holds a file name that is not UTF-8: `os.fsdecode(b"x\\xff")` is "x\\udcff")
    is written as its escape, `\\udcff`: the text stays UTF-8, and `json.loads` gives the same string back,
    whose `os.fsencode` is the original bytes."""
    kwargs.setdefault("ensure_ascii", False)
    default = kwargs.pop("default", str)
    text = json.dumps(strict(obj), allow_nan=False, default=default, **kwargs)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# Outside strings JSON holds no such character, so each one met is inside a string, where its escape means it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads_strict(text: str) -> Any:
    """`json.loads` that rejects NaN/Infinity (what a strict reader such as jq does); for tests and readers."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


__all__ = ["dumps", "loads_strict", "strict"]
