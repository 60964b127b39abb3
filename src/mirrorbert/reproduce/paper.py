"""The paper's own numbers (data in ``paper_numbers.json``) and which paper base model a model is.

The numbers are data, never code: each cell records the table or figure it comes from and the source
it was transcribed from; what could not be checked is listed under ``unverified`` in the same file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

PAPER_NUMBERS_FILE = Path(__file__).with_name("paper_numbers.json")

#: Paper base model -> name fragments that identify it (lower case), checked against the model's
#: name/path and the ``_name_or_path`` in its config.
BASE_MODEL_NAMES: dict[str, tuple[str, ...]] = {
    "pubmedbert": ("pubmedbert",),
    "mbert": ("bert-base-multilingual",),
    "roberta-base": ("roberta-base",),
    "bert-base-uncased": ("bert-base-uncased",),
}
#: The paper's base models are all base-sized (12 layers, hidden 768): a small model that merely
#: borrows a base model's tokenizer (our offline reference MLM) must not be compared with them.
BASE_SIZE = {"num_hidden_layers": 12, "hidden_size": 768}


@dataclass(frozen=True)
class PaperCell:
    id: str
    table: str
    experiment: str
    base_model: str
    state: str
    metric: str
    value: float
    source: str
    note: str = ""


@lru_cache(maxsize=1)
def load_paper_numbers() -> dict[str, Any]:
    """The parsed paper-numbers file (cells as PaperCell, keyed by id)."""
    doc = json.loads(PAPER_NUMBERS_FILE.read_text(encoding="utf-8"))
    cells = {c["id"]: PaperCell(**c) for c in doc["cells"]}
    return {**doc, "cells": cells}


def paper_value(experiment: str, base_model: str | None, state: str, metric: str) -> PaperCell | None:
    """The paper's cell for (experiment, base model, state, metric), or None."""
    if base_model is None:
        return None
    return load_paper_numbers()["cells"].get(f"{experiment}/{base_model}/{state}/{metric}")


def read_config(model: str) -> dict[str, Any]:
    """`--model`'s config.json through the confined reader ({} for a Hub id, or a folder without one)."""
    from mirrorbert.safeguards.confined import ConfinedFolder

    if not Path(model).is_dir():
        return {}
    folder = ConfinedFolder(model, "--model", "model folder")
    config = folder.read_json("config.json") if folder.exists("config.json") else {}
    return config if isinstance(config, dict) else {}


def detect_base_model(model: str) -> str | None:
    """Which of the paper's base models ``model`` is (by name and size), or None."""
    config = read_config(model)
    names = [str(model).lower(), str(config.get("_name_or_path", "")).lower()]
    if config and any(config.get(k) not in (None, v) for k, v in BASE_SIZE.items()):
        return None
    for base, fragments in BASE_MODEL_NAMES.items():
        if any(f in name for name in names for f in fragments):
            return base
    return None
