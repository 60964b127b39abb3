"""Precision `auto`, native-bf16 detection, the slow-bf16 warning, threads, TF32, compile fallback, memory."""

import logging

import pytest
import torch

from mirrorbert.runtime import device as runtime
from mirrorbert.cli.app import build_parser
from mirrorbert.mirror.config import TrainConfig, resolve_config
from mirrorbert.errors import UserError
from mirrorbert.runtime.device import compile_model, cpu_has_native_bf16, matmul_slowdown, peak_memory_bytes, resolve_precision, set_threads, tf32_matmuls

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_flags_detection():
    assert not cpu_has_native_bf16(AVX2_ONLY)  # AVX512 alone is not bf16
    assert cpu_has_native_bf16(SAPPHIRE)
    assert cpu_has_native_bf16(ARM_BF16)
    assert cpu_has_native_bf16("flags : avx2 avx512_bf16\n")
    assert isinstance(cpu_has_native_bf16(), bool)  # this machine, whatever it is


@pytest.mark.parametrize("native, device, expected", [
    (False, CPU, "fp32"), (True, CPU, "bf16"), (True, CUDA, "bf16"), (False, CUDA, "fp16"), (False, MPS, "fp32"),
])
def test_auto_precision(monkeypatch, native, device, expected):
    monkeypatch.setattr(runtime, "device_has_native_bf16", lambda d: native)
    assert resolve_precision("auto", device) == expected


def test_auto_uses_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", CPU) == "fp32"
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", CPU) == "bf16"


def test_explicit_choices_are_kept_and_checked(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("fp32", CPU) == "fp32"
    assert resolve_precision("bf16", CPU) == "bf16"
    monkeypatch.setattr(runtime, "cpu_has_native_fp16", lambda: True)
    assert resolve_precision("fp16", CPU) == "fp16"  # torch's CPU autocast, with the same loss scaler
    monkeypatch.setattr(runtime, "autocast_supported", lambda device, precision: False)
    with pytest.raises(UserError, match="no fp16 autocast on cpu; use fp32"):
        resolve_precision("fp16", CPU)
    with pytest.raises(UserError, match="unknown value 'fp8'"):
        resolve_precision("fp8", CPU)
    with pytest.raises(UserError, match="unknown value 'auto'"):  # autocast() needs a resolved precision
        runtime.check_precision("auto", CPU)


def test_bf16_on_a_cpu_without_it_warns_once_with_the_measured_slowdown(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(runtime, "_warned_slow", set())
    measured = []

    def fake_slowdown(dtype=torch.bfloat16):
        measured.append(37.25)
        return 37.25

    monkeypatch.setattr(runtime, "matmul_slowdown", fake_slowdown)
    with caplog.at_level(logging.WARNING, logger="mirrorbert.runtime.device"):
        assert resolve_precision("bf16", CPU) == "bf16"
        assert resolve_precision("bf16", CPU) == "bf16"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(measured) == 1
    assert "37.2x slower than fp32" in warnings[0].getMessage()


def test_matmul_slowdown_is_measured():
    ratio = matmul_slowdown(torch.bfloat16, size=64, repeats=2)
    assert ratio > 0 and ratio == ratio


def test_fp16_on_a_cpu_without_it_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "cpu_has_native_fp16", lambda: False)
    monkeypatch.setattr(runtime, "_warned_slow", set())
    monkeypatch.setattr(runtime, "matmul_slowdown", lambda dtype=torch.float16: 12.5)
    with caplog.at_level(logging.WARNING, logger="mirrorbert.runtime.device"):
        assert resolve_precision("fp16", CPU) == "fp16"
        assert resolve_precision("fp16", CPU) == "fp16"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no native fp16" in warnings[0] and "12.5x" in warnings[0]


def test_the_cpu_flags_that_mean_native_fp16():
    assert runtime.cpu_has_native_fp16("flags\t: fpu avx2 avx512_fp16\n")
    assert runtime.cpu_has_native_fp16("flags\t: fpu amx_fp16\n")
    assert not runtime.cpu_has_native_fp16("flags\t: fpu avx2 avx512_bf16 amx_bf16\n")


def test_train_defaults_to_auto_and_takes_the_new_options():
    assert TrainConfig().precision == "auto"
    args = build_parser().parse_args(["train", "--threads", "1", "--compile", "--gradient-checkpointing",
                                      "--grad-cache-chunk", "50", "--precision", "auto"])
    cfg = resolve_config({k: getattr(args, k, None) for k in TrainConfig.__dataclass_fields__})
    assert (cfg.threads, cfg.compile, cfg.gradient_checkpointing, cfg.grad_cache_chunk) == (1, True, True, 50)
    with pytest.raises(UserError, match="threads"):
        resolve_config({"threads": 0})
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for option in ("--threads", "--compile", "--gradient-checkpointing", "--grad-cache-chunk", "auto"):
        assert option in help_text


def test_set_threads_restores_the_previous_count():
    before = torch.get_num_threads()
    with set_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with set_threads(None):
        assert torch.get_num_threads() == before


def test_tf32_only_on_cuda():
    before = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    with tf32_matmuls(CPU) as on:
        assert on is False
        assert (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32) == before


def test_peak_memory_is_at_least_a_live_tensor():
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert peak_memory_bytes(CPU) >= block.numel() * 4


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


def test_compile_falls_back_to_eager_with_one_warning(caplog):
    model = _Tiny()
    x = torch.randn(2, 4)
    expected = model(x)

    def failing_warm_up():
        raise RuntimeError("no C++ compiler\nmore detail")

    # what nn.Module.compile does, without importing dynamo (18 s here)
    model.compile = lambda: setattr(model, "_compiled_call_impl", lambda *a, **k: None)

    with caplog.at_level(logging.WARNING, logger="mirrorbert.runtime.device"):
        assert compile_model(model, warm_up=failing_warm_up) is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0] and "more detail" not in warnings[0]
    assert model._compiled_call_impl is None
    assert torch.equal(model(x), expected)
    assert list(model.state_dict()) == ["linear.weight", "linear.bias"]
