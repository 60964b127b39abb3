"""`mirrorbert search`: nearest corpus entries for one or more queries, printed as JSON lines."""

from __future__ import annotations

import sys
from pathlib import Path

from mirrorbert import jsonio
from mirrorbert.command_options import FAISS_CHOICES, SearchOptions
from mirrorbert.errors import UserError


def add_search_parser(sub) -> None:
    p = sub.add_parser(
        "search", help="find the corpus entries nearest to queries (exact cosine top-k, JSON lines)",
        description="Encode a corpus and queries with a model and print, per query, one JSON line "
                    '{"query": ..., "hits": [{"id": ..., "text": ..., "score": ...}, ...]} (id = corpus line, from 0).',
    )
    p.add_argument("--model", required=True, help="trained folder, sentence-transformers folder, HF MLM or hub id")
    p.add_argument("--corpus", required=True, help="entries to search: .txt (one per line), .csv/.tsv (--column) or .jsonl (--field)")
    p.add_argument("--column", help="column holding the text in a CSV/TSV corpus (and --queries file)")
    p.add_argument("--field", help="field holding the text in a JSONL corpus (and --queries file)")
    p.add_argument("--query", action="append", help="a query string (repeat for several)")
    p.add_argument("--queries", help="file of queries, one per line (.txt; .csv/.tsv/.jsonl with --column/--field)")
    p.add_argument("--top-k", type=int, default=10, help="hits per query (default 10)")
    p.add_argument("--faiss", default="auto", help="use faiss IndexFlatIP: auto (when installed, default) | yes | no; "
                                                  "results are the same either way")
    p.add_argument("--pooling", help="override the saved pooling: cls | mean | first-last")
    p.add_argument("--batch-size", type=int, default=64, help="strings per encoding batch (default 64)")
    p.add_argument("--max-length", type=int, help="truncate inputs to N tokens (default: the model's)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:1 | mps (default auto)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip lines that are not UTF-8 (hit ids still name the corpus's lines)")
    p.add_argument("--no-progress", dest="show_progress", action="store_false", default=True, help="no progress bar")
    p.set_defaults(func=run_search)


def _read_queries(opts: SearchOptions) -> list[str]:
    from mirrorbert.data import read_file

    if opts.query:
        return list(opts.query)
    # --column/--field name the corpus's text; a query file of the same kind uses the same name
    suffix = Path(opts.queries).suffix.lower()
    column = opts.column if suffix in (".csv", ".tsv") else None
    field = opts.field if suffix in (".jsonl", ".json") else None
    queries, _ = read_file(opts.queries, column=column, field=field, skip_bad_lines=opts.skip_bad_lines,
                           option="--queries")
    if not any(q.strip() for q in queries):
        raise UserError(f"--queries {opts.queries}: no queries in the file")
    return queries


def run_search(args) -> int:
    from mirrorbert.data import read_rows
    from mirrorbert.encoder import Encoder

    opts = SearchOptions.from_args(args)  # every value checked here, as in Python
    use_faiss = FAISS_CHOICES[opts.faiss]
    from mirrorbert.training.device import check_device_and_precision

    check_device_and_precision(opts.device)
    if use_faiss:
        from mirrorbert.search import wants_faiss

        wants_faiss(True)  # fails now, not after encoding the corpus
    queries = _read_queries(opts)
    rows = read_rows(opts.corpus, column=opts.column, field=opts.field, skip_bad_lines=opts.skip_bad_lines,
                     option="--corpus")
    corpus = rows.texts
    # blank and skipped lines keep their place in the numbering (a hit's id is its record's index in the
    # file, rows.ids) but are never hits
    kept = [i for i, text in enumerate(corpus) if text.strip()]
    if not kept:
        raise UserError(f"--corpus {opts.corpus}: no entries in the file")
    encoder = Encoder.load(opts.model, pooling=opts.pooling, device=opts.device, max_length=opts.max_length, cli=True)
    index = encoder.build_index([corpus[i] for i in kept], batch_size=opts.batch_size, use_faiss=use_faiss,
                                show_progress=opts.show_progress)
    results = encoder.search(queries, index, top_k=opts.top_k, batch_size=opts.batch_size, use_faiss=use_faiss)
    for query, hits in zip(queries, results):
        hits = [h._replace(corpus_id=rows.ids[kept[h.corpus_id]]) for h in hits]
        sys.stdout.write(jsonio.dumps({"query": query, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False) + "\n")
    return 0
