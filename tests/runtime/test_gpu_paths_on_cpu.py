"""GPU code paths checked on a CPU: fake device counts, a mocked CUDA RNG and capability, fp16
autocast with a GradScaler on the CPU, and a model on a device the example inputs must follow."""

from __future__ import annotations

import copy
import logging
import random

import numpy as np
import pytest
import torch

from mirrorbert.runtime import device as runtime
from mirrorbert.runtime import randomness

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


# ------------------------------------------------------------------------------------------ RNG restore
@pytest.fixture
def fake_gpus(monkeypatch):
    """`count` CUDA devices that exist only as recorded set_rng_state calls."""
    calls: list[tuple[int, int]] = []

    def install(count: int):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": calls.append(
            (int(state[0]), device)))

        def refuse_all(states):  # indexes past the last device on a smaller machine: must not be used
            raise AssertionError("set_rng_state_all restores every saved device")

        monkeypatch.setattr(torch.cuda, "set_rng_state_all", refuse_all)
        return calls

    return install


def _saved_state(gpus: int) -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    state["cuda"] = [torch.full((8,), 10 + i, dtype=torch.uint8) for i in range(gpus)]
    return state


def test_resume_on_fewer_gpus_restores_only_the_gpus_that_exist(fake_gpus, caplog):
    calls = fake_gpus(2)
    with caplog.at_level(logging.INFO, logger="mirrorbert.runtime.randomness"):
        randomness.set_rng_state(_saved_state(4))  # written on 4 GPUs
    assert calls == [(10, 0), (11, 1)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "4 GPU(s), this machine has 2; restoring 2" in lines[0]


def test_resume_on_more_gpus_and_on_a_cpu_machine(fake_gpus, caplog):
    calls = fake_gpus(4)
    randomness.set_rng_state(_saved_state(2))
    assert calls == [(10, 0), (11, 1)]
    calls.clear()
    fake_gpus(0)
    randomness.set_rng_state(_saved_state(2))  # CPU-only resume of a GPU checkpoint: CPU state only
    assert calls == []


def test_same_gpu_count_restores_all_without_a_line(fake_gpus, caplog):
    calls = fake_gpus(2)
    with caplog.at_level(logging.INFO, logger="mirrorbert.runtime.randomness"):
        randomness.set_rng_state(_saved_state(2))
        randomness.set_torch_rng_state((torch.get_rng_state(), _saved_state(2)["cuda"]))  # the dropout replay
    assert calls == [(10, 0), (11, 1), (10, 0), (11, 1)]
    assert not caplog.records


# ------------------------------------------------------------------------------------------ TF32
def test_tf32_is_on_only_inside_the_run_and_restored_after(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    with pytest.raises(RuntimeError, match="boom"):
        with runtime.tf32_matmuls(CUDA) as on:
            assert on is True
            assert torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
            raise RuntimeError("boom")  # a failed run gives the settings back too
    after = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    assert after == before
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # Turing: no TF32
    with runtime.tf32_matmuls(CUDA) as on:
        assert on is False and torch.get_float32_matmul_precision() == before[0]


def test_train_runs_inside_the_tf32_context(monkeypatch, tmp_path):
    """Every training run enters tf32_matmuls around the whole run (not a process-wide switch)."""
    from mirrorbert.mirror import train as trainer
    from mirrorbert.training import run as lifecycle

    entered = []

    class Sentinel(Exception):
        pass

    def fake_context(device):
        entered.append(device)
        return runtime.tf32_matmuls(CPU)

    def stop(*args):
        raise Sentinel

    monkeypatch.setattr(lifecycle, "tf32_matmuls", fake_context)
    monkeypatch.setattr(lifecycle, "_run", stop)
    monkeypatch.setattr(trainer, "check_eval_after", lambda tasks, data_dir: [])
    with pytest.raises(Sentinel):
        trainer.train(trainer.TrainConfig(model="m", data="d", device="cpu", output=str(tmp_path / "out")))
    assert entered == [CPU]


# ------------------------------------------------------------------------------------------ precision auto
@pytest.mark.parametrize("bf16, capability, expected", [(True, (8, 0), "bf16"), (False, (7, 5), "fp16")])
def test_auto_precision_from_the_gpus_own_answer(monkeypatch, bf16, capability, expected):
    """What docs/guide/training.md says: bf16 where the GPU has it natively, fp16 with loss scaling before."""
    seen = []

    def is_bf16_supported(including_emulation=True):
        seen.append(including_emulation)
        return bf16

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert runtime.resolve_precision("auto", CUDA) == expected
    assert seen == [False]  # emulated bf16 (pre-Ampere) does not count as native
    scaler = runtime.make_grad_scaler(CPU, expected)
    assert (scaler is not None) == (expected == "fp16")


# ------------------------------------------------------------------------------------------ loss scaling
def test_the_optimiser_step_unscales_before_clipping(monkeypatch):
    from mirrorbert.training import optim

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(8, 4)
    model(x).pow(2).mean().backward()
    plain = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    model.zero_grad()
    seen = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def record(params, max_norm):
        params = list(params)
        seen.append(torch.cat([p.grad.flatten() for p in params]).norm().item())
        return real_clip(params, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    optim.backward_and_step(model(x).pow(2).mean(), optimizer, scaler=scaler, max_grad_norm=1e9)
    assert seen == [pytest.approx(plain, rel=1e-4)]  # the clip saw true gradients, not 4096x them


@pytest.mark.parametrize("precision, scaled", [("fp16", True), ("bf16", False), ("fp32", False)])
def test_finetune_sts_scales_the_loss_in_fp16_only(tiny_bert, tmp_path, monkeypatch, precision, scaled):
    """fp16 autocast runs on the CPU in this torch, so the fp16 path (normally CUDA only) is run for real."""
    from support import write_stsb as _write_stsb

    from mirrorbert.evaluation.sts import load_set
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig, finetune_once
    from mirrorbert.training import optim

    root = _write_stsb(tmp_path / "data")
    monkeypatch.setattr(runtime, "resolve_precision", lambda value, device: value)  # fp16 allowed on the CPU
    scalers, real_step = [], optim.backward_and_step

    def record(loss, optimizer, scheduler=None, scaler=None, **kwargs):
        scalers.append(scaler)
        return real_step(loss, optimizer, scheduler, scaler, **kwargs)

    monkeypatch.setattr(optim, "backward_and_step", record)
    cfg = FinetuneStsConfig(model=str(tiny_bert), data_dir=str(root), epochs=1, batch_size=8, lr=1e-3,
                            device="cpu", precision=precision, show_progress=False)
    run = finetune_once(cfg, load_set(root, "stsb", "train"), load_set(root, "stsb", "test"), 1.0, 0)
    assert run.steps == len(scalers) == 3
    if scaled:
        assert all(isinstance(s, torch.amp.GradScaler) and s.is_enabled() for s in scalers)
        assert len({id(s) for s in scalers}) == 1 and scalers[0].get_scale() > 0  # one scaler, stepped
    else:
        assert scalers == [None] * 3
    assert run.test_spearman == run.test_spearman  # finite: the scaled steps trained something


# ------------------------------------------------------------------------------------------ export
def test_export_builds_its_example_inputs_on_the_encoders_device(tiny_bert, tmp_path, monkeypatch):
    """A model whose weights are not on the CPU (the meta device stands in for CUDA here) gets inputs there."""
    pytest.importorskip("onnxscript")
    from mirrorbert.encoder import export
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(str(tiny_bert), device="cpu")
    encoder.model.to("meta")
    traced = []
    monkeypatch.setattr(torch.onnx, "export", lambda graph, args, path, **kw: traced.append(
        {a.device.type for a in args} | {p.device.type for p in graph.parameters()}))
    export.export_onnx(encoder, tmp_path / "onnx" / "model.onnx")
    assert traced == [{"meta"}]


# ------------------------------------------------------------------------------------------ ST collator
def test_st_collator_masks_differ_between_dataloader_workers(tiny_bert, monkeypatch):
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from torch.utils.data._utils.worker import WorkerInfo

    from mirrorbert.integrations.sentence_transformers import MirrorBertDataCollator

    module = Transformer(str(tiny_bert))
    model = SentenceTransformer(modules=[module, Pooling(module.get_word_embedding_dimension(), "mean")],
                                device="cpu")
    strings = [f"string number {i} is long enough to be masked somewhere along it" for i in range(16)]
    collator = MirrorBertDataCollator(model, mask_span=5, mask_min_chars=10, seed=3)

    def in_worker(worker_id: int, seed: int) -> list[str]:
        info = WorkerInfo(id=worker_id, num_workers=2, seed=seed, dataset=None)
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
        return copy.deepcopy(collator).masked_copies(strings)  # each worker holds its own copy

    first, second = in_worker(0, 1000), in_worker(1, 1001)
    assert first != second  # a per-copy counter drew the same masks in both
    assert first == in_worker(0, 1000)  # reproducible from the seeds
    assert in_worker(0, 2000) != first  # the next epoch's workers (new seeds) draw anew
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: None)
    main = MirrorBertDataCollator(model, mask_span=5, mask_min_chars=10, seed=3)
    assert main.masked_copies(strings) != main.masked_copies(strings)  # no workers: the batch number moves on


def test_st_collator_in_a_real_two_worker_dataloader(tiny_bert):
    """The same strings in every batch: batch 0 (worker 0) and batch 1 (worker 1) differ only by their draws."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    from mirrorbert.integrations.sentence_transformers import MirrorBertDataCollator

    module = Transformer(str(tiny_bert))
    model = SentenceTransformer(modules=[module, Pooling(module.get_word_embedding_dimension(), "mean")],
                                device="cpu")
    rows = [{"text": "the same long string, masked somewhere along it"} for _ in range(4)] * 2
    collator = MirrorBertDataCollator(model, mask_span=5, mask_min_chars=10, seed=3)

    def masked(seed: int) -> list[torch.Tensor]:
        loader = torch.utils.data.DataLoader(rows, batch_size=4, num_workers=2, collate_fn=collator,
                                             generator=torch.Generator().manual_seed(seed),
                                             multiprocessing_context="fork")
        return [batch["text_mirror_input_ids"] for batch in loader]

    first, second = masked(0)
    assert not torch.equal(first, second)  # each worker held a fresh counter: both drew batch 0's masks
    assert all(torch.equal(a, b) for a, b in zip(masked(0), (first, second)))  # the same seed: the same masks
