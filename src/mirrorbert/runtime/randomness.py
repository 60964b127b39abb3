"""Seeds and random-number state: seeding, derived generators, capture/restore for resume and replay."""

from __future__ import annotations

import contextlib
import logging
import random
from typing import Any, Iterator

import numpy as np
import torch

logger = logging.getLogger(__name__)


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
    if state.get("cuda") is not None:
        set_cuda_rng_states(state["cuda"])


def set_cuda_rng_states(states) -> None:
    """Restore the saved CUDA generators onto the GPUs that exist now, device i from saved state i.

    A checkpoint written on 8 GPUs and resumed on 2 (or on a CPU-only machine) holds states for devices
    that are not there: `torch.cuda.set_rng_state_all` would index past the last device. Only the first
    min(saved, present) are restored; when the counts differ one log line says so (on more GPUs than
    saved, the extra devices keep the seed's state).
    """
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
        set_cuda_rng_states(cuda)
