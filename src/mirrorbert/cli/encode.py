"""`mirrorbert encode`: strings in, a .npy matrix out (one row per input line), streamed to disk where it can be."""

from __future__ import annotations

from pathlib import Path

import mirrorbert.jsonio as jsonio
from mirrorbert.cli import options
from mirrorbert.cli.options import ENCODER, use
from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes import WritePlan, atomic_output_file, open_temporary


def add_encode_parser(sub) -> None:
    """`encode`; its options keep the order of --help."""
    p = sub.add_parser("encode", help="encode strings into a .npy matrix (one row per input line)")
    options.add(p, use("model", required=True, note=ENCODER))
    p.add_argument("--input", required=True, help=".txt (one string per line), .csv/.tsv/.parquet/.arrow/saved datasets folder (--column) or .jsonl (--field)")
    options.add(p, "column", "field", use("output", required=True, note="the vectors (.npy)"), "overwrite", "pooling",
                use("batch_size", note="strings per forward pass"), "max_length")
    p.add_argument("--normalize", action="store_true", help="L2-normalise the vectors")
    options.add(p, "device", use("precision", note="not auto here"), "packing",
                use("quantize", note="int8 | uint8 (per-dimension ranges from these vectors) | binary | ubinary (sign "
                                     "bits, 8 dimensions per byte): sentence-transformers' quantize_embeddings"),
                use("skip_bad_lines", note="then row i of --output is no longer line i, so the line numbers of the "
                                           "rows go to OUTPUT.rows.json (0-based, as search ids) with the skipped lines"),
                "no_progress")
    p.set_defaults(func=run_encode)


def rows_file(output: Path) -> Path:
    """Where `encode --skip-bad-lines` writes which input line each row is (beside the .npy)."""
    return output.with_name(output.stem + ".rows.json")


def run_encode(args) -> int:
    """Check every option and the outputs first, then stream the vectors to disk (in memory when quantised
    or sharded over torchrun processes); prints one JSON record."""
    import numpy as np

    from mirrorbert.cli.typed_options import EncodeOptions
    from mirrorbert.runtime.device import check_device_and_precision

    from mirrorbert.runtime.distributed import launched_world_size

    opts = EncodeOptions.from_args(args)  # every value checked here, as in Python
    output = Path(opts.output)

    check_device_and_precision(opts.device, opts.precision)
    if opts.quantize != "float32":
        from mirrorbert.search.quantized import st_quantization

        st_quantization()  # installed, before the model loads
    plan = WritePlan({"--input": opts.input, "--model": opts.model}, overwrite=opts.overwrite).file("--output", output)
    if opts.skip_bad_lines:
        plan.file("--output", rows_file(output))
    with plan.locked():
        if opts.quantize == "float32":  # vectors straight to disk, chunk by chunk (each process its own rows)
            encode_on_disk = _encode_streaming if launched_world_size() == 1 else _encode_sharded
            n_rows, dim, pooling, rows = encode_on_disk(opts, output)
            if n_rows is None:
                return 0
            dtype = "float32"
        else:  # quantised: the ranges come from all vectors, so they are held in memory
            vectors, pooling, rows = _encode(opts)
            if vectors is None:
                return 0
            n_rows, dim = int(vectors.shape[0]), int(vectors.shape[1])
            if opts.quantize != "float32":
                from mirrorbert.search.quantized import quantize

                vectors = quantize(vectors, opts.quantize)
            with atomic_output_file(output, overwrite=opts.overwrite) as tmp, open_temporary(tmp) as fh:
                np.save(fh, vectors)
            dtype = str(vectors.dtype)
        record = {"output": str(output), "rows": n_rows, "dim": dim, "pooling": pooling,
                  "dtype": dtype, "quantize": opts.quantize}
        if opts.skip_bad_lines:
            skipped, ids = (rows.skipped, rows.ids) if rows is not None else ([], list(range(n_rows)))
            with atomic_output_file(rows_file(output), overwrite=opts.overwrite) as tmp, open_temporary(tmp) as fh:
                fh.write((jsonio.dumps({
                    "input": str(opts.input), "output": str(output), "skipped_lines": skipped,
                    "row_ids": ids,
                    "row_ids_note": "row i of the matrix is record row_ids[i] of the input (0-based, as search ids); "
                                    "skipped_lines are 1-based line numbers",
                }) + "\n").encode("utf-8"))
            record.update(skipped_lines=len(skipped), rows_file=str(rows_file(output)))
    print(jsonio.dumps(record))
    return 0


def _chunk_encoder(opts, device: str):
    """The encoder --model names, and the function that encodes one chunk of strings as the options ask."""
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.packing import packing_flag

    encoder = Encoder.load(opts.model, pooling=opts.pooling, device=device, max_length=opts.max_length,
                           trust_remote_code=opts.trust_remote_code, cli=True)

    def encode(chunk: list[str]):
        return encoder.encode(chunk, batch_size=opts.batch_size, normalize=opts.normalize or None,
                              precision=opts.precision, packing=packing_flag(opts.packing))

    return encoder, encode


def _encode_streaming(opts, output: Path):
    """One process: --input in chunks, the vectors written into OUTPUT's temporary .npy as they come
    (streaming.py); (rows, dim, pooling, the input's skipped lines and record ids)."""
    from mirrorbert.encoder.streaming import chunked_input, encode_to_npy

    source = chunked_input(opts.input, opts.column, opts.field, opts.skip_bad_lines)  # before the model loads
    encoder, encode = _chunk_encoder(opts, opts.device)
    with atomic_output_file(output, overwrite=opts.overwrite) as tmp:
        rows = encode_to_npy(encode, source, encoder.dim, Path(tmp), show_progress=opts.show_progress, target=output)
    return rows, encoder.dim, encoder.pooling, source.rows


def _encode_sharded(opts, output: Path):
    """Several processes (torchrun): each encodes a contiguous share of --input's rows into its slice of the
    output's temporary .npy (encoder/sharded.py); rank 0 renames it into place. (None, ...) on other ranks."""
    from mirrorbert.encoder.sharded import encode_sharded, row_range
    from mirrorbert.encoder.streaming import STREAM_ROWS, chunked_input
    from mirrorbert.reporting.progress import progress_bar
    from mirrorbert.runtime.distributed import init_from_env

    source = chunked_input(opts.input, opts.column, opts.field, opts.skip_bad_lines)  # before the model loads
    dist_ctx = init_from_env(opts.device)
    encoder, encode = _chunk_encoder(opts, str(dist_ctx.device))
    start, stop = row_range(dist_ctx, source.count)
    show = opts.show_progress and dist_ctx.is_main
    with progress_bar(total=stop - start, show=show, desc="encode (rank 0's rows)", unit="string") as bar:
        if not dist_ctx.is_main:
            encode_sharded(dist_ctx, encode, source, encoder.dim, None, output, STREAM_ROWS)
            return None, encoder.dim, encoder.pooling, source.rows
        with atomic_output_file(output, overwrite=opts.overwrite) as tmp:
            encode_sharded(dist_ctx, encode, source, encoder.dim, Path(tmp), output, STREAM_ROWS, bar.update)
    return source.count, encoder.dim, encoder.pooling, source.rows


def _encode(opts):
    """The vectors of --input (None on the other processes of a torchrun job), the pooling used and the rows read."""
    from mirrorbert.data.strings import read_rows
    from mirrorbert.runtime.distributed import init_from_env, sharded_encoding
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.packing import packing_flag

    rows = read_rows(opts.input, column=opts.column, field=opts.field, skip_bad_lines=opts.skip_bad_lines,
                     option="--input")
    texts = rows.texts
    if not any(t.strip() for t in texts):
        raise UserError(f"--input {opts.input}: no text in the file (every line is blank)")
    dist_ctx = init_from_env(opts.device)  # under torchrun every process encodes a share of the rows
    encoder = Encoder.load(opts.model, pooling=opts.pooling, device=str(dist_ctx.device), max_length=opts.max_length,
                           trust_remote_code=opts.trust_remote_code, cli=True)
    with sharded_encoding(dist_ctx):
        vectors = encoder.encode(texts, batch_size=opts.batch_size, normalize=opts.normalize or None,
                                 show_progress=opts.show_progress and dist_ctx.is_main, precision=opts.precision,
                                 packing=packing_flag(opts.packing))
    return (vectors if dist_ctx.is_main else None), encoder.pooling, rows
