"""Several processes (torchrun, accelerate launch): process group, batch shards, gathered negatives, DDP. The
launchers start the processes; this module reads their environment (docs/design.md, "Several processes").
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mirrorbert.errors import UserError, first_line
from mirrorbert.runtime.device import resolve_device
from mirrorbert.runtime.randomness import derived_generator

logger = logging.getLogger(__name__)

# Seconds a collective waits for the other processes before the job fails (a process died).
TIMEOUT_ENV = "MIRRORBERT_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600
# Random stream for per-step, per-rank dropout seeds (mirror/step.py uses 1 and 2).
STREAM_DROPOUT = 3

T = TypeVar("T")


def launch_environment() -> tuple[int, int]:
    """(WORLD_SIZE, RANK) as torchrun and accelerate set them, checked with LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT: a half-set environment is one UserError line before any work."""
    def number(name: str, default: int) -> int:
        text = os.environ.get(name, "").strip()
        if not text:
            return default
        if not text.isdigit():
            raise UserError(f"environment variable {name}={text[:40]!r} is not a whole number >= 0 (torchrun and "
                            f"accelerate set it; unset it to run one process)")
        return int(text)

    world, rank = number("WORLD_SIZE", 1), number("RANK", 0)
    number("LOCAL_RANK", 0)
    if world < 1 or rank >= max(world, 1):
        raise UserError(f"environment variables WORLD_SIZE={world} and RANK={rank}: RANK must be below WORLD_SIZE "
                        f"(torchrun and accelerate set both; unset them to run one process)")
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
        if missing:
            raise UserError(f"environment variable WORLD_SIZE={world} asks for {world} processes, but "
                            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set (where they "
                            f"meet): start the command with torchrun or accelerate launch, which set them all, or "
                            f"unset WORLD_SIZE and RANK to run one process")
        number("MASTER_PORT", 0)
    return world, rank


@dataclass
class DistContext:
    """Where this process stands in the job; a single process is world_size 1 and every helper is a no-op."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard_sizes(self, n: int) -> list[int]:
        """Sizes of the contiguous shards of n items: the first n % W processes take one more."""
        base, extra = divmod(n, self.world_size)
        return [base + (1 if r < extra else 0) for r in range(self.world_size)]

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's contiguous part of a global batch; an empty part gets the batch's first item as a
        stand-in for the forward and backward DDP waits for (`gather_views` drops it)."""
        sizes = self.shard_sizes(len(items))
        start = sum(sizes[: self.rank])
        return list(items[start:start + sizes[self.rank]]) or list(items[:1])

    def gather_views(self, local: torch.Tensor, n_strings: int) -> torch.Tensor:
        """All-gather the local rows [x.., xbar..] into the global [x_1..x_B, xbar_1..xbar_B], in the global
        batch's order (so the loss's labels i <-> i+B hold); this process's own rows keep their gradient,
        scaled by W (DDP averages), the others carry none."""
        if not self.enabled:
            return local
        sizes = self.shard_sizes(n_strings)
        width = max(sizes)
        own = sizes[self.rank]
        if local.shape[0] != 2 * max(own, 1):
            raise ValueError(f"rank {self.rank}: expected {2 * max(own, 1)} local rows, got {local.shape[0]}")
        half = local.shape[0] // 2
        padded = torch.cat([_pad_rows(local[:own], width), _pad_rows(local[half:half + own], width)])
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.detach().contiguous())
        parts[self.rank] = _ScaleGrad.apply(padded, float(self.world_size))  # own rows carry the gradient
        firsts = [part[:size] for part, size in zip(parts, sizes)]
        seconds = [part[width:width + size] for part, size in zip(parts, sizes)]
        gathered = torch.cat(firsts + seconds)
        if own == 0:  # a stand-in row: zero gradient, but DDP sees every parameter take part
            gathered = gathered + 0.0 * local.sum()
        return gathered

    def agree(self, code: int) -> int:
        """The largest of every process's `code` (one all-reduce): the engine's stop agreement at a step."""
        if not self.enabled:
            return int(code)
        value = torch.tensor([int(code)], device=self._collective_device())
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def on_main(self, work: Callable[[], T], others: T) -> T:
        """Run `work` (writing files) on rank 0 only; the others wait and get `others`, or a UserError at once
        when rank 0 failed."""
        if not self.enabled:
            return work()
        outcome: list[Any] = [("ok", None)]
        result = others
        if self.is_main:
            try:
                result = work()
            except BaseException as exc:
                outcome[0] = ("error", f"{type(exc).__name__}: {exc}")
                dist.broadcast_object_list(outcome, src=0)
                raise
        dist.broadcast_object_list(outcome, src=0)
        status, message = outcome[0]
        if status != "ok":
            raise UserError(f"rank {self.rank}: rank 0 failed ({message}); stopping")
        return result

    def seed_step(self, seed: int, step: int) -> None:
        """Under several processes, seed torch from (seed, step, rank): each its own dropout masks, on resume too."""
        if self.enabled:
            torch.manual_seed(derived_generator(seed, STREAM_DROPOUT, step, self.rank).initial_seed())

    def wrap(self, encoder: torch.nn.Module) -> None:
        """Put the encoder's inner Hugging Face model under DDP in place (`Encoder.embed` goes through it)."""
        if not self.enabled or isinstance(encoder.model, _ModelDDP):
            return
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # The buffers (position ids) are constants, so they need no broadcast each forward.
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_OPTIONS
                          else {"broadcast_buffers": False})
        encoder.model = _ModelDDP(encoder.model, device_ids=device_ids, **no_buffer_sync)

    @staticmethod
    def unwrap(encoder: torch.nn.Module) -> None:
        if isinstance(encoder.model, _ModelDDP):
            encoder.model = encoder.model.module

    @contextlib.contextmanager
    def failure_guard(self, last_checkpoint: Callable[[], Any], interrupt: Any = None) -> Iterator[None]:
        """A collective that fails (a peer gone, MIRRORBERT_DIST_TIMEOUT expired) ends this process with one
        UserError line naming the last good checkpoint and any signal the engine's `interrupt` flag caught;
        without `interrupt`, a SIGTERM raises here at once. A single process is left untouched."""
        if not self.enabled:
            yield
            return

        def on_terminate(signum, frame):
            raise _LauncherStop()

        previous = None
        if interrupt is None:
            try:
                previous = signal.signal(signal.SIGTERM, on_terminate)
            except ValueError:  # not the main thread
                previous = None
        try:
            yield
        except (_LauncherStop, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and not _is_collective_failure(exc):
                raise
            where = last_checkpoint()
            where = f"last good checkpoint: {where}" if where else "no checkpoint was written (use --save-every N)"
            if isinstance(exc, _LauncherStop):
                why = "stopped by the launcher (another process failed or the job was cancelled)"
            else:
                why = f"another process of the job failed or timed out ({first_line(exc)[:200]})"
                if interrupt is not None and interrupt.raised:
                    name = signal.Signals(interrupt.signal).name if interrupt.signal else "a signal"
                    why = f"{name} received, but the processes could not agree to stop: {why}"
            raise UserError(f"rank {self.rank}: {why}; {where}") from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _collective_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")


_DDP_OPTIONS = set(inspect.signature(DistributedDataParallel.__init__).parameters)


class _ModelDDP(DistributedDataParallel):
    """DDP that still looks like the wrapped model (config, save_pretrained, state_dict keys without `module.`)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.module.load_state_dict(*args, **kwargs)


def _pad_rows(rows: torch.Tensor, width: int) -> torch.Tensor:
    if rows.shape[0] == width:
        return rows
    return torch.cat([rows, rows.new_zeros((width - rows.shape[0], *rows.shape[1:]))])


class _LauncherStop(Exception):
    """SIGTERM under `failure_guard` without the engine's flag (a caller outside the training loop)."""


# Words in the errors of failed collectives (gloo, NCCL, the store, DDP's backward all-reduce).
_COLLECTIVE_FAILURE_MARKERS = ("gloo", "nccl", "connection closed", "connection reset", "timed out", "timeout",
                               "process group", "broken pipe")


def _is_collective_failure(exc: BaseException) -> bool:
    return isinstance(exc, dist.DistError) or any(m in str(exc).lower() for m in _COLLECTIVE_FAILURE_MARKERS)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by a constant (undoes DDP's 1/W)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def _device_for(name: str | None, local_rank: int) -> torch.device:
    """One device per local rank: `auto`/`cuda` become cuda:<local rank>; MPS is not used by several processes."""
    if name in (None, "", "auto"):
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type == "mps":
        raise UserError("--device mps cannot be shared by several processes; use --device cpu under torchrun")
    return device


def timeout_seconds() -> int:
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise UserError(f"{TIMEOUT_ENV}={raw!r}: expected a whole number of seconds") from None
    if value < 1:
        raise UserError(f"{TIMEOUT_ENV}={raw!r}: must be >= 1")
    return value


def init_from_env(device: str | None = "auto") -> DistContext:
    """The context of this process: a single process on `device` when started directly; otherwise a member of
    the launcher's process group (NCCL on GPUs, gloo on CPU), mirrorbert's logging quiet on ranks other than 0."""
    if not dist.is_initialized() and launch_environment()[0] <= 1:
        return DistContext(device=resolve_device(device))
    target = _device_for(device, int(os.environ.get("LOCAL_RANK", "0") or 0))
    if not dist.is_initialized():
        if target.type == "cuda":
            torch.cuda.set_device(target)
        backend = "nccl" if target.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_seconds()))
    ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=target)
    if not ctx.is_main:
        logging.getLogger("mirrorbert").setLevel(logging.ERROR)
    logger.info("distributed: %d processes (%s backend), rank 0 on %s", ctx.world_size, dist.get_backend(), target)
    return ctx


def shutdown(synchronize: bool = False) -> None:
    """Leave the process group, if any; with `synchronize` (a command that finished normally) after a barrier."""
    if dist.is_available() and dist.is_initialized():
        if synchronize:
            try:
                dist.barrier()
            except Exception as exc:  # noqa: BLE001  a peer already gone: leave anyway
                logger.warning("distributed: no barrier before leaving the process group (%s)", exc)
        dist.destroy_process_group()


_ENCODING: DistContext | None = None


@contextlib.contextmanager
def sharded_encoding(ctx: DistContext) -> Iterator[None]:
    """Within this block `Encoder.encode` splits its inputs across the processes and returns all rows (a
    collective: every process must encode the same texts)."""
    global _ENCODING
    previous, _ENCODING = _ENCODING, (ctx if ctx.enabled else None)
    try:
        yield
    finally:
        _ENCODING = previous


def encoding_rows(n: int) -> list[int]:
    """The input rows this process encodes: all, or its strided share (r, r+W, ...) while sharded encoding is on."""
    if _ENCODING is None:
        return list(range(n))
    return list(range(_ENCODING.rank, n, _ENCODING.world_size))


def combine_rows(local: torch.Tensor, n: int) -> torch.Tensor:
    """Every process's `encoding_rows` results gathered back into one [n, d] matrix in input order."""
    ctx = _ENCODING
    if ctx is None:
        return local
    width = -(-n // ctx.world_size)
    device = ctx._collective_device()
    padded = _pad_rows(local.to(device), width).contiguous()
    parts = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(parts, padded)
    out = local.new_empty((n, *local.shape[1:]))
    for rank, part in enumerate(parts):
        rows = range(rank, n, ctx.world_size)
        out[list(rows)] = part[: len(rows)].to(out.device)
    return out
