"""Peak memory of ONE Mirror-BERT training step: plain vs --gradient-checkpointing vs --grad-cache-chunk.

A BERT-base-sized masked LM (random weights, L12/H768, the bert-base-uncased tokenizer) takes one step on
a batch of 200 STS-B training sentences (400 views) with `mirrorbert train --steps 1`. Each mode runs in
its own process, because the CPU measure (peak RSS, ru_maxrss) is per process; the number is the
`peak_memory_bytes` the trainer records in mirrorbert.json (CUDA max_memory_allocated on a GPU). The
peak includes the model, its gradients and AdamW's two moment buffers (16 bytes per parameter) plus
the Python/torch baseline, i.e. what a user needs.

    python benchmarks/step_memory.py --data-dir ../shared/data --output step_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_speed import CORPUS, build_model  # noqa: E402  (the same model the speed benchmark builds)

MODES = {
    "plain": [],
    "gradient-checkpointing": ["--gradient-checkpointing"],
    "grad-cache-chunk-50": ["--grad-cache-chunk", "50"],
}


def one_step(model: Path, data: Path, out: Path, flags: list[str], args) -> dict:
    command = [sys.executable, "-m", "mirrorbert.cli.app", "train", "--model", str(model), "--data", str(data),
               "--output", str(out), "--overwrite", "--steps", "1", "--batch-size", str(args.batch_size),
               "--preset", "sentence", "--precision", args.precision, "--device", args.device, "--no-progress",
               *flags]
    limit = int(args.max_gb * 2**30) if args.max_gb else None

    def cap_memory() -> None:  # fail with MemoryError instead of waking the OOM killer on a shared machine
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(command, capture_output=True, text=True, preexec_fn=cap_memory)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}", "command": " ".join(command)}
    info = json.loads((out / "mirrorbert.json").read_text(encoding="utf-8"))["training"]
    return {"peak_memory_gib": round(info["peak_memory_bytes"] / 2**30, 2), "measure": info["peak_memory_measure"],
            "wall_time_s": info["wall_time_s"], "final_loss": info["final_loss"], "precision": info["precision"],
            "command": " ".join(command)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="the shared data folder")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--max-gb", type=float, default=None, help="address-space cap per run (shared machines)")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
               "model": f"L{args.layers}/H{args.hidden}", "batch_size": args.batch_size, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args.data_dir, Path(tmp) / "model", args.layers, args.hidden)
        for mode in args.modes:
            results["modes"][mode] = one_step(model, args.data_dir / CORPUS, Path(tmp) / mode, MODES[mode], args)
            print(mode, json.dumps(results["modes"][mode]), file=sys.stderr, flush=True)
    text = json.dumps(results, indent=2)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
