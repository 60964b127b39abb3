"""Where the supported library versions (pyproject's floors up to the latest) differ, decided in one place.

Each helper names the versions it tells apart; the floors run (`scripts/test_floors.sh`) and the latest-versions
run (`scripts/test.sh`) cover both sides of each.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import PackageNotFoundError, version


@functools.lru_cache(maxsize=None)
def installed_version(distribution: str) -> tuple[int, ...]:
    """(major, minor, patch) of an installed distribution, (0,) when it is not installed."""
    try:
        text = version(distribution)
    except PackageNotFoundError:
        return (0,)
    parts = []
    for piece in text.split(".")[:3]:
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
    return tuple(parts) or (0,)


def transformers_takes_4d_mask() -> bool:
    """transformers 5 passes a prepared (batch, 1, q, k) attention mask through to the attention of BERT-style
    encoders (masking_utils.create_bidirectional_mask); 4.x raises 'Wrong shape ... attention_mask' on it and
    takes the same block mask as (batch, q, k), 1 = attend, which get_extended_attention_mask turns into an
    additive one for eager and SDPA attention alike."""
    return installed_version("transformers") >= (5,)


@functools.lru_cache(maxsize=None)
def from_pretrained_takes_weights_only() -> bool:
    """transformers 5 has a `weights_only` argument on `from_pretrained` (True by default); 4.x has none (an
    unknown keyword reaches the model's __init__) and always unpickles `.bin` weights with
    `torch.load(weights_only=True)` on torch >= 1.13, so both refuse code in pickled weights."""
    import inspect

    from transformers import PreTrainedModel

    return "weights_only" in inspect.signature(PreTrainedModel.from_pretrained).parameters
