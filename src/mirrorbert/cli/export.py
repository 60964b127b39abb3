"""`mirrorbert export`: a saved model, or any encoder mirrorbert loads, as ONNX / OpenVINO for serving."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.encode import ENCODER, load_encoder
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.settings.choices import DEFAULT_ONNX_OPSET, EXPORT_FORMATS, EXPORT_MIN_COSINE
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options


@dataclass(kw_only=True)
class ExportOptions(Options):
    """`mirrorbert export`'s options, in --help order (settings/fields.py)."""

    model: str | None = option(None, shared="model", note=ENCODER, required=True)
    output: str | None = option(None, shared="output", note="a folder: the saved model plus the exported graphs",
                                required=True)
    format: str = option("onnx", help=f"{' | '.join(EXPORT_FORMATS)} | onnx,openvino")
    opset: int = option(DEFAULT_ONNX_OPSET, help="ONNX opset version (14-23)", range="[14, 23]")
    pooling: str | None = option(None, shared="pooling")
    max_length: int | None = option(None, shared="max_length")
    overwrite: bool = option(False, shared="overwrite")
    trust_remote_code: bool = option(False, shared="trust_remote_code")

    def rules(self) -> None:
        from mirrorbert.encoder.export import parse_formats  # numpy-free at import: parse_formats is plain Python

        self.formats = parse_formats(self.format, self.say("format"))  # each once, in a fixed order


def add_export_parser(sub) -> None:
    command(sub, "export", run_export, ExportOptions,
            summary="export an encoder to ONNX / OpenVINO for serving",
            description="Write OUTPUT as the saved model plus onnx/model.onnx (and openvino/openvino_model.xml): "
                        "loadable by SentenceTransformer(OUTPUT, backend='onnx'|'openvino') where optimum is "
                        "installed, by onnxruntime/OpenVINO directly (mirrorbert.encoder.export.ExportedEncoder), and "
                        "by PyTorch as before. The graph returns last_hidden_state and sentence_embedding (the "
                        "model's pooling); the export is refused if its vectors' cosine to PyTorch's falls below "
                        f"{EXPORT_MIN_COSINE} on probe strings.")


def run_export(args) -> int:
    from mirrorbert.errors import UserError
    from mirrorbert.encoder.export import check_export_packages
    from mirrorbert.safeguards.writes import WritePlan, atomic_output_dir

    opts = options_from_args(ExportOptions, args)  # every value checked, as in Python
    check_export_packages(opts.formats)  # before the model loads
    with WritePlan({"--model": opts.model}, overwrite=opts.overwrite).folder("--output", opts.output).locked():
        from mirrorbert.encoder.export import ExportMismatch, write_export

        encoder = load_encoder(opts, "cpu")
        print(f"exporting {opts.model} ({encoder.pooling} pooling) to {', '.join(opts.formats)} -> {opts.output}",
              file=sys.stderr)
        with atomic_output_dir(opts.output, overwrite=opts.overwrite, kind="export") as tmp:
            try:
                record = write_export(encoder, tmp, opts.formats, opts.opset)
            except ExportMismatch as exc:
                raise UserError(f"--model {opts.model}: {exc}; nothing written") from None
    print(jsonio.dumps({"output": str(opts.output), **{k: record[k] for k in (
        "formats", "files", "pooling", "dim", "parity_min_cosine", "sentence_transformers_backend")}}, indent=2))
    return 0
