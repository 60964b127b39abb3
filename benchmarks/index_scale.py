"""Exact against approximate (IVF) search at scale: recall@10, queries per second, build time and peak memory.

For each size N and dimension (default 100k and 1M rows at 128 and 384 dimensions) a fresh process generates
seeded, clustered unit vectors (N / 100 random unit centres plus Gaussian noise of norm 0.9 whatever the
dimension, then normalised: a row's cosine to its centre is about 0.74, to a row of its cluster about 0.55, to
a random row 0 +- 1/sqrt(dim), so at 1M rows random rows compete with the true neighbours; generated here,
never stored) into a memory-mapped .npy, as `mirrorbert index` leaves them, plus 1,000 held-out queries from the
same distribution. It times the exact search `search --index` does over an exact index (faiss IndexFlatIP
candidates, float64 rescoring) and the approximate one (search/approximate.py: IVF with 8-bit codes at the
default nlist and nprobe, exact rescoring from the memory-mapped vectors), single process, faiss's default
threads, the median of `--repeats` runs alternating sides. Reported: recall@10 of the approximate top-10 against
the exact one (shared ids / 10, averaged over the queries), queries/s of each and their ratio, the IVF build time
(train + assign, and the rebuild `search --index` does at load), the process's peak RSS, and a sweep of nprobe.

`--e2e-rows N` adds `mirrorbert encode` and `mirrorbert index` end to end on N generated strings (sentences of
corpora/en_wiki_20k_sents.txt, each numbered so that every line differs) with a tiny 2-layer BERT on the real
bert-base-uncased tokenizer (data/tokenizers/bert-base-uncased): wall time and each child's own peak RSS.

    python benchmarks/index_scale.py --output index_scale.json
    python benchmarks/index_scale.py --sizes 1000000 --dims 128 --e2e-rows 1000000 --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import child_json, print_report, run_measured  # noqa: E402

NOISE = 0.9  # norm of the noise added to a centre (per dimension: NOISE / sqrt(dim))
ROWS_PER_CENTRE = 100
NPROBE_SWEEP = (8, 16, 32, 64, 128)


def peak_rss_mb(who=resource.RUSAGE_SELF) -> float:
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux: kilobytes


def clustered_npy(path: Path, n: int, dim: int, centres, seed: int, chunk: int = 100_000):
    """n unit vectors around `centres` written chunk by chunk into a .npy; returned memory-mapped."""
    import numpy as np

    out = np.lib.format.open_memmap(str(path), mode="w+", dtype=np.float32, shape=(n, dim))
    rng = np.random.default_rng(seed)
    for r0 in range(0, n, chunk):
        m = min(chunk, n - r0)
        x = centres[rng.integers(0, len(centres), m)] + rng.standard_normal((m, dim), dtype=np.float32) * (NOISE / dim ** 0.5)
        out[r0:r0 + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    del out
    return np.load(path, mmap_mode="r")


def recall_at_k(found, truth) -> float:
    """Share of the exact top-k ids found (sets: tied scores cannot change it)."""
    return round(sum(len(set(a) & set(b)) for a, b in zip(found.tolist(), truth.tolist())) / truth.size, 4)


def timed(fn, repeats: int) -> tuple[float, object]:
    result, times = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def one_size(n: int, dim: int, queries_n: int, top_k: int, repeats: int) -> dict:
    """Everything for one (N, dim), in this (fresh) process."""
    import faiss
    import numpy as np

    from mirrorbert.search.approximate import IVFIndex, ivf_from_parts, train_ivf
    from mirrorbert.search.exact import build_faiss_index, chunked_topk

    centres = np.random.default_rng(0).standard_normal((max(10, n // ROWS_PER_CENTRE), dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        keys = clustered_npy(Path(tmp) / "vectors.npy", n, dim, centres, seed=1)
        queries = np.ascontiguousarray(clustered_npy(Path(tmp) / "q.npy", queries_n, dim, centres, seed=2))
        generate_s = time.perf_counter() - start
        rss_before_build = peak_rss_mb()
        start = time.perf_counter()
        parts = train_ivf(keys)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        ivf = IVFIndex(ivf_from_parts(keys, parts), parts)
        load_s = time.perf_counter() - start
        rss_ivf = peak_rss_mb()
        flat = build_faiss_index(keys)
        exact = lambda: chunked_topk(queries, keys, top_k, faiss_index=flat)  # noqa: E731
        approx = lambda: ivf.topk(queries, keys, top_k)  # noqa: E731
        exact(), approx()  # warm-up: pages of the memory map, faiss threads
        exact_times, approx_times = [], []
        for _ in range(repeats):  # alternating, so that load from others hits both sides alike
            exact_times.append(timed(exact, 1)[0])
            approx_times.append(timed(approx, 1)[0])
        truth, found = exact()[1], approx()[1]
        exact_qps = queries_n / statistics.median(exact_times)
        approx_qps = queries_n / statistics.median(approx_times)
        sweep = {}
        for nprobe in NPROBE_SWEEP:
            if nprobe <= parts.nlist:
                median, (_, ids) = timed(lambda: ivf.topk(queries, keys, top_k, nprobe=nprobe), repeats)
                sweep[str(nprobe)] = {"recall_at_10": recall_at_k(ids, truth),
                                      "queries_per_s": round(queries_n / median, 1)}
        del flat
    return {
        "rows": n, "dim": dim, "queries": queries_n, "top_k": top_k, "nlist": parts.nlist, "nprobe": parts.nprobe,
        "faiss_threads": faiss.omp_get_max_threads(), "generate_s": round(generate_s, 2),
        "recall_at_10": recall_at_k(found, truth),
        "exact_queries_per_s": round(exact_qps, 1), "ivf_queries_per_s": round(approx_qps, 1),
        "speedup": round(approx_qps / exact_qps, 2),
        "ivf_train_and_assign_s": round(train_s, 2), "ivf_rebuild_at_load_s": round(load_s, 2),
        "ivf_codes_mb": round(n * dim / 2**20, 1), "vectors_float32_mb": round(n * dim * 4 / 2**20, 1),
        "peak_rss_mb_before_ivf": rss_before_build, "peak_rss_mb_after_ivf": rss_ivf,
        "peak_rss_mb_with_exact_flat_index": peak_rss_mb(), "nprobe_sweep": sweep,
    }


def tiny_model(folder: Path, data_dir: Path) -> Path:
    """A 2-layer BERT (hidden 128) on the real bert-base-uncased tokenizer, randomly initialised (seeded)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(data_dir / "tokenizers" / "bert-base-uncased")
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=512)
    BertModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run_child(cmd: list[str]) -> tuple[float, float, str]:
    """A command in a child process: its wall time, its own peak RSS in MB and its standard output."""
    run = run_measured(cmd)
    return run["wall_s"], run["peak_rss_gb"] * 1e9 / 2**20, run["stdout"]


def end_to_end(rows: int, data_dir: Path) -> dict:
    """`mirrorbert encode` and `mirrorbert index` on `rows` generated lines, each in a child process: wall time
    and that child's peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = (data_dir / "corpora" / "en_wiki_20k_sents.txt").read_text(encoding="utf-8").splitlines()
        source = [line for line in source if line.strip()]
        with open(tmp / "corpus.txt", "w", encoding="utf-8") as fh:
            for i in range(rows):  # deterministic: sentence i mod len, numbered so that every line differs
                fh.write(f"{source[i % len(source)]} ({i // len(source)})\n")
        model = tiny_model(tmp / "model", data_dir)
        common = ["--model", str(model), "--no-progress", "--device", "cpu", "--batch-size", "256"]
        encode_wall, encode_rss, _ = run_child([sys.executable, "-m", "mirrorbert", "encode", *common, "--input",
                                                str(tmp / "corpus.txt"), "--output", str(tmp / "vectors.npy")])
        (tmp / "vectors.npy").unlink()
        wall, rss, stdout = run_child([sys.executable, "-m", "mirrorbert", "index", *common, "--corpus",
                                       str(tmp / "corpus.txt"), "--output", str(tmp / "index")])
        return {"rows": rows, "encode_wall_s": round(encode_wall, 1), "encode_peak_rss_mb": round(encode_rss, 1),
                "wall_s": round(wall, 1), "child_peak_rss_mb": round(rss, 1),
                "index": json.loads(stdout.strip().splitlines()[-1]),
                "index_folder_mb": round(sum(p.stat().st_size for p in (tmp / "index").iterdir()) / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="corpus sizes, comma-separated")
    parser.add_argument("--dims", default="128,384", help="dimensions, comma-separated")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side; median reported (default 3)")
    parser.add_argument("--e2e-rows", type=int, default=0, help="also `mirrorbert encode` and `index` on this many strings")
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"), help="the data directory (--e2e-rows)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # N,dim: one size in this process (the child side)
    parser.add_argument("--output", help="write the JSON here (also printed)")
    args = parser.parse_args(argv)
    if args.one:
        n, dim = map(int, args.one.split(","))
        print(json.dumps(one_size(n, dim, args.queries, args.top_k, args.repeats)))
        return 0
    report = {"benchmark": "index_scale", "cpu": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "noise_norm": NOISE, "rows_per_centre": ROWS_PER_CENTRE, "sizes": []}
    for n in (map(int, args.sizes.split(",")) if args.sizes else ()):  # --sizes "": the end-to-end run only
        for dim in map(int, args.dims.split(",")):
            cmd = [sys.executable, __file__, "--one", f"{n},{dim}", "--queries", str(args.queries),
                   "--top-k", str(args.top_k), "--repeats", str(args.repeats)]
            report["sizes"].append(child_json(cmd, f"size {n} x {dim}"))
            print(json.dumps(report["sizes"][-1]), file=sys.stderr)
    if args.e2e_rows:
        if not args.data_dir:
            sys.exit("--e2e-rows needs --data-dir (or MIRRORBERT_DATA)")
        report["end_to_end_index"] = end_to_end(args.e2e_rows, Path(args.data_dir))
    print_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
