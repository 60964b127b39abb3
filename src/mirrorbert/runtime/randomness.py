"""Seeds and random-number state: seeding, derived generators, capture/restore for resume and replay."""

from __future__ import annotations

import contextlib
import logging
import random
from typing import Any, Iterator, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived_generator(seed: int, *stream: int) -> torch.Generator:
    """An independent torch generator for one purpose (e.g. masking in epoch 3), reproducible from the seed."""
    mixed = np.random.SeedSequence([seed, *stream]).generate_state(1, dtype=np.uint64)[0]
    gen = torch.Generator()
    gen.manual_seed(int(mixed) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def index_uniforms(seed: int, stream: Sequence[int], indices: Sequence[int]) -> np.ndarray:
    """One uniform float in [0, 1) per index, a pure function of (seed, stream, index) alone (SplitMix64's
    finaliser): a batch, a shard, a resumed run draw what a whole epoch would."""
    key = np.random.SeedSequence([seed, *stream]).generate_state(1, dtype=np.uint64)[0]
    with np.errstate(over="ignore"):  # the mixing is arithmetic modulo 2**64
        z = np.asarray(indices, dtype=np.uint64) * _GOLDEN ^ key
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def uniform_choice(u: float, n: int) -> int:
    """The integer in [0, n) that the uniform draw u picks (u * n, rounded down, kept below n)."""
    return min(int(u * n), n - 1)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    set_torch_rng_state((state["torch"], state.get("cuda")))


def set_cuda_rng_states(states) -> None:
    """Restore the saved CUDA generators onto the GPUs that exist now, device i from saved state i, as many as
    both have (one log line when the counts differ; extra devices keep the seed's state)."""
    states = list(states)
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    restored = min(len(states), present)
    if len(states) != present:
        logger.info("resume: the checkpoint holds the CUDA random state of %d GPU(s), this machine has %d; "
                    "restoring %d", len(states), present, restored)
    for index in range(restored):
        torch.cuda.set_rng_state(states[index], index)


@contextlib.contextmanager
def replay_rng() -> Iterator[None]:
    """The torch generators' state restored on exit: a second run of the block draws the same (dropout masks)."""
    state = torch_rng_state()
    try:
        yield
    finally:
        set_torch_rng_state(state)


def torch_rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The torch generators that dropout draws from (CPU and every CUDA device)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_torch_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        set_cuda_rng_states(cuda)
