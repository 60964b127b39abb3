"""How a score is shown: x100 with two decimals, counts as integers (evaluation tables and model cards)."""

from __future__ import annotations

import math


def is_count(key: str) -> bool:
    """Counts are printed as integers, not scaled."""
    return key == "n" or key.endswith("_n") or key.startswith("n_")


def format_value(key: str, value: float) -> str:
    """x100 with two decimals (counts as integers, NaN as 'nan')."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    if is_count(key):
        return str(int(round(value)))
    return f"{value * 100:.2f}"
