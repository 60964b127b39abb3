"""Export an encoder for serving: ONNX and OpenVINO, laid out as sentence-transformers' backends read them.

The export folder is a complete saved model plus `onnx/model.onnx` and/or `openvino/openvino_model.xml`; the
graph takes `input_ids` and `attention_mask` and returns `last_hidden_state` and `sentence_embedding` (the
model's own pooling and normalisation). An export whose vectors differ from PyTorch's (cosine below
`EXPORT_MIN_COSINE` on probe strings) is refused. The layout and its uses: docs/guide/export.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import shutil
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.settings.choices import DEFAULT_ONNX_OPSET, EXPORT_FORMATS, EXPORT_MIN_COSINE
from mirrorbert.errors import UserError
from mirrorbert.search.ranking import l2_normalize

logger = logging.getLogger(__name__)

ONNX_FILE = "onnx/model.onnx"  # where sentence-transformers' ONNX backend looks
OPENVINO_FILE = "openvino/openvino_model.xml"  # and its OpenVINO backend (weights in openvino_model.bin)
EXPORT_RECORD = "mirrorbert-export.json"
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAMES = ("last_hidden_state", "sentence_embedding")
BACKENDS = {"onnx": ONNX_FILE, "openvino": OPENVINO_FILE}
# The packages each format needs at export time (import name, pip name).
FORMAT_PACKAGES = {
    "onnx": (("onnx", "onnx"), ("onnxscript", "onnxscript"), ("onnxruntime", "onnxruntime")),
    "openvino": (("onnx", "onnx"), ("onnxscript", "onnxscript"), ("openvino", "openvino")),
}
# Strings the parity check encodes both ways: short and long, cased, accented, non-Latin, a truncated one.
PROBE_STRINGS = (
    "a", "bank", "river bank", "The cat sat on the mat.", "Ünïcödé façade, naïve café",
    "東京は日本の首都です。", "3.14159 and 2,718 are numbers", "  leading and trailing spaces  ",
    "A man is playing a guitar on a stage while the audience claps along to the music.",
    " ".join(["a long sentence that goes on"] * 40),
)
LARGE_MODEL_BYTES = 1_500_000_000  # above this the ONNX weights go to an external data file (protobuf's 2 GB cap)


def parse_formats(value: str | Sequence[str], option: str = "--format") -> tuple[str, ...]:
    """`onnx`, `openvino` or both (`onnx,openvino`), in a fixed order, each once."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip().lower() for item in items]
    unknown = [repr(name) if not name else name for name in names if name not in EXPORT_FORMATS]
    if unknown or not names:
        raise UserError(f"{option}: unknown format {', '.join(unknown) or repr(value)}; "
                        f"choose {' | '.join(EXPORT_FORMATS)} (or both, comma-separated)")
    return tuple(name for name in EXPORT_FORMATS if name in names)


def check_export_packages(formats: Sequence[str], option: str = "--format") -> None:
    """Every package the formats need, checked before the model loads (one line naming what to install)."""
    missing = sorted({pip for name in formats for module, pip in FORMAT_PACKAGES[name]
                      if importlib.util.find_spec(module) is None})
    if missing:
        raise UserError(f"{option} {','.join(formats)}: needs {' '.join(missing)} "
                        f"(pip install {' '.join(missing)}, or pip install 'mirrorbert[export]')")


def _serving_graph(encoder):
    """The encoder as a module of two int64 inputs and the two named outputs (eval mode, no dropout):
    `sentence_embedding` is the model's final vector, L2-normalised when the model normalises."""
    import torch

    from mirrorbert.encoder.pooling import needs_hidden_states, pool

    normalize = bool(encoder.normalize_default)

    class ServingGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = encoder.model

        def forward(self, input_ids, attention_mask):
            outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True,
                                 output_hidden_states=needs_hidden_states(encoder.pooling))
            pooled = pool(outputs, attention_mask, encoder.pooling)
            if normalize:  # as the saved Normalize module does (eps as torch's F.normalize)
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return outputs.last_hidden_state, pooled

    return ServingGraph().eval()


def export_onnx(encoder, path: Path, opset: int = DEFAULT_ONNX_OPSET) -> Path:
    """Trace the encoder into `path` with torch.onnx's dynamo exporter, batch and length left dynamic."""
    import torch

    graph = _serving_graph(encoder)
    example = encoder.tokenizer(["a short example", "a second, slightly longer example string"], padding=True,
                                return_tensors="pt")
    # the example inputs go where the weights are (an encoder on CUDA, through the Python API)
    device = next(encoder.model.parameters()).device
    args = (example["input_ids"].to(device=device, dtype=torch.long),
            example["attention_mask"].to(device=device, dtype=torch.long))
    batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence")
    dynamic = {name: {0: batch, 1: length} for name in INPUT_NAMES}
    size = sum(p.numel() * p.element_size() for p in encoder.model.parameters())
    path.parent.mkdir(parents=True, exist_ok=True)
    # the exporter's progress, rewrite logs and warnings are not for our user (-v shows the log)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_exporter_logs(), \
            torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, args, str(path), input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES),
                          dynamic_shapes=dynamic, opset_version=opset, dynamo=True,
                          external_data=size > LARGE_MODEL_BYTES, verbose=False)
    return path


@contextlib.contextmanager
def _quiet_exporter_logs():
    names = ("torch.onnx", "onnxscript", "onnx_ir")
    if logging.getLogger("mirrorbert").isEnabledFor(logging.DEBUG):
        yield
        return
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def export_openvino(onnx_path: Path, path: Path) -> Path:
    """Convert the ONNX graph with OpenVINO's own converter; weights kept in fp32 (no fp16 compression)."""
    import openvino

    path.parent.mkdir(parents=True, exist_ok=True)
    openvino.save_model(openvino.convert_model(str(onnx_path)), str(path), compress_to_fp16=False)
    return path


class ExportedEncoder:
    """Encode with an exported folder through onnxruntime or OpenVINO: no torch, no transformers needed.

    Tokenises with the folder's `tokenizer.json` and returns the graph's `sentence_embedding` rows in input
    order, L2-normalised when the saved model normalises (a Normalize module) or asked to.
    """

    def __init__(self, folder: str | Path, backend: str = "onnx", threads: int | None = None):
        folder = Path(folder)
        if backend not in BACKENDS:
            raise UserError(f"backend: unknown value {backend!r}; choose one of {', '.join(BACKENDS)}")
        from mirrorbert.encoder.pooling import pooling_from_sentence_transformers
        from mirrorbert.safeguards.model_files import check_model_folder
        from mirrorbert.safeguards.snapshot import Snapshot

        model = check_model_folder(folder, "folder")  # every file below is read as checked there
        try:
            if BACKENDS[backend] not in model.files():
                raise UserError(f"{folder}: no {BACKENDS[backend]} (export it with mirrorbert export --format "
                                f"{backend})")
            self.folder, self.backend = folder, backend
            self.tokenizer, self.pad_id, self.max_length = _load_tokenizer(model)
            self.normalize_default = pooling_from_sentence_transformers(model)[1]
            snapshot = Snapshot(model.copied, model.opened)  # the graph and its companions, as checked
            try:
                graph_file = snapshot.path / BACKENDS[backend]
                self._run = _onnxruntime_runner(graph_file, threads) if backend == "onnx" else \
                    _openvino_runner(graph_file, threads)
            finally:
                snapshot.close()
        finally:
            model.close()

    @classmethod
    def load(cls, folder: str | Path, backend: str = "onnx", threads: int | None = None) -> "ExportedEncoder":
        return cls(folder, backend, threads)

    def encode(self, texts: str | Sequence[str], batch_size: int = 64, normalize: bool | None = None) -> np.ndarray:
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise UserError("texts: expected strings")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise UserError(f"batch_size {batch_size!r}: must be an integer >= 1")
        ids = [encoding.ids for encoding in self.tokenizer.encode_batch(texts)] if texts else []
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # length-sorted: little padding
        rows: list[np.ndarray | None] = [None] * len(ids)
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            longest = max(len(ids[i]) for i in chunk)
            input_ids = np.full((len(chunk), longest), self.pad_id, dtype=np.int64)
            attention_mask = np.zeros((len(chunk), longest), dtype=np.int64)
            for row, i in enumerate(chunk):
                input_ids[row, :len(ids[i])] = ids[i]
                attention_mask[row, :len(ids[i])] = 1
            pooled = self._run(input_ids, attention_mask)
            for row, i in enumerate(chunk):
                rows[i] = pooled[row]
        width = rows[0].shape[0] if rows else 0
        vectors = np.stack(rows).astype(np.float32) if rows else np.zeros((0, width), np.float32)
        if self.normalize_default if normalize is None else normalize:
            vectors = l2_normalize(vectors)
        return vectors[0] if single else vectors


def _load_tokenizer(model):
    """The folder's fast tokenizer, truncating at the saved maximum length; (tokenizer, pad id, max length)."""
    from tokenizers import Tokenizer

    if "tokenizer.json" not in model.json:
        raise UserError(f"{model.folder.given}: no tokenizer.json (only fast tokenizers can be exported)")
    try:
        tokenizer = Tokenizer.from_str(model.copied["tokenizer.json"].decode("utf-8"))
    except Exception as exc:  # noqa: BLE001  tokenizers raises its own exception types for a damaged file
        raise UserError(f"{model.folder.given / 'tokenizer.json'}: damaged ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})") from None
    from mirrorbert.encoder.source import probe_tokenizer

    probe_tokenizer(tokenizer.encode_batch, str(model.folder.given / "tokenizer.json"), "folder")
    tokenizer.no_padding()  # we pad per batch; the saved file may carry a padding setting
    max_length = _saved_dict(model, "sentence_bert_config.json").get("max_seq_length") or 512
    if not isinstance(max_length, int) or isinstance(max_length, bool) or not 0 < max_length <= 1 << 20:
        raise UserError(f"{model.folder.given / 'sentence_bert_config.json'}: max_seq_length {str(max_length)[:30]!r} "
                        "is not a positive whole number")
    tokenizer.enable_truncation(int(max_length))
    pad_token = _saved_dict(model, "tokenizer_config.json").get("pad_token")
    if isinstance(pad_token, dict):
        pad_token = pad_token.get("content")
    pad_id = tokenizer.token_to_id(pad_token) if isinstance(pad_token, str) else None
    return tokenizer, (pad_id if pad_id is not None else 0), int(max_length)


def _saved_dict(model, name: str) -> dict:
    value = model.get(name, {})
    return value if isinstance(value, dict) else {}


def _onnxruntime_runner(graph_file: Path, threads: int | None):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(graph_file), options, providers=["CPUExecutionProvider"])
    return lambda input_ids, attention_mask: session.run(
        ["sentence_embedding"], {"input_ids": input_ids, "attention_mask": attention_mask})[0]


def _openvino_runner(graph_file: Path, threads: int | None):
    import openvino

    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}  # no silent bf16 on CPUs that have it
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = openvino.Core().compile_model(str(graph_file), "CPU", config)
    output = compiled.output("sentence_embedding")
    return lambda input_ids, attention_mask: compiled(
        {"input_ids": input_ids, "attention_mask": attention_mask})[output]


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(l2_normalize(a) * l2_normalize(b), axis=1)))


class ExportMismatch(RuntimeError):
    """An exported graph that does not give PyTorch's vectors on the probe strings (or cannot run them)."""


def write_export(encoder, folder: Path, formats: Sequence[str], opset: int = DEFAULT_ONNX_OPSET,
                 probe: Sequence[str] = PROBE_STRINGS) -> dict[str, Any]:
    """Write the saved model, the requested graphs and `mirrorbert-export.json` into `folder` (a fresh one);
    ExportMismatch when a graph cannot run `probe` or its vectors differ from PyTorch's (minimum cosine below
    EXPORT_MIN_COSINE)."""
    encoder.eval()
    encoder.write(folder)
    onnx_path = export_onnx(encoder, folder / ONNX_FILE, opset)
    if "openvino" in formats:
        export_openvino(onnx_path, folder / OPENVINO_FILE)
    if "onnx" not in formats:
        shutil.rmtree(folder / Path(ONNX_FILE).parent)
    reference = encoder.encode(list(probe), batch_size=len(probe), normalize=False, packing=False)
    parity = {}
    for backend in formats:
        runner = ExportedEncoder(folder, backend)
        try:  # batches of 4 and of all: several lengths, so a graph that kept the traced length fails here
            runs = [runner.encode(list(probe), batch_size=size, normalize=False) for size in (4, len(probe))]
        except Exception as exc:  # noqa: BLE001  the runtimes raise their own types for a shape they cannot take
            raise ExportMismatch(f"the {backend} export cannot encode inputs of other shapes than the traced "
                                 f"example ({str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__})") from None
        parity[backend] = min(min_cosine(reference, vectors) for vectors in runs)
        if not parity[backend] >= EXPORT_MIN_COSINE:
            raise ExportMismatch(f"the {backend} export's vectors differ from PyTorch's: minimum cosine "
                                 f"{parity[backend]:.6f} < {EXPORT_MIN_COSINE} on {len(probe)} probe strings")
    record = {
        "formats": list(formats), "files": [BACKENDS[f] for f in formats], "opset": opset,
        "inputs": list(INPUT_NAMES), "outputs": list(OUTPUT_NAMES), "pooling": encoder.pooling,
        "normalize": encoder.normalize_default, "max_length": encoder.max_length, "dim": encoder.dim,
        "parity_min_cosine": parity, "parity_strings": len(probe),
        # sentence-transformers' backends pool `last_hidden_state` with the saved modules; its ONNX/OpenVINO
        # models return no per-layer states, which first-last pooling (WeightedLayerPooling) needs
        "sentence_transformers_backend": encoder.pooling != "first-last",
        "versions": _versions(formats),
    }
    (folder / EXPORT_RECORD).write_text(jsonio.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _versions(formats: Sequence[str]) -> dict[str, str]:
    versions = {}
    for name in ("torch", "onnx", "onnxscript", "onnxruntime", "openvino"):
        if name == "openvino" and "openvino" not in formats:
            continue
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return versions
