"""Memory and start-up of `mirrorbert train` as the corpus grows (issue 28): peak RSS, time to the first step, steps/s.

For each N in `--sizes` (default 10k, 100k, 1M) the script writes N unique training strings made
deterministically from the shared corpora (the STS-B and English Wikipedia sentences in one fixed shuffled
order, so every N has the same mix of lengths, each followed by 0..k of the top English words picked by the
string's number: nothing committed), builds a tiny BERT
(2 layers, hidden 128, the real bert-base-uncased tokenizer from the data directory) and runs
`mirrorbert -v train --steps 20 --preset sentence` on them in a fresh process, so the peak RSS is that
process's own (`os.wait4`'s rusage of the child, ru_maxrss). Each N runs with an empty token cache
(`MIRRORBERT_CACHE` in a temporary folder: the tokenising pass is measured), then, with `--warm`, once more
on the cache it left (start-up when the store is reused).

Reported per run, from the child's phase timings (`-v`, reporting/timing.py): `first_step_s`, the phases
before the training loop (process start-up, reading the strings, imports, model load, tokenising into the
store, compile); `steps_per_s`, steps over the loop's time (the steps and the per-batch masking); peak RSS.

    python benchmarks/train_scale.py --data-dir ../shared/data --output train_scale.json
    python benchmarks/train_scale.py --sizes 10000,100000 --warm       # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_model, print_report, run_measured  # noqa: E402

SENTENCES = ("corpora/stsbenchmark_train_10k_sents_random_sampled.txt", "corpora/en_wiki_20k_sents.txt")
WORDS = "corpora/en_words_top_10k.txt"
PHASE_LINE = "phase timings (s): "
BEFORE_LOOP = ("startup", "data", "import", "load", "tokenise", "compile")


def write_strings(data_dir: Path, n: int, path: Path) -> int:
    """N unique strings: sentence i % S, then the words the string's number picks (base len(WORDS) digits)."""
    read = lambda rel: [s.strip() for s in (data_dir / rel).read_text(encoding="utf-8").splitlines() if s.strip()]
    sentences = list(dict.fromkeys(s for rel in SENTENCES for s in read(rel)))
    random.Random(0).shuffle(sentences)  # every N draws the same mix of short (STS-B) and long (Wikipedia) ones
    words = list(dict.fromkeys(read(WORDS)))
    seen: set[str] = set()
    with path.open("w", encoding="utf-8") as fh:
        j = 0
        while len(seen) < n:
            base, r = sentences[j % len(sentences)], j // len(sentences)
            suffix = []
            while r:
                r, digit = divmod(r - 1, len(words))
                suffix.append(words[digit])
            text = " ".join([base, *suffix])
            if text not in seen:
                seen.add(text)
                fh.write(text + "\n")
            j += 1
    return len(seen)


def run_train(model: Path, data: Path, out: Path, cache: Path, steps: int, batch_size: int) -> dict:
    """One `mirrorbert train` in a child process; its phases, steps/s and peak RSS."""
    cmd = [sys.executable, "-m", "mirrorbert", "-v", "train", "--model", str(model), "--data", str(data),
           "--output", str(out), "--overwrite", "--preset", "sentence", "--steps", str(steps), "--batch-size",
           str(batch_size), "--device", "cpu", "--no-progress"]
    run = run_measured(cmd, env={**os.environ, "MIRRORBERT_CACHE": str(cache)}, what="mirrorbert train")
    wall, stderr = run["wall_s"], run["stderr"]
    lines = [line for line in stderr.splitlines() if PHASE_LINE in line]
    phases = json.loads(lines[-1].split(PHASE_LINE, 1)[1])
    loop = phases.get("steps", 0.0) + phases.get("mask", 0.0)
    return {"wall_s": round(wall, 2), "first_step_s": round(sum(phases.get(p, 0.0) for p in BEFORE_LOOP), 2),
            "steps_per_s": round(steps / loop, 2) if loop else None,
            "peak_rss_gb": round(run["peak_rss_gb"], 3), "peak_anon_gb": round(run["peak_anon_gb"], 3),
            "peak_file_gb": round(run["peak_file_gb"], 3), "phases_s": phases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--sizes", default="10000,100000,1000000", help="numbers of strings, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--warm", action="store_true", help="also run again on the token cache the first run left")
    parser.add_argument("--output", "--out", dest="output", help="write the JSON here (also printed)")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    report = {"benchmark": "train_scale", "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "steps": args.steps, "batch_size": args.batch_size,
              "model": "BERT 2 layers x 128, bert-base-uncased tokenizer", "preset": "sentence", "runs": []}
    with tempfile.TemporaryDirectory(prefix="train-scale-") as tmp:
        work = Path(tmp)
        model = build_model(data_dir, work / "model")
        for number, n in enumerate(int(s) for s in args.sizes.split(",")):
            data = work / f"strings-{n}.txt"
            write_strings(data_dir, n, data)
            cache = work / f"cache-{number}"  # each N from an empty cache, also when the list repeats it
            for kind in ("cold", "warm") if args.warm else ("cold",):
                run = run_train(model, data, work / f"out-{n}", cache, args.steps, args.batch_size)
                report["runs"].append({"strings": n, "cache": kind, **run})
                print(json.dumps(report["runs"][-1]), file=sys.stderr)
            data.unlink()
    print_report(report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
