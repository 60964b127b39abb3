"""Training throughput: Mirror-BERT grouped, packed and padded (`mirrorbert.train`) vs the sentence-transformers recipe.

All sides Mirror-tune the same randomly initialised BERT (only speed is measured) on the paper's 10k
STS-B training sentences, batch 200 strings, max length 50, on the same device and precision. The peer is
what users would otherwise write: sentence-transformers' MultipleNegativesRankingLoss over (s, s) pairs,
i.e. the unsupervised SimCSE recipe, driven by a plain optimisation loop (no Trainer overhead, so the
comparison is of the training step itself), fed exactly the batches our trainer draws.

Per model size (`--sizes`, default BERT-base 12x768 and L4/H512 4x512) and precision, for mirrorbert with
`--packing on` (packed rows, the default), `grouped` (length groups) and `off` (padded), and the peer:
real (non-padding) tokens/s and strings/s (median over `--repeats`, sides alternating so machine drift
hits all), the projected wall time of one full epoch over the corpus, the fraction of the FLOP limit
reached (6 x non-embedding parameters FLOPs per real token plus attention over each view's own tokens,
against a matmul peak measured in this run with a large torch.matmul of that precision), the ceiling of
any speed-up (the ratio to the peer of an implementation at 100% of that peak), and peak memory (RSS high-water of the side's own process on CPU,
torch.cuda.max_memory_allocated on GPU). Each side runs in a fresh subprocess so its memory peak is its
own. The first step of each side is a warm-up and is not timed.

    python benchmarks/train_speed.py --data-dir ../shared/data --steps 4 --repeats 3 --output train_speed.json
    python benchmarks/train_speed.py --sizes 4x512 --steps 2 --repeats 1 --precisions fp32   # quick look
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TOKENIZER, build_model, child_json, print_report  # noqa: E402

CORPUS = "corpora/stsbenchmark_train_10k_sents_random_sampled.txt"


def ours(model: Path, data: Path, out: Path, steps: int, precision: str, batch: int, max_length: int,
         packing: str = "on", device: str = "cpu") -> dict:
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mirror.train import train

    cfg = TrainConfig(model=str(model), data=str(data), output=str(out), preset="sentence", pooling="cls",
                      batch_size=batch, max_length=max_length, steps=steps + 1, precision=precision,
                      device=device, show_progress=False, overwrite=True, packing=packing)
    result = train(cfg)
    timed = result.step_log[1:]
    return summarise([t for t, _, _ in timed], [s for _, s, _ in timed], [k for _, _, k in timed])


def same_batches(data: Path, steps: int, batch: int, seed: int = 42) -> list[list[str]]:
    """The exact batches `mirrorbert.train` draws first (same dedup, same seeded order), so both sides
    pad and process identical inputs: step time depends strongly on each batch's longest string."""
    from mirrorbert.data.strings import load_training_strings
    from mirrorbert.mirror.views import STREAM_ORDER
    from mirrorbert.training.plan import BatchPlan

    strings = load_training_strings(data=str(data), seed=seed).strings
    order = list(BatchPlan(len(strings), batch, seed, STREAM_ORDER).iter_batches(0))
    return [[strings[i] for i in index] for index in order[: steps + 1]]


def peer(model: Path, batches: list[list[str]], steps: int, precision: str, batch: int, max_length: int,
         device: str = "cpu") -> dict:
    import torch
    from sentence_transformers import SentenceTransformer, models
    from sentence_transformers.sentence_transformer import losses

    from mirrorbert.runtime.device import autocast

    word = models.Transformer(str(model), max_seq_length=max_length)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    pooling = models.Pooling(dim(), pooling_mode="cls")
    st = SentenceTransformer(modules=[word, pooling], device=device)
    st.train()
    loss_fn = losses.MultipleNegativesRankingLoss(st, scale=1 / 0.04)
    optimizer = torch.optim.AdamW(st.parameters(), lr=2e-5, weight_decay=0.01)
    torch_device = torch.device(device)
    times, counts, tokens = [], [], []
    for step in range(steps + 1):
        chunk = batches[step]
        start = time.perf_counter()
        tokenize = getattr(st, "preprocess", None) or st.tokenize
        features = [{k: v.to(torch_device) if isinstance(v, torch.Tensor) else v for k, v in tokenize(chunk).items()}
                    for _ in range(2)]
        with autocast(torch_device, precision):
            loss = loss_fn(features, torch.empty(0))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # waits for the device
        elapsed = time.perf_counter() - start
        if step > 0:
            times.append(elapsed)
            counts.append(len(chunk))
            tokens.append(int(sum(f["attention_mask"].sum() for f in features)))
    return summarise(times, counts, tokens)


def summarise(times: list[float], strings: list[int], tokens: list[int]) -> dict:
    total = sum(times)
    return {
        "steps_timed": len(times),
        "seconds_per_step_median": round(statistics.median(times), 4),
        "strings_per_s": round(sum(strings) / total, 2),
        "real_tokens_per_s": round(sum(tokens) / total, 1),
    }


def peak_memory_mb(device: str) -> float:
    import resource

    import torch

    if device.startswith("cuda"):
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def matmul_peak_gflops(precision: str, device: str, seconds: float = 1.0) -> float:
    """Best FLOP/s of a large square torch.matmul in this precision: the hardware's practical limit."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    dev = torch.device(device)

    def timed(n: int) -> float:
        a, b = torch.randn(n, n, device=dev).to(dtype), torch.randn(n, n, device=dev).to(dtype)
        torch.matmul(a, b)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.matmul(a, b)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    n, limit = 512, 16384 if dev.type == "cuda" else 4096
    while n < limit and timed(n) < 0.05:  # grow until one product is large enough to time well
        n *= 2
    best, spent = float("inf"), 0.0
    while spent < seconds or best == float("inf"):
        t = timed(n)
        best, spent = min(best, t), spent + t
    return round(2 * n**3 / best / 1e9, 1)


def non_embedding_params(encoder) -> int:
    """Parameters of the transformer layers: the ones every token multiplies (embeddings are lookups)."""
    return sum(p.numel() for n, p in encoder.named_parameters() if not n.startswith(("embeddings.", "pooler.")))


def model_flops(encoder, lengths: list[int], passes: int) -> int:
    """Useful FLOPs of sequences of these lengths: per pass (forward = 1, forward + backward = 3) 2 x
    non-embedding parameters per real token plus attention scores and weighted sums over each sequence's
    own tokens (4 x n x d per token and layer); padding and cross-sequence attention are not useful work."""
    config = encoder.config
    attention = 4 * config.num_hidden_layers * config.hidden_size * sum(n * n for n in lengths)
    return passes * (2 * non_embedding_params(encoder) * sum(lengths) + attention)


def useful_flops(model: Path, batches: list[list[str]], max_length: int) -> dict:
    """FLOPs per real token a training step needs at the limit (`model_flops`, forward and backward)."""
    from transformers import AutoModel, AutoTokenizer

    encoder = AutoModel.from_pretrained(model, add_pooling_layer=False)
    tok = AutoTokenizer.from_pretrained(model)
    lengths = [len(ids) for chunk in batches for ids in tok(chunk, truncation=True, max_length=max_length)["input_ids"]]
    lengths *= 2  # two views of equal length
    return {"non_embedding_params": non_embedding_params(encoder),
            "flops_per_real_token": model_flops(encoder, lengths, passes=3) / sum(lengths)}


def epoch_tokens(model: Path, data: Path, max_length: int) -> tuple[int, int]:
    from transformers import AutoTokenizer

    from mirrorbert.data.strings import load_training_strings

    strings = load_training_strings(data=str(data), seed=42).strings
    lengths = AutoTokenizer.from_pretrained(model)(strings, truncation=True, max_length=max_length)["input_ids"]
    return len(strings), 2 * sum(len(ids) for ids in lengths)


SIDES = ("mirrorbert_grouped", "mirrorbert_packed", "mirrorbert_padded", "sentence_transformers_mnrl")
PACKING_OF_SIDE = {"mirrorbert_grouped": "grouped", "mirrorbert_packed": "on", "mirrorbert_padded": "off"}


def run_side(side: str, args, model: Path, data: Path, precision: str) -> dict:
    """One side in a fresh process, so its peak memory is its own; returns its summary."""
    cmd = [sys.executable, __file__, "--child", side, "--child-model", str(model), "--data-dir", args.data_dir,
           "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
           "--precisions", precision, "--device", args.device]
    return child_json(cmd, side)


def child(args) -> int:
    model, data, precision = Path(args.child_model), Path(args.data_dir) / CORPUS, args.precisions
    if args.child == "sentence_transformers_mnrl":
        result = peer(model, same_batches(data, args.steps, args.batch_size), args.steps, precision,
                      args.batch_size, args.max_length, args.device)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = ours(model, data, Path(tmp) / "out", args.steps, precision, args.batch_size, args.max_length,
                          packing=PACKING_OF_SIDE[args.child], device=args.device)
    result["peak_memory_mb"] = peak_memory_mb(args.device)
    print(json.dumps(result))
    return 0


def median_side(runs: list[dict]) -> dict:
    out = {key: statistics.median(r[key] for r in runs)
           for key in ("strings_per_s", "real_tokens_per_s", "seconds_per_step_median")}
    out["peak_memory_mb"] = max(r["peak_memory_mb"] for r in runs)
    out["repeats"] = [{k: r[k] for k in ("strings_per_s", "real_tokens_per_s")} for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side and precision (+1 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side; the median is reported (default 3)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--sizes", default="12x768,4x512", help="LAYERSxHIDDEN list (default: BERT-base and L4/H512)")
    parser.add_argument("--layers", type=int, help="one size only: layers (with --hidden)")
    parser.add_argument("--hidden", type=int, help="one size only: hidden size (with --layers)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"subset of {','.join(SIDES)}")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--output", help="write the JSON here as well as to stdout")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--child-model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    import torch

    import mirrorbert

    data_dir = Path(args.data_dir)
    data = data_dir / CORPUS
    if not data.exists() or not (data_dir / TOKENIZER).exists():
        print(f"error: needs {data} and {data_dir / TOKENIZER} (--data-dir)", file=sys.stderr)
        return 2
    sizes = [(args.layers, args.hidden)] if args.layers and args.hidden else [
        tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    sides = args.sides.split(",")
    precisions = args.precisions.split(",")
    peaks = {precision: matmul_peak_gflops(precision, args.device) for precision in precisions}
    batches = same_batches(data, args.steps, args.batch_size)[1:]  # the timed ones
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers, hidden in sizes:
            model = build_model(data_dir, Path(tmp) / f"model-{layers}x{hidden}", layers, hidden)
            flops = useful_flops(model, batches, args.max_length)
            n_strings, n_tokens = epoch_tokens(model, data, args.max_length)
            per_size = {"useful_flops": flops, "epoch_strings": n_strings, "epoch_real_tokens": n_tokens}
            for precision in precisions:
                runs: dict[str, list[dict]] = {side: [] for side in sides}
                for r in range(args.repeats):
                    for side in (sides if r % 2 == 0 else sides[::-1]):
                        runs[side].append(run_side(side, args, model, data, precision))
                entry = {"matmul_peak_gflops": peaks[precision]}
                for side in sides:
                    summary = median_side(runs[side])
                    achieved = summary["real_tokens_per_s"] * flops["flops_per_real_token"]
                    summary["useful_gflops"] = round(achieved / 1e9, 1)
                    summary["fraction_of_matmul_peak"] = round(achieved / 1e9 / peaks[precision], 3)
                    summary["projected_epoch_s"] = round(n_tokens / summary["real_tokens_per_s"], 1)
                    entry[side] = summary
                peer_name = "sentence_transformers_mnrl"
                if peer_name in entry:  # what an implementation at 100% of the matmul peak would reach vs the peer
                    entry["ratio_ceiling_vs_peer"] = round(1 / entry[peer_name]["fraction_of_matmul_peak"], 3)
                for side in sides:
                    if side != peer_name and peer_name in entry:
                        for key in ("strings_per_s", "real_tokens_per_s"):
                            entry[f"ratio_{side}_vs_peer_{key}"] = round(entry[side][key] / entry[peer_name][key], 3)
                per_size[precision] = entry
            results[f"L{layers}/H{hidden}"] = per_size
    report = {
        "benchmark": "train_speed",
        "model": "BERT, random init, bert-base-uncased vocab",
        "data": CORPUS,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "steps_timed": args.steps,
        "repeats": args.repeats,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "versions": {"mirrorbert": mirrorbert.__version__, "torch": torch.__version__},
        "results": results,
    }
    print_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
