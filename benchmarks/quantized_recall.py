"""Recall and speed of quantised search: recall@k of int8 and binary corpus vectors (with float32 rescoring)
against exact float32 search, and against sentence-transformers' own quantised faiss search on the same vectors.

The corpus (default: the first 10,000 lines of corpora/en_wiki_20k_sents.txt) is encoded once through
`mirrorbert index` (the folder `search --index --quantize` reads; `--index DIR` reuses one), the queries are
STS-B test sentences; every side ranks the same L2-normalised vectors. Reported per side: recall@k (the share
of the exact top-k found), bytes per corpus vector, queries per second (median of `--repeats`, sides
alternating), and the ratio to the sentence-transformers side of the same precision.

    python benchmarks/quantized_recall.py --data-dir ../shared/data --output quantized_recall.json
"""

from __future__ import annotations

import argparse
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
from common import (add_search_arguments, build_index_folder, default_model, print_report,  # noqa: E402
                    stsb_query_texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_search_arguments(parser)
    parser.add_argument("--index", help="reuse a `mirrorbert index` folder built with --model")
    args = parser.parse_args(argv)
    if not args.data_dir:
        sys.exit("pass --data-dir (or set MIRRORBERT_DATA)")

    import numpy as np
    import torch

    from mirrorbert.encoder.model import Encoder
    from mirrorbert.search.exact import SearchIndex
    from mirrorbert.search.quantized import hits_as_arrays, st_quantization, quantized_topk

    quantize_embeddings, semantic_search_faiss = (st_quantization().quantize_embeddings,
                                                  st_quantization().semantic_search_faiss)

    data = Path(args.data_dir)
    model = args.model or default_model()
    source = Path(args.corpus or data / "corpora" / "en_wiki_20k_sents.txt")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.index) if args.index else Path(tmp) / "index"
        encode_s = None if args.index else build_index_folder(model, source, args.rows, folder)
        index = SearchIndex.load(folder, use_faiss=False)
    texts = stsb_query_texts(data, args.queries)
    queries = Encoder.load(model, device="cpu").encode(texts, batch_size=64, normalize=True)
    corpus, k = index.vectors, args.top_k
    exact_ids = np.array([[h.corpus_id for h in row] for row in index.search_vectors(queries, k, use_faiss=False)])

    def st_side(precision):
        codes = quantize_embeddings(corpus, precision=precision, calibration_embeddings=corpus)
        ranges = np.vstack([corpus.min(axis=0), corpus.max(axis=0)]) if precision == "uint8" else None
        faiss_index = semantic_search_faiss(queries[:1], corpus_embeddings=codes, corpus_precision=precision,
                                            top_k=k, ranges=ranges, output_index=True)[2]
        return lambda: hits_as_arrays(semantic_search_faiss(queries, corpus_index=faiss_index, corpus_precision=precision,
                                                        top_k=k, ranges=ranges, rescore=True, rescore_multiplier=4)[0],
                                  len(queries), k)[1]

    caches = {"int8": {}, "ubinary": {}}
    sides = {
        "mirrorbert_int8_rescored": (lambda: quantized_topk(queries, corpus, "int8", k, caches["int8"])[1],
                                     corpus.shape[1]),
        "mirrorbert_ubinary_rescored": (lambda: quantized_topk(queries, corpus, "ubinary", k, caches["ubinary"])[1],
                                        (corpus.shape[1] + 7) // 8),
        "sentence_transformers_uint8_faiss": (st_side("uint8"), corpus.shape[1]),
        "sentence_transformers_ubinary_faiss": (st_side("ubinary"), (corpus.shape[1] + 7) // 8),
    }
    sides["mirrorbert_float32_exact"] = (lambda: np.array([[h.corpus_id for h in row] for row in
                                                           index.search_vectors(queries, k, use_faiss=False)]),
                                         4 * corpus.shape[1])
    results, times = {}, {name: [] for name in sides}
    for name, (run, _) in sides.items():  # warm-up (and the quantised indexes built once)
        results[name] = run()
    for _ in range(args.repeats):
        for name, (run, _) in sides.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    report = {
        "benchmark": "quantized_recall", "model": model, "corpus": str(source), "corpus_rows": len(corpus),
        "dim": int(corpus.shape[1]), "queries": len(texts), "top_k": k, "repeats": args.repeats,
        "rescore_multiplier": 4, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "encode_corpus_s": None if encode_s is None else round(encode_s, 3), "sides": {},
    }
    peers = {"int8": "sentence_transformers_uint8_faiss", "ubinary": "sentence_transformers_ubinary_faiss"}
    for name, (_, nbytes) in sides.items():
        qps = len(texts) / statistics.median(times[name])
        entry = {"recall_at_k": round(recall_at_k(exact_ids, results[name]), 4), "bytes_per_vector": int(nbytes),
                 "queries_per_s": round(qps, 1)}
        for precision, peer in peers.items():
            if name.startswith("mirrorbert_" + precision):
                entry["recall_minus_peer"] = round(entry["recall_at_k"] - recall_at_k(exact_ids, results[peer]), 4)
                entry["speed_ratio_to_peer"] = round(qps / (len(texts) / statistics.median(times[peer])), 3)
        report["sides"][name] = entry
    print_report(report, args.output)
    return 0


def recall_at_k(reference_ids, ids) -> float:
    """Mean share of the reference top-k found in the approximate top-k (order ignored)."""
    import numpy as np

    shares = [len(set(r.tolist()) & set(a.tolist())) / max(1, len(r)) for r, a in zip(reference_ids, ids)]
    return float(np.mean(shares)) if shares else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
