"""One seed rule for every --seed/--seeds value, wherever it enters."""

from __future__ import annotations

from typing import Any

from mirrorbert.errors import UserError

#: Seeds every generator accepts (numpy's legacy seed, torch.manual_seed, random): 0 .. 2**32 - 1. A bigger
#: one (a 20-digit --seed) would end in an overflow traceback inside torch after the data was read.
MAX_SEED = 2**32 - 1
SEED_RULE = f"must be a whole number from 0 to {MAX_SEED} (2**32 - 1)"


def seed_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def check_seed(value: Any, option: str = "--seed") -> None:
    """One rule for every --seed/--seeds value; UserError naming the option otherwise."""
    if not seed_ok(value):
        raise UserError(f"{option} {value!r}: {SEED_RULE}")
