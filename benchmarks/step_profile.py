"""Where the time of a packed training step (and of `Encoder.encode`) goes: a torch.profiler split on CPU.

Training: the packed Mirror-BERT step exactly as `mirrorbert train --preset sentence` runs it (BERT-base
size by default, random weights, bert-base-uncased vocabulary, batch 200 STS-B sentences, max length 50,
character span masking of the second view, dropout, InfoNCE at 0.04, fused AdamW where torch has it),
fp32 on the CPU; one warm-up step, then `--steps` profiled steps of the batches the trainer draws first.
Encoding: `Encoder.encode` (default layout, `--encode-packing`; batch 64) of `--encode-strings` sentences at MiniLM-L6 (6x384, 12
heads) and BERT-base sizes, one profiled call after a warm-up.

Each operator's own (exclusive) CPU time goes to one category:
- optimiser: anything under torch's `Optimizer.step` / `Optimizer.zero_grad` record_function;
- attention: scaled_dot_product_attention (forward and backward kernels), and in the math fallback the
  bmm/baddbmm and softmax (not log_softmax) ops it is made of, with their autograd backward nodes;
- matmul: mm / addmm / linear / matmul (the dense layers);
- element-wise: every other operator (GELU, LayerNorm, dropout, adds, copies, embeddings, the loss);
- python/other: the measured wall time minus all operator time (Python, autograd engine, packing).
`fraction_of_matmul_peak` is the useful FLOP rate (`train_speed.model_flops`: 6 x non-embedding
parameters per real token plus per-view attention, forward + backward for training, forward only for
encoding) over the best FLOP rate of a large fp32 torch.matmul measured in the same run
(`train_speed.matmul_peak_gflops`); `matmul_ops_fraction_of_peak` is the dense layers' FLOPs over the
time of the matmul category alone (how well the matmul kernels themselves run).

    python benchmarks/step_profile.py --data-dir ../shared/data --json step_profile.json --markdown step_profile.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_speed import CORPUS, TOKENIZER, matmul_peak_gflops, model_flops, non_embedding_params  # noqa: E402

CATEGORIES = ("matmul", "attention", "element-wise", "optimiser", "python/other")
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::linear", "aten::matmul", "aten::mv",
              "aten::addmv", "aten::dot", "aten::mkldnn_linear", "aten::_mkldnn_matmul", "aten::addbmm"}
ATTENTION_MARKS = ("scaled_dot_product", "bmm", "softmax")


def build_bert(data_dir: Path, folder: Path, layers: int, hidden: int, heads: int) -> Path:
    """A random BERT of this shape with the bert-base-uncased vocabulary (the tests' tokenizer without it)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    if (data_dir / TOKENIZER).exists():
        tok = AutoTokenizer.from_pretrained(data_dir / TOKENIZER)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tiny_models import make_tiny_bert

        tok = AutoTokenizer.from_pretrained(make_tiny_bert(folder.with_name(folder.name + "-tok")))
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def category(event) -> str | None:
    """The category of one profiler event's own time; None for annotations (their own time is Python)."""
    name = event.name
    if "::" not in name or name.startswith(("autograd::", "mb::")) or name.startswith("Optimizer."):
        return None
    lineage, parent = [name], event.cpu_parent
    while parent is not None:
        lineage.append(parent.name)
        parent = parent.cpu_parent
    lowered = [n.lower() for n in lineage]
    if any(n.startswith("optimizer.") for n in lowered):
        return "optimiser"
    if any(mark in n and "log_softmax" not in n for n in lowered for mark in ATTENTION_MARKS):
        return "attention"
    return "matmul" if name in MATMUL_OPS else "element-wise"


def split(prof, wall_us: float) -> tuple[dict, list]:
    """Seconds per category (python/other = wall minus operator time) and the top operators."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    per_op: dict[str, float] = {}
    for event in prof.events():
        kind = category(event)
        if kind is None:
            continue
        own = event.self_cpu_time_total
        seconds[kind] += own / 1e6
        per_op[event.name] = per_op.get(event.name, 0.0) + own / 1e6
    seconds["python/other"] = max(0.0, wall_us / 1e6 - sum(seconds.values()))
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:12]
    return seconds, [{"op": name, "seconds": round(s, 4)} for name, s in top]


def shares(seconds: dict, wall: float) -> dict:
    return {k: round(v / wall, 3) for k, v in seconds.items()}


def profile_train(model: Path, strings: list[str], args, peak: float) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from mirrorbert.encoder.model import Encoder
    from mirrorbert.training.optim import backward_and_step, build_optimizer
    from mirrorbert.runtime.randomness import derived_generator
    from mirrorbert.mirror.loss import build_loss
    from mirrorbert.mirror.step import mirror_step_loss
    from mirrorbert.mirror.views import STREAM_MASK, STREAM_ORDER
    from mirrorbert.training.plan import BatchPlan
    from mirrorbert.mirror.views import SecondViews, tokenize_once

    encoder = Encoder.load(model, pooling="mean", device="cpu")
    encoder.packing = True
    encoder.train()
    tok = encoder.tokenizer
    token_ids = tokenize_once(tok, strings, args.max_length)
    second = SecondViews(tok, strings, token_ids, "char", 5, 30, args.max_length).draw(
        derived_generator(42, STREAM_MASK, 0))
    batches = list(BatchPlan(len(strings), args.batch_size, 42, STREAM_ORDER).iter_batches(0))[: args.steps + 1]
    optimizer = build_optimizer(encoder, 2e-5, 0.01)

    def step(index: list[int]) -> None:
        first, views = [token_ids[i] for i in index], [second[i] for i in index]
        loss = mirror_step_loss(encoder, first, views, build_loss("infonce", 0.04), precision="fp32")
        backward_and_step(loss, optimizer)
        loss.item()

    step(batches[0])  # warm-up: allocator, oneDNN primitives, optimiser state
    walls, flops, dense_flops = [], 0, 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for index in batches[1:]:
            start = time.perf_counter()
            with record_function("mb::step"):
                step(index)
            walls.append(time.perf_counter() - start)
            lengths = [len(token_ids[i]) for i in index] + [len(second[i]) for i in index]
            flops += model_flops(encoder.model, lengths, passes=3)
            dense_flops += 3 * 2 * non_embedding_params(encoder.model) * sum(lengths)
    return summarise("train", encoder, walls, flops, prof, peak, dense_flops,
                     {"steps": len(walls), "batch_size": args.batch_size, "max_length": args.max_length,
                      "optimizer_fused": bool(optimizer.defaults.get("fused"))})


def profile_encode(model: Path, strings: list[str], args, peak: float) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function

    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(model, pooling="mean", device="cpu", max_length=args.max_length)
    packing = {"auto": None, "on": True, "off": False}[args.encode_packing]
    encoder.encode(strings[:64], packing=packing)  # warm-up
    lengths = [len(ids) for ids in encoder.tokenize(strings)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        with record_function("mb::encode"):
            encoder.encode(strings, packing=packing)
        wall = time.perf_counter() - start
    flops = model_flops(encoder.model, lengths, passes=1)
    dense = 2 * non_embedding_params(encoder.model) * sum(lengths)
    return summarise("encode", encoder, [wall], flops, prof, peak, dense,
                     {"strings": len(strings), "batch_size": 64, "max_length": args.max_length,
                      "packing": args.encode_packing})


def summarise(kind: str, encoder, walls: list[float], flops: int, prof, peak: float, dense_flops: int,
              setup: dict) -> dict:
    wall = sum(walls)
    seconds, top = split(prof, wall * 1e6)
    config = encoder.model.config
    return {
        "kind": kind,
        "size": f"L{config.num_hidden_layers}/H{config.hidden_size}/A{config.num_attention_heads}",
        **setup,
        "wall_s": round(wall, 3),
        "seconds_per_call_median": round(statistics.median(walls), 4),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "shares": shares(seconds, wall),
        "useful_gflops": round(flops / wall / 1e9, 2),
        "fraction_of_matmul_peak": round(flops / wall / 1e9 / peak, 3),
        "matmul_ops_fraction_of_peak": round(dense_flops / max(seconds["matmul"], 1e-9) / 1e9 / peak, 3),
        "top_ops": top,
    }


def markdown(report: dict) -> str:
    head = ["case", "size", "s per call", *CATEGORIES, "of matmul peak", "matmul ops of peak"]
    lines = [f"Matmul peak (fp32, {report['torch_threads']} threads): {report['matmul_peak_gflops']} GFLOP/s",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in report["cases"]:
        cells = [case["kind"], case["size"], f"{case['seconds_per_call_median']:.3f}",
                 *(f"{100 * case['shares'][c]:.1f}%" for c in CATEGORIES),
                 f"{100 * case['fraction_of_matmul_peak']:.1f}%", f"{100 * case['matmul_ops_fraction_of_peak']:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_size(text: str) -> tuple[int, int, int]:
    parts = [int(x) for x in text.split("x")]
    return parts[0], parts[1], parts[2] if len(parts) > 2 else max(1, parts[1] // 64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--steps", type=int, default=3, help="profiled training steps (+1 warm-up; default 3)")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--train-sizes", default="12x768x12", help="LAYERSxHIDDEN[xHEADS] list (default BERT-base)")
    parser.add_argument("--encode-sizes", default="6x384x12,12x768x12",
                        help="LAYERSxHIDDEN[xHEADS] list (default MiniLM-L6 and BERT-base)")
    parser.add_argument("--encode-strings", type=int, default=2000)
    parser.add_argument("--encode-packing", default="auto", choices=("auto", "on", "off"),
                        help="layout of encode's batches (default auto, what `encode` does: padded for its "
                             "length-sorted batches where that wastes little)")
    parser.add_argument("--json", help="write the JSON report here (it is printed too)")
    parser.add_argument("--markdown", help="write the Markdown table here")
    args = parser.parse_args(argv)

    import torch

    import mirrorbert

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data_dir = Path(args.data_dir)
    corpus = data_dir / CORPUS
    if not corpus.exists():
        print(f"error: needs {corpus} (--data-dir)", file=sys.stderr)
        return 2
    lines = corpus.read_text(encoding="utf-8").splitlines()
    train_strings = list(dict.fromkeys(lines))[: args.batch_size * (args.steps + 1)]
    peak = matmul_peak_gflops("fp32", "cpu")
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        models: dict[tuple, Path] = {}

        def model_of(size: tuple[int, int, int]) -> Path:
            if size not in models:
                models[size] = build_bert(data_dir, Path(tmp) / "x".join(map(str, size)), *size)
            return models[size]

        for text in filter(None, args.train_sizes.split(",")):
            cases.append(profile_train(model_of(parse_size(text)), train_strings, args, peak))
        for text in filter(None, args.encode_sizes.split(",")):
            cases.append(profile_encode(model_of(parse_size(text)), lines[: args.encode_strings], args, peak))
    report = {
        "benchmark": "step_profile",
        "device": "cpu", "precision": "fp32",
        "device_name": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "matmul_peak_gflops": peak,
        "versions": {"mirrorbert": mirrorbert.__version__, "torch": torch.__version__},
        "cases": cases,
    }
    text = json.dumps(report, indent=2)
    print(text)
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(markdown(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
