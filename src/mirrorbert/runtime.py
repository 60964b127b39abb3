"""Training machinery shared by every trainer (Mirror-BERT, MLM pre-training, GR-BERT).

Device and precision selection, seeding, atomic output folders, checkpoints with full optimiser,
scheduler and RNG state (so a resumed run continues bit-for-bit), and metric logging. Kept free of
anything method-specific so the three trainers share one copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from mirrorbert.checkpoints import (
    CHECKPOINT_META,
    TRAINING_STATE,
    CheckpointDamaged,
    default_checkpoint_dir,  # lives there (torch-free) so that option checks need no torch
    fsync_path,
    is_named_checkpoint,
    newest_intact,
    remove_stale_temps,
    step_folders,
    verify_checkpoint,
    write_manifest,
)
from mirrorbert.errors import UserError, first_line
from mirrorbert.safety import (  # noqa: F401 - the output-path helpers live in the write policy (re-exported)
    MARKER, atomic_output_dir, check_output_dir, fix_folder_mode, mark_folder, write_json_atomic,
)

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")


# --------------------------------------------------------------------------- device / precision
def resolve_device(name: str | None = None) -> torch.device:
    """`auto`/None picks CUDA, then Apple MPS, then CPU, as users expect from sentence-transformers."""
    if name in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"--device: unknown device {name!r} ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine")
    return device


def check_precision(precision: str, device: torch.device) -> None:
    if precision not in PRECISIONS:
        raise UserError(f"--precision: unknown value {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise UserError(f"--precision fp16 needs a CUDA GPU (device is {device.type}); use bf16 or fp32")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; fp32 is a no-op context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(device: torch.device, precision: str):
    """fp16 needs loss scaling to avoid underflow; bf16 and fp32 do not."""
    if precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None


# --------------------------------------------------------------------------- hardware defaults (issue 9)
# Precision `auto`, native-bf16 detection, threads, TF32, torch.compile and peak memory: one copy for
# the three trainers so that a plain command is right by default on every machine.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 flags in /proc/cpuinfo meaning native bf16 matmuls
_warned_slow_bf16 = False


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU multiplies bf16 natively (AVX512-BF16 or AMX on x86, the `bf16` flag on ARM).

    Without it PyTorch emulates bf16 matmuls, which is many times slower than fp32. `cpuinfo` is the
    text of /proc/cpuinfo (read when not given). torch.backends.cpu.get_cpu_capability() only says
    "AVX512", which does not imply the BF16 extension, hence the flags.
    """
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:  # not Linux: macOS arm64 (M2+) has bf16, but autocast there is not worth guessing
            return False
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[-1].split())
    return any(flag in flags for flag in CPU_BF16_FLAGS) or "bf16" in flags


def device_has_native_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch without the argument
            return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """Turn `auto` into fp32/bf16/fp16 for this device and validate an explicit choice.

    auto: bf16 autocast where bf16 is native (Ampere+ GPUs, CPUs with AVX512-BF16/AMX); fp16 with loss
    scaling on older GPUs (their tensor cores run fp16 several times faster than fp32, as the paper's
    2080 Ti runs did); fp32 elsewhere (CPUs without native bf16, MPS). An explicit bf16 on a CPU
    without native bf16 runs, with one warning giving the slowdown measured right now.
    """
    if precision == "auto":
        if device_has_native_bf16(device):
            chosen = "bf16"
        elif device.type == "cuda":
            chosen = "fp16"
        else:
            chosen = "fp32"
        logger.info("--precision auto: %s on %s", chosen, device)
        return chosen
    if precision not in PRECISIONS:
        raise UserError(f"--precision: unknown value {precision!r}; choose one of auto, {', '.join(PRECISIONS)}")
    check_precision(precision, device)
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        _warn_slow_bf16()
    return precision


def matmul_slowdown(dtype: torch.dtype = torch.bfloat16, size: int = 256, repeats: int = 5) -> float:
    """How many times slower a size x size matmul runs in `dtype` than in fp32 on this CPU (best of N)."""
    import time

    def best(dt: torch.dtype) -> float:
        a = torch.randn(size, size).to(dt)
        b = torch.randn(size, size).to(dt)
        a @ b  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best(dtype) / max(best(torch.float32), 1e-9)


def _warn_slow_bf16() -> None:
    global _warned_slow_bf16
    if _warned_slow_bf16:
        return
    _warned_slow_bf16 = True
    slowdown = matmul_slowdown()
    logger.warning("--precision bf16: this CPU has no native bf16 (no AVX512-BF16/AMX); a 256x256 bf16 matmul "
                   "just ran %.1fx slower than fp32 here. Use --precision fp32 (or auto).", slowdown)


@contextlib.contextmanager
def set_threads(threads: int | None) -> Iterator[None]:
    """Use N CPU threads inside the block (None: leave torch's choice) and restore the previous count.

    On a CPU shared with other jobs, fewer threads than cores avoids OpenMP spin-wait contention.
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def enable_tf32(device: torch.device) -> bool:
    """TF32 fp32 matmuls on Ampere and newer (about 8x the fp32 rate, ~1e-3 relative error, as HF/Lightning do)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        return False
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward; non-reentrant checkpointing replays the RNG, so dropout is exact."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5 name
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"--gradient-checkpointing is not supported by {type(model).__name__}")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def compile_model(model: torch.nn.Module, warm_up=None) -> bool:
    """torch.compile the module in place (state-dict keys unchanged, so saving is unaffected).

    Compilation happens lazily on the first call, so `warm_up()` (e.g. one forward and backward on a
    small batch) is run here: if compiling fails (no C++ compiler, unsupported op), the module goes back
    to eager with one warning instead of failing mid-training. Returns whether compilation is active.
    """
    import time

    start = time.perf_counter()
    try:
        model.compile()
        if warm_up is not None:
            warm_up()
    except Exception as exc:  # inductor/dynamo raise many types; any of them means "run eager"
        model._compiled_call_impl = None  # undo nn.Module.compile
        first = first_line(exc)
        logger.warning("--compile: torch.compile failed (%s: %s); continuing without it", type(exc).__name__, first[:200])
        return False
    logger.info("--compile: model compiled; warm-up took %.1f s", time.perf_counter() - start)
    return True


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process so far: CUDA max_memory_allocated on a GPU, else the peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


# --------------------------------------------------------------------------- seeding
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


# --------------------------------------------------------------------------- checkpoints
@dataclass
class Checkpoint:
    """What a resumed run needs besides the model weights (which live in `path/model`)."""

    path: Path
    step: int
    meta: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


class CheckpointManager:
    """Writes `root/step-N/{model/, training_state.pt, checkpoint.json}` atomically and keeps the newest few."""

    def __init__(self, root: str | Path, keep: int = 2):
        self.root = Path(root)
        self.keep = keep

    def save(
        self,
        step: int,
        save_model,
        optimizer: torch.optim.Optimizer,
        scheduler=None,
        scaler=None,
        meta: dict[str, Any] | None = None,
        extra_state: dict[str, Any] | None = None,
    ) -> Path:
        """`save_model(folder)` writes the weights (and tokenizer); the rest is pickled state."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / MARKER).exists():
            mark_folder(self.root)
        remove_stale_temps(self.root)
        final = self.root / f"step-{step}"
        tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}.tmp-", dir=self.root))
        try:
            save_model(tmp / "model")
            state = {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rng_state(),
                "extra": extra_state or {},
            }
            torch.save(state, tmp / TRAINING_STATE)
            write_json_atomic(tmp / CHECKPOINT_META, {"step": step, **(meta or {})})
            write_manifest(tmp)  # sizes and SHA-256 of every file, fsynced, written last
            fix_folder_mode(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(self.root)
        self._prune(step)
        logger.info("checkpoint written: %s", final)
        return final

    def _prune(self, current: int) -> None:
        """Keep the newest `keep` checkpoints up to `current`; newer ones (a damaged future) are left alone."""
        steps = sorted(s for s in self.all_steps() if s <= current)
        for step in steps[: max(0, len(steps) - self.keep)]:
            shutil.rmtree(self.root / f"step-{step}", ignore_errors=True)

    def all_steps(self) -> list[int]:
        return [step for step, _ in step_folders(self.root)]

    def latest(self) -> Checkpoint | None:
        """The newest intact checkpoint; damaged or incomplete newer ones are skipped with a warning each.

        Stale temporary folders are only removed by `save` and `checkpoints.check_checkpoint_root`, which
        run under the folder's lock: a root read here may belong to a run still writing.
        """
        found = newest_intact(self.root)
        if found is None:
            return None
        folder, meta = found
        return Checkpoint(path=folder, step=int(meta["step"]), meta=meta)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Accept either one `step-N` folder (verified, one line naming a bad file) or a checkpoint root."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"--resume {path}: no such checkpoint folder")
    if not is_named_checkpoint(path):
        latest = CheckpointManager(path).latest()
        if latest is None:
            raise UserError(f"--resume {path}: no intact checkpoint found (expected step-N folders with "
                            f"{CHECKPOINT_META})")
        return latest
    try:
        meta = verify_checkpoint(path)
    except CheckpointDamaged as exc:
        raise UserError(f"--resume {path}: {exc}") from None
    return Checkpoint(path=path, step=int(meta["step"]), meta=meta)


def restore_training_state(ckpt: Checkpoint, optimizer, scheduler=None, scaler=None) -> dict[str, Any]:
    """Load optimiser/scheduler/scaler/RNG state; returns the trainer's extra state (epoch, batch...)."""
    try:
        state = torch.load(ckpt.path / TRAINING_STATE, map_location="cpu", weights_only=False)
    except Exception as exc:  # verified by the manifest, so only an unverifiable legacy file gets here
        raise UserError(f"--resume {ckpt.path}: {ckpt.path / TRAINING_STATE} cannot be read ({exc})") from None
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    return state.get("extra", {})


# --------------------------------------------------------------------------- optimiser / schedule
def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with the usual BERT convention: no weight decay on biases and LayerNorm weights.

    Fused (one kernel over all parameters) wherever this torch has the fused AdamW for the parameters'
    device and dtype (CUDA, CPU since torch 2.4, MPS); the same update as the per-parameter loop up to
    float rounding. Elsewhere torch's own default.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device/dtype, or an old torch
        return torch.optim.AdamW(groups, lr=lr)


def build_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int):
    """`constant` (the Mirror-BERT paper), `constant-warmup`, or `linear` (warmup then linear decay to 0)."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "linear":
            remaining = max(0, total_steps - step)
            return remaining / max(1, total_steps - warmup_steps)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def check_finite_loss(loss: torch.Tensor, step: int, last_checkpoint: Path | None) -> None:
    """Stop on a NaN/inf loss before it reaches the weights, naming the last good checkpoint."""
    if torch.isfinite(loss):
        return
    where = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else \
        "no checkpoint was written (use --save-every N)"
    raise UserError(f"loss is {loss.item()} at step {step}: training stopped; {where}")


def backward_and_step(loss: torch.Tensor, optimizer, scheduler=None, scaler=None, parameters=None,
                      max_grad_norm: float | None = None, accumulation: int = 1, update: bool = True) -> None:
    """Backward pass and (when `update`) one optimiser step, with fp16 loss scaling and clipping.

    With gradient accumulation, call it for every micro-batch with `accumulation` = the number of
    micro-batches and `update=True` only on the last one; the loss is divided here.
    """
    if accumulation > 1:
        loss = loss / accumulation
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if not update:
        return
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm:
        params = parameters if parameters is not None else [p for g in optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- interruption / logging
class InterruptFlag:
    """Turns Ctrl-C and SIGTERM (how job schedulers preempt) into a flag the training loop checks
    between steps, so it can checkpoint and exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.raised = False
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        def handler(signum, frame):
            if self.raised:  # a second signal aborts at once
                raise KeyboardInterrupt
            self.raised, self.signal = True, signum
            logger.warning("%s received: finishing this step, writing a checkpoint, then stopping",
                           signal.Signals(signum).name)

        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not in the main thread: leave default behaviour
                pass
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
        return False


class MetricLogger:
    """Optional TensorBoard scalars; a no-op when no log dir is given."""

    def __init__(self, log_dir: str | Path | None):
        self.writer = None
        if log_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UserError("--log-dir needs TensorBoard: pip install 'mirrorbert[tensorboard]'") from None
            self.writer = SummaryWriter(str(log_dir))

    def log(self, step: int, **scalars: float) -> None:
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def library_versions() -> dict[str, str]:
    import platform

    import transformers

    from mirrorbert import __version__

    versions = {"mirrorbert": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    versions["python"] = platform.python_version()
    try:
        import tokenizers

        versions["tokenizers"] = tokenizers.__version__
    except ImportError:
        pass
    return versions
