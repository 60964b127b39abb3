"""Training throughput per architecture: packed rows vs padded batches vs the sentence-transformers recipe.

For each encoder type on the packed path, a model of that type's shape (random weights, the real
bert-base-uncased vocabulary; `--layers` layers at `--hidden` width, base width by default: per-layer cost
is what packing changes, so fewer layers keep the ratios and cut the time) is Mirror-tuned on the paper's
10k STS-B training sentences by `mirrorbert.train` with `--packing on` and `--packing off`, and the peer
(sentence-transformers' MultipleNegativesRankingLoss over (s, s) pairs in a plain loop, fed the same
batches) runs the same steps, each side in a fresh process (`train_speed.py --child`). Real (non-padding)
tokens/s are the median over `--repeats` runs, sides alternating. `--peer-types` limits the peer to some
types (it is the slowest side).

    python benchmarks/arch_speed.py --data-dir ../shared/data --output docs/benchmarks/arch_speed.json
    python benchmarks/arch_speed.py --table docs/benchmarks/arch_speed.json       # the Markdown table
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TOKENIZER, child_json, print_report  # noqa: E402

TRAIN_SPEED = Path(__file__).resolve().parent / "train_speed.py"
CORPUS = "corpora/stsbenchmark_train_10k_sents_random_sampled.txt"
SIDES = ("mirrorbert_packed", "mirrorbert_padded", "sentence_transformers_mnrl")
# The published shapes of each type at `hidden` width (what a base model of that family sets besides sizes).
SHAPES = {
    "bert": {}, "electra": {}, "ernie": {}, "megatron-bert": {}, "distilbert": {},
    "albert": {"embedding_size": 128},
    "roberta": {}, "xlm-roberta": {}, "camembert": {}, "data2vec-text": {}, "mpnet": {},
    "roformer": {},
    "deberta-v2": {"relative_attention": True, "position_biased_input": False, "position_buckets": 256,
                   "max_relative_positions": -1, "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm",
                   "share_att_key": True},  # DeBERTa-v3's
    "modernbert": {"global_attn_every_n_layers": 3, "local_attention": 128},
}


def build(data_dir: Path, folder: Path, model_type: str, layers: int, hidden: int) -> Path:
    """A masked LM of this type and shape, seeded random weights, the real bert-base-uncased tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(data_dir / TOKENIZER)
    heads = max(1, hidden // 64)
    if model_type == "distilbert":
        sizes = dict(dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=4 * hidden)
    else:
        sizes = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=4 * hidden, **SHAPES[model_type])
    ids = dict(pad_token_id=tok.pad_token_id)
    if model_type not in ("distilbert",):
        ids.update(bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), max_position_embeddings=514, **sizes, **ids)
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run_side(side: str, args, model: Path) -> dict:
    cmd = [sys.executable, str(TRAIN_SPEED), "--child", side, "--child-model", str(model), "--data-dir",
           args.data_dir, "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--max-length",
           str(args.max_length), "--precisions", args.precision, "--device", args.device]
    return child_json(cmd, side)


def measure(args, model_type: str, model: Path) -> dict:
    sides = [s for s in SIDES if s != "sentence_transformers_mnrl" or model_type in args.peer_types.split(",")]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(args.repeats):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            runs[side].append(run_side(side, args, model))
    entry = {side: {"real_tokens_per_s": statistics.median(x["real_tokens_per_s"] for x in runs[side]),
                    "strings_per_s": statistics.median(x["strings_per_s"] for x in runs[side]),
                    "peak_memory_mb": max(x["peak_memory_mb"] for x in runs[side]),
                    "runs": [x["real_tokens_per_s"] for x in runs[side]]} for side in sides}
    tokens = {side: entry[side]["real_tokens_per_s"] for side in sides}
    entry["packed_vs_padded"] = round(tokens["mirrorbert_packed"] / tokens["mirrorbert_padded"], 3)
    if "sentence_transformers_mnrl" in tokens:
        entry["packed_vs_peer"] = round(tokens["mirrorbert_packed"] / tokens["sentence_transformers_mnrl"], 3)
        entry["padded_vs_peer"] = round(tokens["mirrorbert_padded"] / tokens["sentence_transformers_mnrl"], 3)
    return entry


def table(report: dict) -> str:
    lines = ["| type | packed tokens/s | padded tokens/s | sentence-transformers tokens/s | packed / padded | "
             "packed / peer |", "|---|---:|---:|---:|---:|---:|"]
    for kind, entry in report["results"].items():
        peer = entry.get("sentence_transformers_mnrl", {}).get("real_tokens_per_s")
        peer_cell = f"{peer:,.0f}" if peer else "-"
        ratio_cell = f"{entry['packed_vs_peer']:.2f}x" if peer else "-"
        lines.append(f"| {kind} | {entry['mirrorbert_packed']['real_tokens_per_s']:,.0f} | "
                     f"{entry['mirrorbert_padded']['real_tokens_per_s']:,.0f} | {peer_cell} | "
                     f"{entry['packed_vs_padded']:.2f}x | {ratio_cell} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--types", default=",".join(SHAPES), help="model types (default: every packed type)")
    parser.add_argument("--peer-types", default="bert,roberta,modernbert,deberta-v2,mpnet",
                        help="types the sentence-transformers peer also runs on")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (+1 warm-up)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", help="write the JSON here as well as to stdout")
    parser.add_argument("--table", help="print the Markdown table of this JSON and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text(encoding="utf-8"))))
        return 0

    import torch

    import mirrorbert

    data_dir = Path(args.data_dir)
    if not (data_dir / CORPUS).exists() or not (data_dir / TOKENIZER).exists():
        print(f"error: needs {data_dir / CORPUS} and {data_dir / TOKENIZER} (--data-dir)", file=sys.stderr)
        return 2
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in args.types.split(","):
            model = build(data_dir, Path(tmp) / model_type, model_type, args.layers, args.hidden)
            results[model_type] = measure(args, model_type, model)
            print(f"{model_type}: {json.dumps(results[model_type])}", file=sys.stderr)
    report = {
        "benchmark": "arch_speed",
        "model": f"random init, {args.layers} layers x {args.hidden} hidden of each type's shape, "
                 "bert-base-uncased vocab",
        "data": CORPUS, "batch_size": args.batch_size, "max_length": args.max_length, "steps_timed": args.steps,
        "repeats": args.repeats, "precision": args.precision, "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "versions": {"mirrorbert": mirrorbert.__version__, "torch": torch.__version__},
        "results": results,
    }
    print_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
