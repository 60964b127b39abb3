"""`--compile` measured, not assumed: Mirror-BERT training with and without torch.compile, cold and warm cache.

A BERT with random weights (default L4/H512, the bert-base-uncased tokenizer) trains N steps on the STS-B
training sentences (sentence preset, packed rows, fp32 by default) three times, each in a fresh process:
eager; compiled with an empty compile cache (the first run on a machine); compiled again with the cache the
cold run left (torch inductor's persistent FX-graph and AOT-autograd caches, kept in TORCHINDUCTOR_CACHE_DIR,
so every later run on the machine). Reported per side: the median step time after the first two steps, the
first two steps (they pay for recompilation when the row count changes), and the time outside the timed
steps; then the speed-up per step, each compile's warm-up (outside-steps time minus the eager run's, plus
the extra time of its first two steps), and the break-even: how many steps the job needs before the compiled
run has saved its warm-up. `--compile` pays within an epoch when the break-even is below the epoch's steps.

    python benchmarks/compile_speed.py --data-dir ../shared/data --steps 12 --json compile_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import child_json, print_report  # noqa: E402
from train_speed import CORPUS, build_model  # noqa: E402

EPOCH_STEPS = 50  # the canonical job: 10,000 STS-B sentences, batch 200, one epoch


def run_side(model: Path, data: Path, out: Path, args, compile_: bool) -> dict:
    """One training run in this process (called by the child process of `measure`)."""
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mirror.train import train

    cfg = TrainConfig(model=str(model), data=str(data), output=str(out), preset="sentence", pooling="cls",
                      batch_size=args.batch_size, steps=args.steps, precision=args.precision, device="cpu",
                      show_progress=False, overwrite=True, compile=compile_, threads=args.threads)
    result = train(cfg)
    steps = [t for t, _, _ in result.step_log]
    return {"compiled": result.info["compiled"], "median_step_s": round(statistics.median(steps[2:]), 4),
            "first_two_steps_s": [round(t, 2) for t in steps[:2]], "steps_s": [round(t, 3) for t in steps],
            "outside_steps_s": round(result.wall_time_s - sum(steps), 2), "wall_time_s": round(result.wall_time_s, 2)}


def measure(side: str, model: Path, out: Path, cache: Path, args) -> dict:
    """Run one side in a fresh process, so imports, dynamo's in-memory caches and threads start clean."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    cmd = [sys.executable, __file__, "--child", side, "--model", str(model), "--output", str(out),
           "--data-dir", str(args.data_dir), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
           "--precision", args.precision] + (["--threads", str(args.threads)] if args.threads else [])
    return child_json(cmd, f"{side} run", env)


def warm_up_s(compiled: dict, eager: dict) -> float:
    """Extra seconds the compiled run spent before it ran at its steady speed."""
    outside = compiled["outside_steps_s"] - eager["outside_steps_s"]
    first = sum(compiled["first_two_steps_s"]) - 2 * compiled["median_step_s"]
    return round(outside + first, 1)


def break_even_steps(warm_up: float, eager: dict, compiled: dict) -> float | None:
    saved_per_step = eager["median_step_s"] - compiled["median_step_s"]
    return round(warm_up / saved_per_step, 1) if saved_per_step > 0 else None


def report(eager: dict, cold: dict, warm: dict, args) -> dict:
    sides = {"eager": eager, "compile_cold_cache": cold, "compile_warm_cache": warm}
    result = {"benchmark": "compile_speed", "model": f"L{args.layers}/H{args.hidden}",
              "batch_size": args.batch_size, "steps": args.steps, "precision": args.precision,
              "cpu": platform.machine(), "cores": os.cpu_count(), "threads": args.threads or "torch default",
              "sides": sides}
    for name, side in (("cold", cold), ("warm", warm)):
        w = warm_up_s(side, eager)
        even = break_even_steps(w, eager, side)
        result[f"speedup_per_step_{name}"] = round(eager["median_step_s"] / side["median_step_s"], 3)
        result[f"warm_up_s_{name}"] = w
        result[f"break_even_steps_{name}"] = even
        result[f"pays_within_epoch_{name}"] = even is not None and even <= EPOCH_STEPS
    result["epoch_steps"] = EPOCH_STEPS
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, help="write the JSON report here (it is printed too)")
    parser.add_argument("--child", choices=["eager", "compile"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side = run_side(args.model, args.data_dir / CORPUS, args.output, args, args.child == "compile")
        print(json.dumps(side))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_model(args.data_dir, root / "model", args.layers, args.hidden)
        eager = measure("eager", model, root / "eager", root / "cache-unused", args)
        cold = measure("compile", model, root / "cold", root / "cache", args)
        warm = measure("compile", model, root / "warm", root / "cache", args)
    result = report(eager, cold, warm, args)
    print_report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
