"""Typed options of `encode`, `search` and `eval`, validated once where they enter (the CLI or Python).

`train` has `TrainConfig`, `pretrain-mlm` `PretrainConfig`, `gloss-pretrain` `GlossPretrainConfig`,
`finetune-sts` `FinetuneStsConfig`, `reproduce` `ReproduceConfig`, `lexsub` `GenerationConfig`; these three
complete the set. Each is a dataclass whose construction checks every value (types first, then ranges and
choices) and raises `UserError` (a `ValueError`) naming the option as the CLI spells it, so a script building
the options in Python gets the same message as a user typing them. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mirrorbert.settings.choices import (DEFAULT_ONNX_OPSET, ENCODE_QUANTIZATIONS, INDEX_TYPES, PACKING_MODES, POOLINGS,
                                         PRECISIONS, SEARCH_QUANTIZATIONS)
from mirrorbert.errors import UserError
from mirrorbert.settings.typed import check_types

FAISS_CHOICES = {"auto": None, "yes": True, "no": False}


def _positive(value: Any, option: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{option} {value!r}: must be an integer >= 1")


def _choice(value: Any, option: str, choices, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in choices:
        raise UserError(f"{option}: unknown value {value!r}; choose one of {', '.join(map(str, choices))}")


def _text(value: Any, option: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{option}: must be given (a non-empty path or name), not {value!r}")


class _Options:
    """Shared: check the field types, then the command's own rules; build from argparse's namespace."""

    def __post_init__(self) -> None:
        check_types(self)
        self.check()

    def check(self) -> None:  # pragma: no cover - every subclass has its rules
        raise NotImplementedError

    @classmethod
    def from_args(cls, args) -> "_Options":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


@dataclass
class EncodeOptions(_Options):
    model: str
    input: str
    output: str
    column: str | None = None
    field: str | None = None
    overwrite: bool = False
    pooling: str | None = None
    batch_size: int = 64
    max_length: int | None = None
    normalize: bool = False
    device: str = "auto"
    precision: str = "fp32"
    packing: str = "auto"
    quantize: str = "float32"
    skip_bad_lines: bool = False
    show_progress: bool = True
    trust_remote_code: bool = False  # --trust-remote-code (model_loading.py)

    def check(self) -> None:
        _text(self.model, "--model")
        _text(self.input, "--input")
        _choice(self.quantize, "--quantize", ENCODE_QUANTIZATIONS)
        _text(self.output, "--output")
        if not self.output.endswith(".npy"):
            raise UserError(f"--output {self.output}: expected a .npy file name")
        _choice(self.pooling, "--pooling", POOLINGS, allow_none=True)
        _positive(self.batch_size, "--batch-size")
        _positive(self.max_length, "--max-length", allow_none=True)
        _choice(self.precision, "--precision", [p for p in PRECISIONS if p != "auto"])
        _choice(self.packing, "--packing", PACKING_MODES)
        if self.column and self.field:
            raise UserError("--column is for CSV/TSV/Parquet/Arrow, --field for JSONL; not both")


@dataclass
class SearchOptions(_Options):
    model: str | None = None  # with --index it may be left out: the model the index's manifest names
    corpus: str | None = None
    index: str | None = None
    query: list[str] | None = None
    queries: str | None = None
    column: str | None = None
    field: str | None = None
    top_k: int = 10
    faiss: str = "auto"
    pooling: str | None = None
    batch_size: int = 64
    max_length: int | None = None
    device: str = "auto"
    quantize: str = "float32"
    skip_bad_lines: bool = False
    show_progress: bool = True
    trust_remote_code: bool = False  # --trust-remote-code (model_loading.py)
    nprobe: int | None = None  # an approximate --index's lists scanned per query (None: the index's own)

    def check(self) -> None:
        if self.model is None and self.index is None:
            raise UserError("--model: must be given to encode --corpus (an --index names its own model)")
        if self.model is not None:
            _text(self.model, "--model")
        elif self.trust_remote_code:  # trust goes to a model the user names, never to one a folder names
            raise UserError("--trust-remote-code with --index needs --model: the model you trust to run its code, "
                            "not the one the index's manifest names")
        _choice(self.quantize, "--quantize", SEARCH_QUANTIZATIONS)
        if self.index is None:
            _text(self.corpus, "--corpus")
        else:
            _text(self.index, "--index")
        if bool(self.query) == bool(self.queries):
            raise UserError("give either --query TEXT (repeatable) or --queries FILE")
        if self.query is not None and not all(isinstance(q, str) for q in self.query):
            raise UserError("--query: every query must be text")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1:
            raise UserError(f"--top-k must be a whole number >= 1, not {self.top_k!r}")
        _choice(self.faiss, "--faiss", list(FAISS_CHOICES))
        _choice(self.pooling, "--pooling", POOLINGS, allow_none=True)
        _positive(self.batch_size, "--batch-size")
        _positive(self.max_length, "--max-length", allow_none=True)
        self._check_nprobe()

    def _check_nprobe(self) -> None:
        """--nprobe is for the lists of an approximate --index; whether the index has them (and how many) is
        checked against its manifest (approximate.check_query_nprobe)."""
        _positive(self.nprobe, "--nprobe", allow_none=True)
        if self.nprobe is None:
            return
        if self.index is None:
            raise UserError("--nprobe applies to an approximate --index (index --index-type ivf); a --corpus "
                            "search is exact")
        if self.faiss == "no":
            raise UserError("--nprobe with --faiss no: an exact scan reads every vector, it probes no lists; "
                            "leave one of them out")
        if self.quantize != "float32":
            raise UserError(f"--nprobe with --quantize {self.quantize}: quantised candidates come from a scan of "
                            "every code, not from the index's lists; leave one of them out")


@dataclass
class IndexOptions(_Options):
    model: str
    corpus: str
    output: str
    overwrite: bool = False
    column: str | None = None
    field: str | None = None
    pooling: str | None = None
    batch_size: int = 64
    max_length: int | None = None
    device: str = "auto"
    skip_bad_lines: bool = False
    show_progress: bool = True
    trust_remote_code: bool = False  # --trust-remote-code (model_loading.py)
    index_type: str = "auto"
    nprobe: int | None = None

    def check(self) -> None:
        _choice(self.index_type, "--index-type", INDEX_TYPES)
        _positive(self.nprobe, "--nprobe", allow_none=True)
        if self.nprobe is not None and self.index_type == "exact":
            raise UserError("--nprobe applies to an approximate index (--index-type ivf or auto), not exact")
        for option in ("model", "corpus", "output"):
            _text(getattr(self, option), f"--{option}")
        if self.corpus.startswith("hf:"):
            raise UserError(f"--corpus {self.corpus}: an index needs a local corpus (its checksum and row count go "
                            f"into the manifest, so search --index can tell when it changed); save the dataset "
                            f"to Parquet first (Dataset.to_parquet) and index that")
        _choice(self.pooling, "--pooling", POOLINGS, allow_none=True)
        _positive(self.batch_size, "--batch-size")
        _positive(self.max_length, "--max-length", allow_none=True)
        if self.column and self.field:
            raise UserError("--column is for CSV/TSV/Parquet/Arrow, --field for JSONL; not both")


@dataclass
class EvalOptions(_Options):
    model: str
    tasks: list[str] = field(default_factory=list)
    data_dir: str | None = None
    output: str | None = None
    report: str | None = None
    overwrite: bool = False
    plot_dir: str | None = None
    batch_size: int = 64
    pooling: str | None = None
    reference_pooling: str | None = None
    device: str | None = None
    max_length: int | None = None
    backend: str = "auto"
    packing: str = "auto"
    show_progress: bool = True
    trust_remote_code: bool = False  # --trust-remote-code (model_loading.py)

    def check(self) -> None:
        from mirrorbert.evaluation.runner import TASKS

        if not isinstance(self.model, str) or not self.model.strip():
            raise UserError("eval: --model is required (a model folder, a hub id, or 'glove')")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise UserError(f"--tasks: unknown task(s) {', '.join(unknown) or '(none given)'}; "
                            f"choose among {', '.join(TASKS)}")
        _positive(self.batch_size, "--batch-size")
        _positive(self.max_length, "--max-length", allow_none=True)
        _choice(self.pooling, "--pooling", POOLINGS, allow_none=True)
        _choice(self.reference_pooling, "--reference-pooling", POOLINGS, allow_none=True)
        _choice(self.backend, "--backend", ("auto", "sentence-transformers"))
        _choice(self.packing, "--packing", PACKING_MODES)


__all__ = ["EncodeOptions", "EvalOptions", "FAISS_CHOICES", "IndexOptions", "SearchOptions"]


@dataclass
class ExportOptions(_Options):
    model: str
    output: str
    format: str = "onnx"
    opset: int = DEFAULT_ONNX_OPSET
    pooling: str | None = None
    max_length: int | None = None
    overwrite: bool = False
    trust_remote_code: bool = False  # --trust-remote-code (model_loading.py)

    def check(self) -> None:
        from mirrorbert.encoder.export import parse_formats  # numpy-free at import: parse_formats is plain Python

        _text(self.model, "--model")
        _text(self.output, "--output")
        self.formats = parse_formats(self.format)
        if not isinstance(self.opset, int) or isinstance(self.opset, bool) or not 14 <= self.opset <= 23:
            raise UserError(f"--opset {self.opset!r}: must be a whole number from 14 to 23 (default {DEFAULT_ONNX_OPSET})")
        _choice(self.pooling, "--pooling", POOLINGS, allow_none=True)
        _positive(self.max_length, "--max-length", allow_none=True)
