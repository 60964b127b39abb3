"""Training throughput: Mirror-BERT (`mirrorbert.train`) vs the sentence-transformers SimCSE recipe.

Both sides Mirror-tune the same BERT-base-sized model (random weights: only speed is measured) on the
paper's 10k STS-B training sentences, batch 200 strings, max length 50, on the same device and precision,
in the same process. The peer is what users would otherwise write: sentence-transformers'
MultipleNegativesRankingLoss over (s, s) pairs, i.e. the unsupervised SimCSE recipe, driven by a plain
optimisation loop (no Trainer overhead, so the comparison is of the training step itself), fed exactly the
batches our trainer draws.

Reported per precision: strings/s and real (non-padding) tokens/s of each side, and our/peer ratios.
The first step of each side is a warm-up and is not timed.

    python benchmarks/train_speed.py --data-dir ../shared/data --steps 4 --output train_speed.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPUS = "corpora/stsbenchmark_train_10k_sents_random_sampled.txt"
TOKENIZER = "tokenizers/bert-base-uncased"


def build_model(data_dir: Path, folder: Path, layers: int, hidden: int) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(data_dir / TOKENIZER)
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def ours(model: Path, data: Path, out: Path, steps: int, precision: str, batch: int, max_length: int) -> dict:
    from mirrorbert.config import TrainConfig
    from mirrorbert.trainer import train

    cfg = TrainConfig(model=str(model), data=str(data), output=str(out), preset="sentence", pooling="cls",
                      batch_size=batch, max_length=max_length, steps=steps + 1, precision=precision,
                      device="cpu", show_progress=False, overwrite=True)
    result = train(cfg)
    timed = result.step_log[1:]
    return summarise([t for t, _, _ in timed], [s for _, s, _ in timed], [k for _, _, k in timed])


def same_batches(data: Path, steps: int, batch: int, seed: int = 42) -> list[list[str]]:
    """The exact batches `mirrorbert.train` draws first (same dedup, same seeded order), so both sides
    pad and process identical inputs: step time depends strongly on each batch's longest string."""
    from mirrorbert.data import load_training_strings
    from mirrorbert.trainer import _Plan

    strings = load_training_strings(data=str(data), seed=seed).strings
    order = _Plan(len(strings), batch, 0, seed).epoch_batches(0)
    return [[strings[i] for i in index] for index in order[: steps + 1]]


def peer(model: Path, batches: list[list[str]], steps: int, precision: str, batch: int, max_length: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer, models
    from sentence_transformers.sentence_transformer import losses

    from mirrorbert.runtime import autocast

    word = models.Transformer(str(model), max_seq_length=max_length)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    pooling = models.Pooling(dim(), pooling_mode="cls")
    st = SentenceTransformer(modules=[word, pooling], device="cpu")
    st.train()
    loss_fn = losses.MultipleNegativesRankingLoss(st, scale=1 / 0.04)
    optimizer = torch.optim.AdamW(st.parameters(), lr=2e-5, weight_decay=0.01)
    device = torch.device("cpu")
    times, counts, tokens = [], [], []
    for step in range(steps + 1):
        chunk = batches[step]
        start = time.perf_counter()
        tokenize = getattr(st, "preprocess", None) or st.tokenize
        features = [tokenize(chunk), tokenize(chunk)]
        with autocast(device, precision):
            loss = loss_fn(features, torch.empty(0))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step > 0:
            times.append(elapsed)
            counts.append(len(chunk))
            tokens.append(int(sum(f["attention_mask"].sum() for f in features)))
    return summarise(times, counts, tokens)


def summarise(times: list[float], strings: list[int], tokens: list[int]) -> dict:
    total = sum(times)
    return {
        "steps_timed": len(times),
        "seconds_per_step_median": round(statistics.median(times), 4),
        "strings_per_s": round(sum(strings) / total, 2),
        "real_tokens_per_s": round(sum(tokens) / total, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA", "../shared/data"))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side and precision (+1 warm-up)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--output", help="write the JSON here as well as to stdout")
    args = parser.parse_args(argv)

    import torch

    import mirrorbert

    data_dir = Path(args.data_dir)
    data = data_dir / CORPUS
    if not data.exists() or not (data_dir / TOKENIZER).exists():
        print(f"error: needs {data} and {data_dir / TOKENIZER} (--data-dir)", file=sys.stderr)
        return 2
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(data_dir, Path(tmp) / "model", args.layers, args.hidden)
        for precision in args.precisions.split(","):
            ours_r = ours(model, data, Path(tmp) / f"out-{precision}", args.steps, precision,
                          args.batch_size, args.max_length)
            gc.collect()  # free our run's activations before the peer's (both peak near 20 GB at BERT-base)
            peer_r = peer(model, same_batches(data, args.steps, args.batch_size), args.steps, precision,
                          args.batch_size, args.max_length)
            gc.collect()
            results[precision] = {
                "mirrorbert": ours_r,
                "sentence_transformers_mnrl": peer_r,
                "ratio_strings_per_s": round(ours_r["strings_per_s"] / peer_r["strings_per_s"], 3),
                "ratio_real_tokens_per_s": round(ours_r["real_tokens_per_s"] / peer_r["real_tokens_per_s"], 3),
            }
    report = {
        "benchmark": "train_speed",
        "model": f"BERT L{args.layers}/H{args.hidden}, random init, bert-base-uncased vocab",
        "data": CORPUS,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "versions": {"mirrorbert": mirrorbert.__version__, "torch": torch.__version__},
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
