"""`mirrorbert export`: a saved model, or any encoder mirrorbert loads, as ONNX / OpenVINO for serving."""

from __future__ import annotations

import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli import options
from mirrorbert.cli.options import ENCODER, use
from mirrorbert.settings.choices import DEFAULT_ONNX_OPSET, EXPORT_FORMATS, EXPORT_MIN_COSINE


def add_export_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="export an encoder to ONNX / OpenVINO for serving",
        description="Write OUTPUT as the saved model plus onnx/model.onnx (and openvino/openvino_model.xml): "
                    "loadable by SentenceTransformer(OUTPUT, backend='onnx'|'openvino') where optimum is "
                    "installed, by onnxruntime/OpenVINO directly (mirrorbert.encoder.export.ExportedEncoder), and by "
                    "PyTorch as before. The graph returns last_hidden_state and sentence_embedding (the "
                    f"model's pooling); the export is refused if its vectors' cosine to PyTorch's falls below "
                    f"{EXPORT_MIN_COSINE} on probe strings.")
    options.add(p, use("model", required=True, note=ENCODER),
                use("output", required=True, note="a folder: the saved model plus the exported graphs"))
    p.add_argument("--format", default="onnx", help=f"{' | '.join(EXPORT_FORMATS)} | onnx,openvino")
    p.add_argument("--opset", type=int, default=DEFAULT_ONNX_OPSET, help="ONNX opset version (14-23)")
    options.add(p, "pooling", "max_length", "overwrite")
    p.set_defaults(func=run_export)


def run_export(args) -> int:
    from mirrorbert.cli.typed_options import ExportOptions
    from mirrorbert.errors import UserError
    from mirrorbert.encoder.export import check_export_packages
    from mirrorbert.safeguards.writes import WritePlan, atomic_output_dir

    opts = ExportOptions.from_args(args)  # every value checked, as in Python
    check_export_packages(opts.formats)  # before the model loads
    with WritePlan({"--model": opts.model}, overwrite=opts.overwrite).folder("--output", opts.output).locked():
        from mirrorbert.encoder.model import Encoder
        from mirrorbert.encoder.export import ExportMismatch, write_export

        encoder = Encoder.load(opts.model, pooling=opts.pooling, device="cpu", max_length=opts.max_length,
                               trust_remote_code=opts.trust_remote_code, cli=True)
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
