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
    if precision != "fp32" and device.type != "cuda" and not autocast_supported(device, precision):
        raise UserError(f"--precision {precision}: this torch has no {precision} autocast on {device.type}; use fp32")


def autocast_supported(device: torch.device, precision: str) -> bool:
    """Whether torch's autocast runs in `precision` on `device` (some releases switch it off with a warning)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with autocast(device, precision):
                return torch.is_autocast_enabled(device.type)
        except (RuntimeError, TypeError):
            return False


def check_device_and_precision(device: str | None, precision: str | None = None) -> torch.device:
    """Both options checked where a command starts, before anything is read or loaded."""
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


# CPU flags in /proc/cpuinfo (x86 `flags`, ARM `Features`) meaning native bf16 / fp16 matmuls.
CPU_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}
CPU_FP16_FLAGS = {"avx512_fp16", "amx_fp16", "asimdhp"}
_warned_slow: set[str] = set()


def _cpu_flags(cpuinfo: str | None) -> set[str]:
    """The CPU's feature flags, from `cpuinfo` (the text of /proc/cpuinfo, read when not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:  # not Linux
            return set()
    return {flag for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))
            for flag in line.split(":", 1)[-1].split()}


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU multiplies bf16 natively (AVX512-BF16 or AMX on x86, `bf16` on ARM)."""
    return bool(_cpu_flags(cpuinfo) & CPU_BF16_FLAGS)


def cpu_has_native_fp16(cpuinfo: str | None = None) -> bool:
    """True when the CPU multiplies fp16 natively (AVX512-FP16 or AMX-FP16 on x86, `asimdhp` on ARM)."""
    return bool(_cpu_flags(cpuinfo) & CPU_FP16_FLAGS)


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
    """Turn `auto` into bf16 where bf16 is native, fp16 on other CUDA GPUs, fp32 elsewhere, and check an
    explicit choice; bf16 or fp16 on a CPU without it runs, with one warning giving the slowdown measured now."""
    if precision == "auto":
        if device_has_native_bf16(device):
            chosen = "bf16"
        elif device.type == "cuda":
            chosen = "fp16"
        else:
            chosen = "fp32"
        logger.info("--precision auto: %s on %s", chosen, device)
        return chosen
    check_precision(precision, device)
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        _warn_slow(precision, torch.bfloat16, "AVX512-BF16/AMX")
    if precision == "fp16" and device.type == "cpu" and not cpu_has_native_fp16():
        _warn_slow(precision, torch.float16, "AVX512-FP16/AMX-FP16")
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


def _warn_slow(precision: str, dtype: torch.dtype, native: str) -> None:
    if precision in _warned_slow:
        return
    _warned_slow.add(precision)
    slowdown = matmul_slowdown(dtype)
    logger.warning("--precision %s: this CPU has no native %s (no %s); a 256x256 %s matmul just ran %.1fx slower "
                   "than fp32 here. Use --precision fp32 (or auto).", precision, precision, native, precision, slowdown)


@contextlib.contextmanager
def set_threads(threads: int | None) -> Iterator[None]:
    """Use N CPU threads inside the block (None: leave torch's choice) and restore the previous count."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def tf32_matmuls(device: torch.device) -> Iterator[bool]:
    """TF32 fp32 matmuls inside the block on Ampere and newer GPUs (yields whether), the previous ones after."""
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
    """torch.compile the module in place (state-dict keys unchanged) and run `warm_up()`, which compiles it; if
    compiling fails the module goes back to eager with one warning. Returns whether compilation is active."""
    import time

    start = time.perf_counter()
    try:
        model.compile()
        if warm_up is not None:
            warm_up()
    except Exception as exc:  # inductor/dynamo raise many types; any of them means "run eager"
        model._compiled_call_impl = None  # undo nn.Module.compile
        logger.warning("--compile: torch.compile failed (%s: %s); continuing without it", type(exc).__name__,
                       first_line(exc)[:200])
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
