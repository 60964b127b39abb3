"""Whole-command speed: `mirrorbert train` against a plain sentence-transformers script, as processes.

The canonical job: the paper's 10k STS-B training sentences, the sentence preset (one epoch, batch 200,
max length 50, mean pooling for BERT), a randomly initialised BERT (only speed is measured) with the
bert-base-uncased vocabulary (the tests' tiny tokenizer where that is not in the data dir). Each side is
one fresh process, timed from launch to exit, so import, model load, tokenisation, span masking, the
steps and the save all count:

- ours: `python -m mirrorbert -v train --preset sentence ...`; its `-v` line "phase timings (s)" gives the
  split (start-up, data, import, load, tokenise, compile, mask, steps, checkpoint, eval, save, other);
- peer: the script users would write (PEER_SCRIPT below): SentenceTransformer(Transformer + Pooling),
  pairs (x, x), MultipleNegativesRankingLoss at scale 1/0.04, the same batch size and max length,
  `model.fit` for one epoch, `model.save`. `fit` needs `datasets` and `accelerate`
  (`pip install 'mirrorbert[bench]'`); without them the script runs the same epoch as a plain loop
  (tokenise, loss, AdamW) and the JSON says `peer_mode: loop`.

Sides alternate within each repeat (machine drift hits both); medians over `--repeats`. Per size
(`--sizes`, default L4/H512 and BERT-base 12x768) the JSON holds `ratio_vs_sentence_transformers`
(peer wall time / ours, > 1: ours faster), `outside_steps_share` (1 - ours' steps phase / ours' whole
wall time), the phases (median seconds and shares of the wall time; `unaccounted` is the wall time the
phases do not cover: interpreter exit, and the start-up before /proc's clock) and every repeat's times.
`help_seconds` is the median wall time of `mirrorbert --help`. Both figures are also copied to the top
level, per size.

    python benchmarks/end_to_end.py --data-dir ../shared/data --json end_to_end.json
    python benchmarks/end_to_end.py --data-dir ../shared/data --quick --json end_to_end_quick.json

`--quick` (L4/H256, the first 2000 sentences, the same job otherwise) is meant to finish within 20
minutes on 2 cores; the full run at BERT-base size takes hours on a CPU (3 repeats x 2 sides x 1 epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_speed import CORPUS, TOKENIZER, build_model  # noqa: E402

PHASE_LINE = "phase timings (s): "
QUICK = {"sizes": "4x256", "strings": 2000}
FULL = {"sizes": "4x512,12x768", "strings": 10000}

PEER_SCRIPT = r'''"""A plain sentence-transformers Mirror-BERT/SimCSE-style run: pairs (x, x), MNRL, one epoch, save."""
import random
import sys

import torch
from sentence_transformers import InputExample, SentenceTransformer, losses, models
from torch.utils.data import DataLoader

model_dir, data, out, batch, max_length, pooling, device, precision = sys.argv[1:9]
batch, max_length = int(batch), int(max_length)
word = models.Transformer(model_dir, max_seq_length=max_length)
dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
model = SentenceTransformer(modules=[word, models.Pooling(dim(), pooling_mode=pooling)], device=device)
with open(data, encoding="utf-8") as f:
    strings = [line.strip() for line in f if line.strip()]
loss = losses.MultipleNegativesRankingLoss(model, scale=1 / 0.04)
try:
    import accelerate  # noqa: F401  (fit runs on the Trainer, which needs both)
    import datasets  # noqa: F401
    mode = "fit"
except ImportError:
    mode = "loop"
if mode == "fit":
    loader = DataLoader([InputExample(texts=[s, s]) for s in strings], shuffle=True, batch_size=batch)
    model.fit(train_objectives=[(loader, loss)], epochs=1, show_progress_bar=False, use_amp=precision != "fp32")
else:  # the same epoch by hand: what fit does, less the Trainer
    random.seed(42)
    random.shuffle(strings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    tokenize = getattr(model, "preprocess", None) or model.tokenize
    model.train()
    for start in range(0, len(strings) - 1, batch):
        chunk = strings[start:start + batch]
        features = [{k: v.to(model.device) for k, v in tokenize(chunk).items()} for _ in range(2)]
        with torch.autocast(model.device.type, dtype=dtype, enabled=dtype is not None):
            value = loss(features, torch.empty(0))
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
model.save(out)
print(mode)
'''


def build_any_model(data_dir: Path, folder: Path, layers: int, hidden: int) -> tuple[Path, str]:
    """A random BERT of this size with the bert-base-uncased vocabulary, else the tests' tiny tokenizer."""
    if (data_dir / TOKENIZER).exists():
        return build_model(data_dir, folder, layers, hidden), "bert-base-uncased"
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import make_tiny_bert

    tok = AutoTokenizer.from_pretrained(make_tiny_bert(folder.with_name(folder.name + "-tok")))
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                        pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, "tests' tiny WordPiece"


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=child_env())
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, done


def run_ours(model: Path, data: Path, out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "mirrorbert", "-v", "train", "--model", str(model), "--data", str(data),
           "--output", str(out), "--preset", "sentence", "--batch-size", str(args.batch_size),
           "--max-length", str(args.max_length), "--precision", args.precision, "--device", args.device,
           "--no-progress"]
    wall, done = timed(cmd, out.parent)
    lines = [line for line in done.stderr.splitlines() if PHASE_LINE in line]
    if not lines:
        raise RuntimeError("mirrorbert train -v printed no phase timings:\n" + done.stderr[-3000:])
    phases = json.loads(lines[-1].split(PHASE_LINE, 1)[1])
    pooling = json.loads((out / "mirrorbert.json").read_text(encoding="utf-8"))["pooling"]
    return {"wall_s": wall, "phases": phases, "pooling": pooling}


def run_peer(model: Path, data: Path, out: Path, pooling: str, args) -> dict:
    script = out.parent / "peer_sentence_transformers.py"
    script.write_text(PEER_SCRIPT, encoding="utf-8")
    cmd = [sys.executable, str(script), str(model), str(data), str(out), str(args.batch_size),
           str(args.max_length), pooling, args.device, args.precision]
    wall, done = timed(cmd, out.parent)
    return {"wall_s": wall, "mode": done.stdout.strip().splitlines()[-1]}


def help_seconds(repeats: int = 5) -> dict:
    walls = [timed([sys.executable, "-m", "mirrorbert", "--help"], Path.cwd())[0] for _ in range(repeats)]
    return {"median": round(statistics.median(walls), 3), "runs": [round(w, 3) for w in walls]}


def summarise_size(ours: list[dict], peer: list[dict]) -> dict:
    """Medians over the repeats, the ratio, and ours' phases (median seconds, share of the wall time)."""
    ours_wall = statistics.median(r["wall_s"] for r in ours)
    peer_wall = statistics.median(r["wall_s"] for r in peer)
    names = list(dict.fromkeys(name for r in ours for name in r["phases"] if name != "total"))
    phases = {name: statistics.median(r["phases"].get(name, 0.0) for r in ours) for name in names}
    phases["unaccounted"] = statistics.median(r["wall_s"] - r["phases"]["total"] for r in ours)
    steps_share = statistics.median(r["phases"].get("steps", 0.0) / r["wall_s"] for r in ours)
    return {
        "ratio_vs_sentence_transformers": round(peer_wall / ours_wall, 3),
        "outside_steps_share": round(1 - steps_share, 3),
        "mirrorbert": {
            "wall_s_median": round(ours_wall, 2),
            "phases_s_median": {k: round(v, 3) for k, v in phases.items()},
            "phase_shares": {k: round(v / ours_wall, 3) for k, v in phases.items()},
            "runs": [{"wall_s": round(r["wall_s"], 2), "phases": r["phases"]} for r in ours],
        },
        "sentence_transformers": {
            "wall_s_median": round(peer_wall, 2),
            "mode": peer[0]["mode"],
            "runs": [round(r["wall_s"], 2) for r in peer],
        },
    }


def run_size(data_dir: Path, data: Path, tmp: Path, layers: int, hidden: int, args) -> dict:
    model, vocab = build_any_model(data_dir, tmp / f"model-{layers}x{hidden}", layers, hidden)
    ours: list[dict] = []
    peer: list[dict] = []
    pooling = None
    for repeat in range(args.repeats):
        order = ("ours", "peer") if repeat % 2 == 0 else ("peer", "ours")
        if pooling is None:  # the peer pools as our sentence preset resolved it, so ours runs first once
            order = ("ours", "peer")
        for side in order:
            work = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{side}-"))
            if side == "ours":
                ours.append(run_ours(model, data, work / "out", args))
                pooling = ours[-1]["pooling"]
            else:
                peer.append(run_peer(model, data, work / "out", pooling, args))
            shutil.rmtree(work, ignore_errors=True)
            print(f"L{layers}/H{hidden} repeat {repeat + 1}/{args.repeats} {side}: "
                  f"{(ours if side == 'ours' else peer)[-1]['wall_s']:.1f} s", file=sys.stderr)
    result = summarise_size(ours, peer)
    result["pooling"], result["vocabulary"] = pooling, vocab
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--json", help="write the JSON report here (it is printed too)")
    parser.add_argument("--quick", action="store_true", help=f"L4/H256 and {QUICK['strings']} sentences")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and size; medians (default 3)")
    parser.add_argument("--sizes", help=f"LAYERSxHIDDEN list (default {FULL['sizes']}; --quick {QUICK['sizes']})")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--precision", default="fp32", help="fp32 | bf16 | fp16 (GPU), for both sides")
    parser.add_argument("--device", default="cpu", help="cpu | cuda, for both sides")
    parser.add_argument("--strings", type=int, help="use the first N sentences (default 10000; --quick 2000)")
    parser.add_argument("--help-repeats", type=int, default=5, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = QUICK if args.quick else FULL
    sizes = [tuple(int(x) for x in size.split("x")) for size in (args.sizes or preset["sizes"]).split(",")]
    n_strings = args.strings or preset["strings"]
    data_dir = Path(args.data_dir)
    corpus = data_dir / CORPUS
    if not corpus.exists():
        print(f"error: needs {corpus} (--data-dir)", file=sys.stderr)
        return 2
    import torch

    import mirrorbert

    results = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        lines = corpus.read_text(encoding="utf-8").splitlines()[:n_strings]
        data = tmp / "strings.txt"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        help_time = help_seconds(args.help_repeats)
        for layers, hidden in sizes:
            results[f"L{layers}/H{hidden}"] = run_size(data_dir, data, tmp, layers, hidden, args)
    report = {
        "benchmark": "end_to_end",
        "job": {"data": CORPUS, "strings": len(lines), "preset": "sentence", "epochs": 1,
                "batch_size": args.batch_size, "max_length": args.max_length, "precision": args.precision,
                "model": "BERT, random init"},
        "quick": args.quick,
        "repeats": args.repeats,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else
        platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": {"mirrorbert": mirrorbert.__version__, "torch": torch.__version__},
        "help_seconds": help_time["median"],
        "help_runs": help_time["runs"],
        "ratio_vs_sentence_transformers": {k: v["ratio_vs_sentence_transformers"] for k, v in results.items()},
        "outside_steps_share": {k: v["outside_steps_share"] for k, v in results.items()},
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
