"""Device and precision: `auto` choices, autocast, loss scaling, threads, TF32, compile, peak memory."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

import torch

from mirrorbert.errors import UserError, first_line

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")


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


def check_device_and_precision(device: str | None, precision: str | None = None) -> torch.device:
    """Both options checked where a command starts, before anything is read or loaded (`--device gpu9` used
    to fail only when the model was moved there)."""
    resolved = resolve_device(device)
    if precision not in (None, "auto"):
        check_precision(precision, resolved)
    return resolved


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; fp32 is a no-op context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(device: torch.device, precision: str):
    """fp16 needs loss scaling to avoid underflow; bf16 and fp32 do not (None: no scaler)."""
    if precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None


# --------------------------------------------------------------------------- hardware defaults
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


@contextlib.contextmanager
def tf32_matmuls(device: torch.device) -> Iterator[bool]:
    """TF32 fp32 matmuls inside the block on Ampere and newer (about 8x the fp32 rate, ~1e-3 relative error,
    as HF/Lightning do); the previous settings come back on exit, so a caller's later fp32 work (its own
    evaluation, a test's tolerances) is not silently run in TF32. Yields whether TF32 was switched on.
    """
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        yield False
        return
    previous = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield True
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cuda.matmul.allow_tf32 = previous[1]
        torch.backends.cudnn.allow_tf32 = previous[2]


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
