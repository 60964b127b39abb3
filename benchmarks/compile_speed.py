"""`--compile` measured, not assumed: Mirror-BERT training steps with and without torch.compile.

A small BERT (random weights, default L2/H128, the bert-base-uncased tokenizer) trains N steps on the
STS-B training sentences, once eager and once with `--compile`, in one process each side after the
other. Reported: the median step time after the first two steps (shapes vary per batch, so the first
steps also pay for recompilation), and the compile warm-up (run time outside the timed steps, minus the
eager run's).

    python benchmarks/compile_speed.py --data-dir ../shared/data --steps 10 --precision fp32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_speed import CORPUS, build_model  # noqa: E402


def run(model: Path, data: Path, out: Path, args, compile_: bool) -> dict:
    from mirrorbert.config import TrainConfig
    from mirrorbert.trainer import train

    cfg = TrainConfig(model=str(model), data=str(data), output=str(out), preset="sentence", pooling="cls",
                      batch_size=args.batch_size, steps=args.steps, precision=args.precision, device="cpu",
                      show_progress=False, overwrite=True, compile=compile_, threads=args.threads)
    result = train(cfg)
    steps = [t for t, _, _ in result.step_log]
    return {"compiled": result.info["compiled"], "median_step_s": round(statistics.median(steps[2:]), 4),
            "first_two_steps_s": [round(t, 2) for t in steps[:2]],
            "outside_steps_s": round(result.wall_time_s - sum(steps), 2), "wall_time_s": round(result.wall_time_s, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args.data_dir, Path(tmp) / "model", args.layers, args.hidden)
        eager = run(model, args.data_dir / CORPUS, Path(tmp) / "eager", args, False)
        compiled = run(model, args.data_dir / CORPUS, Path(tmp) / "compiled", args, True)
    result = {"model": f"L{args.layers}/H{args.hidden}", "batch_size": args.batch_size, "precision": args.precision,
              "eager": eager, "compile": compiled,
              "speedup": round(eager["median_step_s"] / compiled["median_step_s"], 3),
              "compile_warm_up_s": round(compiled["outside_steps_s"] - eager["outside_steps_s"], 1)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
