"""Seeds and random-number state: seeding, derived generators, capture/restore for resume and replay."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def worker_init_fn(worker_id: int) -> None:
    """Give each DataLoader worker its own reproducible seed derived from the torch base seed."""
    seed = (torch.initial_seed() + worker_id) % (2**32)
    random.seed(seed)
    np.random.seed(seed)


def derived_generator(seed: int, *stream: int) -> torch.Generator:
    """An independent torch generator for one purpose (e.g. masking in epoch 3), reproducible from the seed."""
    mixed = np.random.SeedSequence([seed, *stream]).generate_state(1, dtype=np.uint64)[0]
    gen = torch.Generator()
    gen.manual_seed(int(mixed) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


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
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def replay_rng() -> Iterator[None]:
    """Run a block twice with identical random draws: the state is captured on entry and restored on exit.

    Used for controlled dropout, where the second view must see exactly the dropout masks of the first.
    """
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
        torch.cuda.set_rng_state_all(cuda)
