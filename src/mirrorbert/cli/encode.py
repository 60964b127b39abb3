"""`mirrorbert encode`: strings in, a .npy matrix out (one row per input line), streamed to disk where it can be."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes import WritePlan, atomic_output_file, open_temporary, write_text_atomic
from mirrorbert.settings.choices import ENCODE_QUANTIZATIONS, PRECISIONS
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options

# The --model note of the commands that encode with a model (encode, search, index, export).
ENCODER = "a trained folder, a sentence-transformers folder or a Hugging Face MLM"
TEXT_FILES = ".txt (one per line), .csv/.tsv/.parquet/.arrow/saved datasets folder (--column) or .jsonl (--field)"


@dataclass(kw_only=True)
class EncodeOptions(Options):
    """`mirrorbert encode`'s options, in --help order (settings/fields.py)."""

    model: str | None = option(None, shared="model", note=ENCODER, required=True)
    input: str | None = option(None, help=".txt (one string per line), .csv/.tsv/.parquet/.arrow/saved datasets "
                                          "folder (--column) or .jsonl (--field)", required=True)
    column: str | None = option(None, shared="column", excludes=("field",))
    field: str | None = option(None, shared="field")
    header: bool = option(True, shared="no_header", flag="--no-header")
    output: str | None = option(None, shared="output", note="the vectors (.npy)", required=True)
    overwrite: bool = option(False, shared="overwrite")
    pooling: str | None = option(None, shared="pooling")
    batch_size: int = option(64, shared="batch_size", note="strings per forward pass")
    max_length: int | None = option(None, shared="max_length")
    normalize: bool = option(False, help="L2-normalise the vectors")
    device: str = option("auto", shared="device")
    precision: str = option("fp32", shared="precision", note="not auto here",
                            choices=tuple(p for p in PRECISIONS if p != "auto"))
    packing: str = option("auto", shared="packing")
    quantize: str = option("float32", shared="quantize", note="int8 | uint8 (per-dimension ranges from these "
                                                              "vectors) | binary | ubinary (sign bits, 8 dimensions "
                                                              "per byte): sentence-transformers' quantize_embeddings",
                           choices=ENCODE_QUANTIZATIONS)
    skip_bad_lines: bool = option(False, shared="skip_bad_lines", note="then row i of --output is no longer line i, "
                                  "so the line numbers of the rows go to OUTPUT.rows.json (0-based, as search ids) "
                                  "with the skipped lines")
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress")
    trust_remote_code: bool = option(False, shared="trust_remote_code")

    def rules(self) -> None:
        if self.output is not None and not self.output.endswith(".npy"):
            raise UserError(f"{self.say('output', self.output)}: expected a .npy file name")


def add_encode_parser(sub) -> None:
    command(sub, "encode", run_encode, EncodeOptions,
            summary="encode strings into a .npy matrix (one row per input line)")


def run_encode(args) -> int:
    """Check every option and the outputs first, then stream the vectors to disk (in memory when quantised
    or sharded over torchrun processes); prints one JSON record."""
    import numpy as np

    from mirrorbert.encoder.streaming import chunked_input
    from mirrorbert.runtime.device import check_device_and_precision
    from mirrorbert.runtime.distributed import launch_environment

    opts = options_from_args(EncodeOptions, args)  # every value checked here, as in Python
    output = Path(opts.output)
    rows_file = output.with_name(output.stem + ".rows.json")  # --skip-bad-lines: which input record each row is

    check_device_and_precision(opts.device, opts.precision)
    if opts.quantize != "float32":
        from mirrorbert.search.quantized import st_quantization

        st_quantization()  # installed, before the model loads
    plan = WritePlan({"--input": opts.input, "--model": opts.model}, overwrite=opts.overwrite).file("--output", output)
    if opts.skip_bad_lines:
        plan.file("--output", rows_file)
    with plan.locked():
        source = chunked_input(opts.input, opts.column, opts.field, opts.skip_bad_lines,  # before the model loads
                               header=opts.header)
        if opts.quantize == "float32":  # vectors straight to disk, chunk by chunk (each process its own rows)
            encode_on_disk = _encode_streaming if launch_environment()[0] == 1 else _encode_sharded
            n_rows, dim, pooling = encode_on_disk(opts, source, output)
            if n_rows is None:
                return 0
            dtype = "float32"
        else:  # quantised: the ranges come from all vectors, so they are held in memory
            vectors, pooling = _encode(opts, source)
            if vectors is None:
                return 0
            n_rows, dim = int(vectors.shape[0]), int(vectors.shape[1])
            from mirrorbert.search.quantized import quantize

            vectors = quantize(vectors, opts.quantize)
            with atomic_output_file(output, overwrite=opts.overwrite) as tmp, open_temporary(tmp) as fh:
                np.save(fh, vectors)
            dtype = str(vectors.dtype)
        record = {"output": str(output), "rows": n_rows, "dim": dim, "pooling": pooling,
                  "dtype": dtype, "quantize": opts.quantize}
        if opts.skip_bad_lines:
            rows = source.rows
            skipped, ids = (rows.skipped, rows.ids) if rows is not None else ([], list(range(n_rows)))
            write_text_atomic(rows_file, jsonio.dumps({
                "input": str(opts.input), "output": str(output), "skipped_lines": skipped, "row_ids": ids,
                "row_ids_note": "row i of the matrix is record row_ids[i] of the input (0-based, as search ids); "
                                "skipped_lines are 1-based line numbers"}) + "\n", overwrite=opts.overwrite)
            record.update(skipped_lines=len(skipped), rows_file=str(rows_file))
    print(jsonio.dumps(record))
    return 0


# config.json's architectures of a checkpoint saved with its pre-training head: a language model, not an encoder
PRETRAINING_HEADS = ("ForMaskedLM", "ForPreTraining", "LMHeadModel", "ForCausalLM")


def note_if_untuned(encoder, model: str) -> None:
    """One warning when `model` is a language model never tuned as an encoder (its config names a pre-training
    head and no mirrorbert.json records a training): its vectors work, but poorly for similarity and search."""
    heads = [str(a) for a in getattr(encoder.model.config, "architectures", None) or []
             if str(a).endswith(PRETRAINING_HEADS)]
    if heads and not encoder.training_info:
        logging.getLogger(__name__).warning(
            "--model %s is a language model never tuned as a sentence encoder (%s, no training in mirrorbert.json): "
            "its vectors are poor for similarity and search; tune it first (mirrorbert train --model %s --data "
            "TEXTS --output DIR) or use a sentence encoder", model, heads[0], model)


def load_encoder(opts, device: str):
    """The encoder --model names, with --pooling and --max-length (encode, search, index, export)."""
    from mirrorbert.encoder.model import Encoder

    return Encoder.load(opts.model, pooling=opts.pooling, device=device, max_length=opts.max_length,
                        trust_remote_code=opts.trust_remote_code, cli=True)


def _chunk_encoder(opts, device: str):
    """The encoder --model names, and the function that encodes a list of strings as the options ask."""
    from mirrorbert.encoder.packing import packing_flag

    encoder = load_encoder(opts, device)
    note_if_untuned(encoder, opts.model)

    def encode(chunk: list[str], show_progress: bool = False):
        return encoder.encode(chunk, batch_size=opts.batch_size, normalize=opts.normalize or None,
                              show_progress=show_progress, precision=opts.precision, packing=packing_flag(opts.packing))

    return encoder, encode


def _encode_streaming(opts, source, output: Path):
    """One process: `source` chunk by chunk into OUTPUT's temporary .npy (streaming.py); (rows, dim, pooling)."""
    from mirrorbert.encoder.streaming import encode_to_npy

    encoder, encode = _chunk_encoder(opts, opts.device)
    with atomic_output_file(output, overwrite=opts.overwrite) as tmp:
        rows = encode_to_npy(encode, source, encoder.dim, Path(tmp), show_progress=opts.show_progress, target=output)
    return rows, encoder.dim, encoder.pooling


def _encode_sharded(opts, source, output: Path):
    """Several processes (torchrun): each encodes a contiguous share of the rows into its slice of the output's
    temporary .npy (encoder/sharded.py); rank 0 renames it into place. (None, ...) on other ranks."""
    from mirrorbert.encoder.sharded import encode_sharded, row_range
    from mirrorbert.encoder.streaming import STREAM_ROWS
    from mirrorbert.reporting.progress import progress_bar
    from mirrorbert.runtime.distributed import init_from_env

    dist_ctx = init_from_env(opts.device)
    encoder, encode = _chunk_encoder(opts, str(dist_ctx.device))
    start, stop = row_range(dist_ctx, source.count)
    show = opts.show_progress and dist_ctx.is_main
    with progress_bar(total=stop - start, show=show, desc="encode (rank 0's rows)", unit="string") as bar:
        if not dist_ctx.is_main:
            encode_sharded(dist_ctx, encode, source, encoder.dim, None, output, chunk_rows=STREAM_ROWS)
            return None, encoder.dim, encoder.pooling
        with atomic_output_file(output, overwrite=opts.overwrite) as tmp:
            encode_sharded(dist_ctx, encode, source, encoder.dim, Path(tmp), output, chunk_rows=STREAM_ROWS,
                           on_rows=bar.update)
    return source.count, encoder.dim, encoder.pooling


def _encode(opts, source):
    """The vectors of `source` in memory (None on the other processes of a torchrun job) and the pooling used."""
    from mirrorbert.runtime.distributed import init_from_env, sharded_encoding

    texts = [text for chunk in source.chunks() for text in chunk]
    if not any(t.strip() for t in texts):
        raise UserError(f"--input {opts.input}: no text in the file (every line is blank)")
    dist_ctx = init_from_env(opts.device)  # under torchrun every process encodes a share of the rows
    encoder, encode = _chunk_encoder(opts, str(dist_ctx.device))
    with sharded_encoding(dist_ctx):
        vectors = encode(texts, show_progress=opts.show_progress and dist_ctx.is_main)
    return (vectors if dist_ctx.is_main else None), encoder.pooling
