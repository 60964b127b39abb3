"""Scale curves (issue 28): every command's time and peak memory from 10 thousand to 10 million strings,
against the sentence-transformers peer at the same sizes.

For each N in `--sizes` one generator (train_scale.write_strings: the shared STS-B and Wikipedia sentences,
each followed by the words its number picks, so every string differs; nothing committed) writes N strings,
and each part in `--parts` runs as a fresh process whose own peak RSS (`os.wait4`) and wall time are kept:

- `train`: `mirrorbert -v train --preset sentence --steps S` from an empty token cache: time to the first step
  (the phases before the loop), steps/s, peak RSS (train_scale.run_train);
- `encode`: `mirrorbert encode` of the N strings to a .npy;
- `index`: `mirrorbert index` of the N strings (`--index-type auto`: exact below 100k rows, IVF from there);
- `search`: `mirrorbert search --index` of that index with 1,000 STS-B test sentences as queries;
- `approx`: recall@10 and queries/s of the approximate index against exact search on N seeded clustered
  vectors at `--dim` (index_scale.one_size; needs N x dim float32 in RAM for the exact side, so at most 1M here);
- `peer-train`: the sentence-transformers recipe a user would write for the same job: `datasets.load_dataset(
  "text")` (Arrow, memory-mapped) with the pair (x, x), `SentenceTransformerTrainer` with
  MultipleNegativesRankingLoss at scale 1/0.04, the same model, batch, max length (50), steps and precision;
  time to its first step, steps/s, peak RSS;
- `peer-encode`: `SentenceTransformer.encode` of the N strings read into a list (its API takes a list), saved
  with `numpy.save`.

The model is a seeded random BERT (`--model-size LAYERSxHIDDEN`, default 2x128; no pretrained weights exist
offline: only speed and memory are measured) on the real bert-base-uncased tokenizer of the data directory.
Training precision is `--precision auto` for ours (bf16 on CPUs with AVX512-BF16/AMX) and the same for the peer;
encode is fp32 on both sides. `--merge` keeps the rows of an existing `--output` that this run did not measure,
so the curves can be measured a size at a time (10M takes about two hours on 2 cores).

    python benchmarks/scale.py --data-dir ../shared/data --sizes 10000,100000,1000000 --output scale.json
    python benchmarks/scale.py --sizes 10000000 --parts train,encode,index,search --steps 100 --merge --output scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_model, child_json, print_report, run_measured, stsb_query_texts  # noqa: E402
from train_scale import run_train, write_strings  # noqa: E402

PARTS = ("train", "encode", "index", "search", "approx", "peer-train", "peer-encode")
MAX_LENGTH = 50  # the sentence preset's
ENCODE_BATCH = 256
QUERIES = 1000


def mirrorbert(*args: str) -> list[str]:
    return [sys.executable, "-m", "mirrorbert", *args, "--device", "cpu", "--no-progress"]


def measured(cmd: list[str]) -> tuple[dict, str]:
    """The child's wall time and memory peaks (GB: all resident, anonymous, memory-mapped files), and its stdout."""
    run = run_measured(cmd)
    return {"wall_s": round(run["wall_s"], 1), **{k: round(run[k], 3) for k in ("peak_rss_gb", "peak_anon_gb",
                                                                                "peak_file_gb")}}, run["stdout"]


def part_encode(model: Path, data: Path, work: Path, n: int) -> dict:
    out = work / "vectors.npy"
    row, _ = measured(mirrorbert("encode", "--model", str(model), "--input", str(data), "--output", str(out),
                                 "--overwrite", "--batch-size", str(ENCODE_BATCH)))
    out.unlink()
    return {**row, "strings_per_s": round(n / row["wall_s"])}


def part_index(model: Path, data: Path, work: Path, n: int) -> dict:
    folder = work / f"index-{n}"
    row, stdout = measured(mirrorbert("index", "--model", str(model), "--corpus", str(data), "--output", str(folder),
                                      "--overwrite", "--batch-size", str(ENCODE_BATCH)))
    summary = json.loads(stdout.strip().splitlines()[-1])
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    return {**row, "index_type": summary.get("index_type"), "folder_gb": round(size / 1e9, 3)}


def part_search(model: Path, work: Path, n: int, data_dir: Path) -> dict:
    folder, queries = work / f"index-{n}", work / "queries.txt"
    if not folder.is_dir():
        raise SystemExit(f"search at {n} needs the index part first (or --work holding {folder})")
    if not queries.exists():
        queries.write_text("\n".join(stsb_query_texts(data_dir, QUERIES)) + "\n", encoding="utf-8")
    row, stdout = measured(mirrorbert("search", "--model", str(model), "--index", str(folder), "--queries",
                                      str(queries), "--top-k", "10"))
    return {**row, "queries": sum(1 for line in stdout.splitlines() if line.startswith("{"))}


def part_approx(n: int, dim: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).with_name("index_scale.py")), "--one", f"{n},{dim}",
           "--queries", str(QUERIES), "--top-k", "10", "--repeats", "3"]
    one = child_json(cmd, f"approximate index at {n} x {dim}")
    keep = ("dim", "nlist", "nprobe", "recall_at_10", "exact_queries_per_s", "ivf_queries_per_s", "speedup",
            "ivf_train_and_assign_s", "peak_rss_mb_after_ivf")
    return {k: one[k] for k in keep}


PEER_TRAIN = r'''
import json, sys, time
import torch
from datasets import load_dataset
from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                   SentenceTransformerTrainingArguments, losses, models)
from transformers import TrainerCallback

model_dir, data, out, steps, batch, max_length, bf16 = sys.argv[1:8]
word = models.Transformer(model_dir, max_seq_length=int(max_length))
model = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean")], device="cpu")
pairs = load_dataset("text", data_files=data, split="train", cache_dir=out + "/hf-cache")
pairs = pairs.rename_column("text", "anchor").map(lambda row: {"positive": row["anchor"]})
marks = {}
class Clock(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        marks.setdefault("first", time.time())
    def on_train_end(self, args, state, control, **kw):
        marks["end"] = time.time()
arguments = SentenceTransformerTrainingArguments(
    output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch), learning_rate=2e-5,
    warmup_ratio=0.0, bf16=bf16 == "1", use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no",
    dataloader_drop_last=True, seed=0, disable_tqdm=True)
trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=pairs,
                                     loss=losses.MultipleNegativesRankingLoss(model, scale=1 / 0.04),
                                     callbacks=[Clock()])
trainer.train()
print(json.dumps({"first_step_at": marks["first"], "loop_s": marks["end"] - marks["first"]}))
'''

PEER_ENCODE = r'''
import sys
import numpy as np
from sentence_transformers import SentenceTransformer, models

model_dir, data, out, batch, max_length = sys.argv[1:6]
word = models.Transformer(model_dir, max_seq_length=int(max_length))
model = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean")], device="cpu")
with open(data, encoding="utf-8") as f:
    strings = [line.rstrip("\n") for line in f]
np.save(out, model.encode(strings, batch_size=int(batch), convert_to_numpy=True, show_progress_bar=False))
'''


def part_peer_train(model: Path, data: Path, work: Path, steps: int, batch: int, bf16: bool) -> dict:
    out = work / "peer-train"
    start = time.time()
    row, stdout = measured([sys.executable, "-c", PEER_TRAIN, str(model), str(data), str(out), str(steps),
                            str(batch), str(MAX_LENGTH), "1" if bf16 else "0"])
    marks = json.loads(stdout.strip().splitlines()[-1])
    return {**row, "first_step_s": round(marks["first_step_at"] - start, 2),
            "steps_per_s": round(steps / marks["loop_s"], 2), "precision": "bf16" if bf16 else "fp32", "steps": steps}


def part_peer_encode(model: Path, data: Path, work: Path, n: int) -> dict:
    out = work / "peer-vectors.npy"
    row, _ = measured([sys.executable, "-c", PEER_ENCODE, str(model), str(data), str(out), str(ENCODE_BATCH), "512"])
    out.unlink()
    return {**row, "strings_per_s": round(n / row["wall_s"])}


def run_part(part: str, n: int, model: Path, data: Path, work: Path, args) -> dict:
    if part == "train":
        cache = work / f"cache-{n}"
        shutil.rmtree(cache, ignore_errors=True)  # from an empty token cache: the tokenising pass is measured
        out = run_train(model, data, work / "out", cache, args.steps, args.batch_size)
        out.pop("phases_s", None)
        return {**out, "steps": args.steps}
    if part == "encode":
        return part_encode(model, data, work, n)
    if part == "index":
        return part_index(model, data, work, n)
    if part == "search":
        return part_search(model, work, n, args.data_dir)
    if part == "approx":
        return part_approx(n, args.dim)
    if part == "peer-train":
        return part_peer_train(model, data, work, args.steps, args.batch_size, args.bf16)
    return part_peer_encode(model, data, work, n)


def strings_file(data_dir: Path, work: Path, n: int) -> Path:
    """The N strings, written once per work folder (the generator is deterministic)."""
    path = work / f"strings-{n}.txt"
    if not path.exists():
        partial = path.with_suffix(".partial")
        write_strings(data_dir, n, partial)
        partial.replace(path)
    return path


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--sizes", default="10000,100000,1000000", help="numbers of strings, comma-separated")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--model-size", default="2x128", help="LAYERSxHIDDEN of the random BERT (default 2x128)")
    parser.add_argument("--steps", type=int, default=20, help="training steps of train and peer-train")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--dim", type=int, default=384, help="dimension of the approx part's vectors")
    parser.add_argument("--work", type=Path, help="keep the strings, index and caches here (default: temporary)")
    parser.add_argument("--output", help="write the JSON here (also printed)")
    parser.add_argument("--merge", action="store_true", help="keep the rows of --output this run does not measure")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)}")
    args.layers, args.hidden = map(int, args.model_size.lower().split("x"))
    return args


def previous_rows(args) -> list[dict]:
    if not (args.merge and args.output and Path(args.output).exists()):
        return []
    old = json.loads(Path(args.output).read_text(encoding="utf-8"))
    if old.get("model_size") != args.model_size:
        raise SystemExit(f"--merge: {args.output} was measured with model {old.get('model_size')}")
    return old["rows"]


def main(argv=None) -> int:
    args = parse_args(argv)
    from mirrorbert.runtime.device import cpu_has_native_bf16

    args.data_dir = args.data_dir.resolve()
    args.bf16 = cpu_has_native_bf16()
    sizes = [int(s) for s in args.sizes.split(",")]
    measured = {(n, part) for n in sizes for part in args.parts}
    rows = [r for r in previous_rows(args) if (r["strings"], r["part"]) not in measured]
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = work / f"model-{args.model_size}"
        if not model.exists():
            build_model(args.data_dir, model, args.layers, args.hidden)
        for n in sizes:
            data = strings_file(args.data_dir, work, n) if set(args.parts) - {"approx", "search"} else None
            for part in args.parts:
                row = {"strings": n, "part": part, **run_part(part, n, model, data, work, args)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (r["strings"], PARTS.index(r["part"])))
    report = {"benchmark": "scale", "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "native_bf16": args.bf16, "model_size": args.model_size,
              "steps": args.steps, "batch_size": args.batch_size, "approx_dim": args.dim, "rows": rows}
    print_report(report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
