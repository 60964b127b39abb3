"""`mirrorbert search`: nearest corpus entries for one or more queries, printed as JSON lines."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.encode import ENCODER, TEXT_FILES, load_encoder
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.errors import UserError
from mirrorbert.settings.choices import AUTO_IVF_ROWS, INDEX_TYPES, SEARCH_QUANTIZATIONS
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options

HIT_IDS = "hit ids still name the corpus's lines"
FAISS_CHOICES = {"auto": None, "yes": True, "no": False}


@dataclass(kw_only=True)
class SearchOptions(Options):
    """`mirrorbert search`'s options, in --help order (settings/fields.py)."""

    model: str | None = option(None, shared="model", note=f"{ENCODER}; required with --corpus; with --index, the "
                               "model its manifest names when left out (checked against the manifest either way)")
    corpus: str | None = option(None, shared="corpus", note=f"the entries to search: {TEXT_FILES}; with --index: the "
                                "corpus the index was built from, checked unchanged")
    index: str | None = option(None, help="answer from a folder written by `mirrorbert index` (no corpus encoding), "
                                          "with the model its manifest names unless --model is given; refused if the "
                                          "model or the corpus changed since")
    column: str | None = option(None, shared="column", note="also of a --queries file")
    field: str | None = option(None, shared="field", note="also of a --queries file")
    header: bool = option(True, shared="no_header", flag="--no-header", note="also of a --queries file")
    query: list[str] | None = option(None, help="a query string (repeat for several)", repeat=True)
    queries: str | None = option(None, help="file of queries, one per line (.txt; .csv/.tsv/.jsonl with "
                                            "--column/--field)")
    top_k: int = option(10, help="hits per query", range="[1, inf)")
    faiss: str = option("auto", help="use faiss IndexFlatIP: auto (when installed) | yes | no; results are the same "
                                     "either way; with an approximate (ivf) --index, no scans every vector exactly "
                                     "instead", choices=tuple(FAISS_CHOICES))
    nprobe: int | None = option(None, shared="nprobe", note="with an approximate (ivf) --index, set per search: 1 "
                                                             "to the index's nlist")
    pooling: str | None = option(None, shared="pooling")
    batch_size: int = option(64, shared="batch_size", note="strings per forward pass")
    max_length: int | None = option(None, shared="max_length")
    device: str = option("auto", shared="device")
    quantize: str = option("float32", shared="quantize", note="int8 | ubinary: candidates from the quantised corpus, "
                           "rescored with the float query (scores are then not exact cosines); needs faiss",
                           choices=SEARCH_QUANTIZATIONS)
    skip_bad_lines: bool = option(False, shared="skip_bad_lines", note=HIT_IDS)
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress")
    trust_remote_code: bool = option(False, shared="trust_remote_code")

    def rules(self) -> None:
        if self.corpus is None and self.index is None:
            raise UserError(f"search needs {self.say('corpus')} (the entries to search) or {self.say('index')} (a "
                            "folder written by `mirrorbert index`)")
        if self.model is None and self.index is None:
            raise UserError(f"{self.say('model')} is required to encode {self.say('corpus')} (an {self.say('index')} "
                            "names its own model)")
        if self.model is None and self.trust_remote_code:  # trust goes to a model the user names, never a folder's
            raise UserError(f"{self.say('trust_remote_code')} with {self.say('index')} needs {self.say('model')}: "
                            "the model you trust to run its code, not the one the index's manifest names")
        if bool(self.query) == bool(self.queries):
            raise UserError(f"give either {self.say('query')} TEXT (repeatable) or {self.say('queries')} FILE")
        # --nprobe is for the lists of an approximate --index (checked against its manifest when it is opened)
        if self.nprobe is not None and self.index is None:
            raise UserError(f"{self.say('nprobe')} applies to an approximate {self.say('index')} (index --index-type "
                            f"ivf); a {self.say('corpus')} search is exact")
        if self.nprobe is not None and self.faiss == "no":
            raise UserError(f"{self.say('nprobe')} with {self.say('faiss', 'no')}: an exact scan reads every vector, "
                            "it probes no lists; leave one of them out")
        if self.nprobe is not None and self.quantize != "float32":
            raise UserError(f"{self.say('nprobe')} with {self.say('quantize', self.quantize)}: quantised candidates "
                            "come from a scan of every code, not from the index's lists; leave one of them out")


def add_search_parser(sub) -> None:
    command(sub, "search", run_search, SearchOptions,
            summary="find the corpus entries nearest to queries (exact cosine top-k, JSON lines)",
            description="Encode a corpus and queries with a model and print, per query, one JSON line "
                        '{"query": ..., "hits": [{"id": ..., "text": ..., "score": ...}, ...]} (id = corpus line, '
                        "from 0).")


def _read_queries(opts: SearchOptions) -> list[str]:
    from mirrorbert.data.readers import CSV_SUFFIXES
    from mirrorbert.data.strings import read_rows
    from mirrorbert.data.hf_datasets import is_table

    if opts.query:
        return list(opts.query)
    # --column/--field name the corpus's text; a query file of the same kind uses the same name
    suffix = Path(opts.queries).suffix.lower()
    column = opts.column if suffix in CSV_SUFFIXES or is_table(Path(opts.queries)) else None
    field = opts.field if suffix in (".jsonl", ".json") else None
    queries = read_rows(opts.queries, column=column, field=field, skip_bad_lines=opts.skip_bad_lines,
                        option="--queries", header=opts.header or suffix not in CSV_SUFFIXES).texts
    if not any(q.strip() for q in queries):
        raise UserError(f"--queries {opts.queries}: no queries in the file")
    return queries


def _corpus_stream(opts):
    """The corpus, streamed: (ids of the non-blank records as int64, their count, a function walking their strings
    chunk by chunk). Nothing held scales with the corpus but the ids (8 bytes a row)."""
    import numpy as np

    from mirrorbert.data.readers import chunked
    from mirrorbert.encoder.streaming import STREAM_ROWS, chunked_input
    from mirrorbert.search.exact import is_entry

    source = chunked_input(opts.corpus, opts.column, opts.field, opts.skip_bad_lines, option="--corpus",
                           header=opts.header)
    record_ids = np.asarray(source.rows.ids if source.rows is not None and source.rows.skipped
                            else np.arange(source.count), dtype=np.int64)
    keep = np.zeros(source.count, dtype=bool)
    offset = 0
    for chunk in source.chunks():  # blank records keep their place in the numbering but are never hits
        keep[offset:offset + len(chunk)] = [is_entry(text) for text in chunk]
        offset += len(chunk)
    if not keep.any():
        raise UserError(f"--corpus {opts.corpus}: no entries in the file")

    def texts():
        return chunked((text for chunk in source.chunks() for text in chunk if is_entry(text)), STREAM_ROWS)

    return record_ids[keep], int(keep.sum()), texts


def run_search(args) -> int:
    opts = options_from_args(SearchOptions, args)  # every value checked here, as in Python
    use_faiss = FAISS_CHOICES[opts.faiss]
    from mirrorbert.runtime.device import check_device_and_precision

    check_device_and_precision(opts.device)
    if use_faiss or opts.quantize != "float32":
        from mirrorbert.search.exact import wants_faiss

        wants_faiss(True)  # fails now, not after encoding the corpus
    if opts.quantize != "float32":
        from mirrorbert.search.quantized import st_quantization

        st_quantization()
    queries = _read_queries(opts)
    from mirrorbert.search.exact import build_index, search

    if opts.index:
        encoder, index = _open_index(opts, use_faiss)
        ids = None  # the index's hits carry their records' ids (ids.npy)
        results = search(encoder, queries, index, top_k=opts.top_k, batch_size=opts.batch_size, use_faiss=use_faiss,
                         quantize=opts.quantize, nprobe=opts.nprobe)
    elif opts.quantize == "float32":
        results, ids = _search_streamed(opts, queries, use_faiss)
    else:  # quantisation ranges come from the whole corpus's vectors: it is encoded whole
        ids, _, texts = _corpus_stream(opts)
        encoder = load_encoder(opts, opts.device)
        index = build_index(encoder, [text for chunk in texts() for text in chunk], batch_size=opts.batch_size,
                            use_faiss=use_faiss, show_progress=opts.show_progress)
        results = search(encoder, queries, index, top_k=opts.top_k, batch_size=opts.batch_size, use_faiss=use_faiss,
                         quantize=opts.quantize)
    from mirrorbert.data.readers import json_safe_line

    for query, hits in zip(queries, results):
        if ids is not None:
            hits = [h._replace(corpus_id=int(ids[h.corpus_id])) for h in hits]
        line = jsonio.dumps({"query": query, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False)
        sys.stdout.write(json_safe_line(line) + "\n")  # texts come from files: inert on a terminal
    return 0


def _open_index(opts, use_faiss):
    """(encoder, index) of `--index`, checked against what it claims: the manifest and the corpus before any weight
    loads, --pooling/--max-length, then the files (and --corpus), then a few stored vectors against the model."""
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.safeguards.preflight import check_max_length, check_model_exists
    from mirrorbert.search.exact import SearchIndex
    from mirrorbert.search.index_claims import MANIFEST, check_index, check_settings
    from mirrorbert.search.index_store import check_vectors_match_model, read_index

    folder = Path(opts.index)
    if opts.model is not None:
        check_model_exists(opts.model)  # a mistyped folder is "no such folder", not "another model"
    manifest = check_index(folder, opts.model, opts.corpus)  # before any weight loads
    model = opts.model if opts.model is not None else manifest.model
    if opts.nprobe is not None:
        from mirrorbert.search.approximate import check_query_nprobe

        check_query_nprobe(opts.nprobe, manifest.ivf["nlist"] if manifest.ivf else None, where=f"--index {folder}")
    check_settings(manifest, folder, opts.pooling, opts.max_length)
    try:  # a model the manifest names is named so in any error (the user gave no --model)
        encoder = Encoder.load(model, pooling=manifest.pooling, device=opts.device,
                               trust_remote_code=opts.trust_remote_code, cli=True)
    except UserError as exc:
        if opts.model is not None or not str(exc).startswith("--model "):
            raise
        raise UserError(f"--index {folder}: {MANIFEST} names the model " + str(exc)[len("--model "):]) from None
    check_max_length(manifest.max_length, encoder.model.config, f"--index {folder / MANIFEST}: max_length",
                     str(model))
    encoder.max_length = manifest.max_length  # what the vectors were encoded with
    index = SearchIndex(**read_index(folder, manifest, use_faiss, corpus=opts.corpus,
                                     skip_bad_lines=opts.skip_bad_lines))
    check_vectors_match_model(encoder, index, folder)
    return encoder, index


def _search_streamed(opts, queries: list[str], use_faiss):
    """`--corpus` without `--index`: the corpus encoded a chunk at a time into a running exact top-k (only a chunk
    is ever held; the same hits as encoding it whole)."""
    from mirrorbert.reporting.progress import progress_bar
    from mirrorbert.search.streaming import RunningTopK

    ids, rows, texts = _corpus_stream(opts)  # the file is read and checked before the model loads
    encoder = load_encoder(opts, opts.device)
    running = RunningTopK(encoder.encode(queries, batch_size=opts.batch_size, normalize=True), opts.top_k,
                          use_faiss)
    with progress_bar(total=rows, desc="corpus", unit="row", show=opts.show_progress) as bar:
        for chunk in texts():
            running.add(encoder.encode(chunk, batch_size=opts.batch_size, normalize=True), chunk)
            bar.update(len(chunk))
    return running.hits(), ids


@dataclass(kw_only=True)
class IndexOptions(Options):
    """`mirrorbert index`'s options, in --help order (settings/fields.py)."""

    model: str | None = option(None, shared="model", note=ENCODER, required=True)
    corpus: str | None = option(None, shared="corpus", note=f"the entries to index: {TEXT_FILES}", required=True)
    output: str | None = option(None, shared="output", note="the index folder", required=True)
    overwrite: bool = option(False, shared="overwrite")
    column: str | None = option(None, shared="column", excludes=("field",))
    field: str | None = option(None, shared="field")
    header: bool = option(True, shared="no_header", flag="--no-header", note="recorded in the index")
    pooling: str | None = option(None, shared="pooling", note="recorded in the index")
    batch_size: int = option(64, shared="batch_size", note="strings per forward pass")
    max_length: int | None = option(None, shared="max_length")
    device: str = option("auto", shared="device")
    skip_bad_lines: bool = option(False, shared="skip_bad_lines", note=HIT_IDS)
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress")
    index_type: str = option("auto", help=f"exact (a scan: exact hits) | ivf (approximate: faiss IVF with 8-bit "
                             f"codes, candidates rescored exactly; needs faiss) | auto (default: exact below "
                             f"{AUTO_IVF_ROWS:,} rows, ivf from there on when faiss is installed)", choices=INDEX_TYPES)
    nprobe: int | None = option(None, shared="nprobe", note="recorded in the index as the default of search --index, "
                                                             "which can set it per search")
    trust_remote_code: bool = option(False, shared="trust_remote_code")

    def rules(self) -> None:
        if self.nprobe is not None and self.index_type == "exact":
            raise UserError(f"{self.say('nprobe')} applies to an approximate index ({self.say('index_type')} ivf or "
                            "auto), not exact")
        if self.corpus is not None and self.corpus.startswith("hf:"):
            raise UserError(f"{self.say('corpus', self.corpus)}: an index needs a local corpus (its checksum and row "
                            "count go into the manifest, so search --index can tell when it changed); save the "
                            "dataset to Parquet first (Dataset.to_parquet) and index that")


def add_index_parser(sub) -> None:
    command(sub, "index", run_index, IndexOptions,
            summary="encode a corpus once into a search index folder (for search --index)",
            description="Encode a corpus with a model and write a folder `mirrorbert search --index DIR` answers "
                        "from: vectors, texts, line ids, a faiss index when installed, and a manifest with the "
                        "model's fingerprint and the corpus's SHA-256 (a changed model or corpus is refused). The "
                        "vectors are encoded straight to disk and memory-mapped when searched.")


def run_index(args) -> int:
    """Read the corpus, then encode it chunk by chunk into the index folder's vectors.npy (a memory-mapped
    file, encoder/streaming.py) and build the index from that file: no step holds all the vectors in memory."""
    from mirrorbert.search.approximate import resolve_index_type
    from mirrorbert.search.exact import faiss_available
    from mirrorbert.search.fingerprints import corpus_digest, corpus_size, model_fingerprint
    from mirrorbert.search.index_claims import Manifest
    from mirrorbert.safeguards.writes import WritePlan
    from mirrorbert.runtime.device import check_device_and_precision

    opts = options_from_args(IndexOptions, args)
    check_device_and_precision(opts.device)
    resolve_index_type(opts.index_type, 0, faiss_available())  # ivf without faiss: refused before any work
    plan = WritePlan({"--corpus": opts.corpus, "--model": opts.model}, overwrite=opts.overwrite)
    with plan.folder("--output", opts.output).locked():
        ids, rows, texts = _corpus_stream(opts)
        fingerprint = model_fingerprint(opts.model)  # before encoding: the files the vectors come from
        encoder = load_encoder(opts, opts.device)
        corpus_sha256, corpus_lines = corpus_digest(Path(opts.corpus))
        # a local folder by its absolute path (a search may run from another folder), a hub id as given
        model = str(Path(opts.model).resolve()) if Path(opts.model).is_dir() else opts.model
        manifest = Manifest(
            model=model, model_sha256=fingerprint, pooling=encoder.pooling,
            max_length=encoder.max_length,
            corpus=str(Path(opts.corpus).resolve()), corpus_sha256=corpus_sha256,
            corpus_lines=corpus_lines, rows=rows, dim=int(encoder.dim),
            column=opts.column, field=opts.field, header=opts.header, corpus_bytes=corpus_size(Path(opts.corpus)),
            index_type=resolve_index_type(opts.index_type, rows, faiss_available()))
        _write_index_folder(opts, encoder, texts, ids, manifest)
    print(jsonio.dumps({"output": str(opts.output), "rows": manifest.rows, "dim": manifest.dim,
                        "pooling": manifest.pooling, "faiss": manifest.faiss, "index_type": manifest.index_type,
                        **({"nlist": manifest.ivf["nlist"], "nprobe": manifest.ivf["nprobe"]} if manifest.ivf else {})}))
    return 0


def _write_index_folder(opts, encoder, texts, ids, manifest) -> None:
    """The vectors encoded into the temporary folder's vectors.npy, L2-normalised as `search --corpus`
    normalises them, then the rest of the index beside them; the folder replaces --output in one rename."""
    from mirrorbert.encoder.streaming import ChunkedInput, encode_to_npy
    from mirrorbert.safeguards.writes import atomic_output_dir
    from mirrorbert.search.exact import l2_normalize
    from mirrorbert.search.index_store import write_index

    def encode(chunk: list[str]):
        return l2_normalize(encoder.encode(chunk, batch_size=opts.batch_size, normalize=True))

    source = ChunkedInput(manifest.rows, texts)  # `texts` walks the corpus's non-blank strings, chunk by chunk
    with atomic_output_dir(opts.output, overwrite=opts.overwrite, kind="index") as tmp:
        encode_to_npy(encode, source, manifest.dim, Path(tmp) / "vectors.npy", show_progress=opts.show_progress,
                      what="--corpus", target=Path(opts.output) / "vectors.npy")
        write_index(Path(tmp), (text for chunk in texts() for text in chunk), ids, manifest, nprobe=opts.nprobe)
