"""A mirrorbert encoder as an MTEB model (mteb >= 2.0, `pip install "mirrorbert[mteb]"`; usage: docs/guide/mteb.md).
`similarity` and `similarity_pairwise` are cosine; the metadata's `revision` is, unless given, `weights-<12 hex>`
(`weights_revision`). Only this module imports mteb, and only for the metadata.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mirrorbert.errors import UserError
from mirrorbert.publish.model_card import public_name
from mirrorbert.safeguards.confined import ConfinedFolder

if TYPE_CHECKING:
    from mirrorbert.encoder.model import Encoder

REVISION_PREFIX = "weights-"


def weights_revision(encoder: "Encoder") -> str:
    """`weights-<12 hex>`: a hash of what the vectors depend on (weights, pooling, maximum length)."""
    digest = hashlib.sha256(f"pooling={encoder.pooling};max_length={encoder.max_length}".encode())
    for name, tensor in sorted(encoder.model.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):  # e.g. packed parameters of quantised layers
            digest.update(f"{name}:{type(tensor).__name__}".encode())
            continue
        if tensor.is_quantized:
            tensor = tensor.int_repr()
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return REVISION_PREFIX + digest.hexdigest()[:12]


def _as_matrix(x: Any) -> torch.Tensor:
    """Unit-length float32 rows from a numpy array, a tensor or a list of rows (mteb passes all three)."""
    if isinstance(x, (list, tuple)):
        rows = [v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)) for v in x]
        x = torch.stack([r.reshape(-1) for r in rows]) if rows else torch.empty((0, 0))
    elif not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    x = x.float()
    return torch.nn.functional.normalize(x.unsqueeze(0) if x.ndim == 1 else x, dim=-1)


class MirrorBertMTEB:
    """A mirrorbert `Encoder` behind mteb's encoder protocol. model: an `Encoder` (moved to `device`), or what
    `Encoder.load` reads with `pooling`, `max_length` and `device` (a model that ships its own code is refused).
    batch_size: texts per forward pass (None: mteb's, else 64). normalize: unit-length vectors (None: the model's
    default). precision: auto | fp32 | bf16 | fp16. name, revision: override the metadata's."""

    def __init__(self, model: "Encoder | str | os.PathLike", revision: str | None = None, *,
                 device: str | None = None, batch_size: int | None = None, normalize: bool | None = None,
                 precision: str = "fp32", pooling: str | None = None, max_length: int | None = None,
                 name: str | None = None, **kwargs: Any):
        from mirrorbert.encoder.model import Encoder, _check_encode_arguments

        if kwargs:
            raise UserError(f"MirrorBertMTEB: unknown argument(s) {', '.join(sorted(kwargs))}")
        _check_encode_arguments([], 1 if batch_size is None else batch_size, "numpy", precision, None, normalize)
        if name is not None and (not isinstance(name, str) or "/" not in name):
            raise UserError(f"name: mteb wants 'organization/model_name', not {name!r}")
        if isinstance(model, Encoder):
            if pooling is not None or max_length is not None:
                raise UserError("pooling and max_length apply when loading a model; "
                                "this Encoder is already loaded (set them on Encoder.load)")
            encoder = model
            if device is not None:
                encoder.to(device)
        elif isinstance(model, (str, os.PathLike)):
            encoder = Encoder.load(model, pooling=pooling, device=device, max_length=max_length)
        else:
            raise UserError(f"model must be an Encoder or a model folder / hub id, not {type(model).__name__}")
        self.encoder = encoder
        self.batch_size = batch_size
        self.normalize = normalize
        self.precision = precision
        self._name = name
        self._revision = revision
        self._meta = None

    def __repr__(self) -> str:
        return f"MirrorBertMTEB({self.encoder.source or type(self.encoder.model).__name__!r})"

    def encode(self, inputs, *, task_metadata=None, hf_split: str | None = None, hf_subset: str | None = None,
               prompt_type=None, **kwargs: Any) -> np.ndarray:
        """One float32 row per text of the DataLoader's batches (`batch["text"]`) or of a list of strings, in order.
        Of mteb's keywords, `batch_size` is used when the adapter has none, `show_progress_bar` shows a bar,
        `precision` (output quantisation) must be float32."""
        output_precision = kwargs.get("precision")
        if output_precision not in (None, "float32"):
            raise UserError(f"encode: mteb precision={output_precision!r}: mirrorbert returns float32 vectors; "
                            "for quantised ones leave precision out and compress them afterwards")
        texts = self._texts(inputs)
        batch_size = self.batch_size or kwargs.get("batch_size") or 64
        vectors = self.encoder.encode(texts, batch_size=batch_size, normalize=self.normalize,
                                      show_progress=bool(kwargs.get("show_progress_bar", False)),
                                      convert_to="numpy", precision=self.precision)
        return np.asarray(vectors, dtype=np.float32)

    @staticmethod
    def _texts(inputs) -> list[str]:
        if isinstance(inputs, str):
            return [inputs]
        texts: list[str] = []
        for item in inputs:
            if isinstance(item, str):  # a plain list of strings
                texts.append(item)
                continue
            if not isinstance(item, dict) or "text" not in item:
                keys = sorted(item) if isinstance(item, dict) else type(item).__name__
                raise UserError(f"encode: mirrorbert encodes text; this task's batches hold {keys}")
            batch = item["text"]
            texts.extend([batch] if isinstance(batch, str) else batch)
        return texts

    def similarity(self, embeddings1, embeddings2) -> torch.Tensor:
        """[n1, n2] cosine similarity matrix (1-D inputs count as one row; a zero vector has cosine 0)."""
        a, b = _as_matrix(embeddings1), _as_matrix(embeddings2)
        return a @ b.to(a.device).T

    def similarity_pairwise(self, embeddings1, embeddings2) -> torch.Tensor:
        """[n] cosine of each row of embeddings1 with the same row of embeddings2."""
        a, b = _as_matrix(embeddings1), _as_matrix(embeddings2)
        if a.shape != b.shape:
            raise UserError(f"similarity_pairwise: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
        return (a * b.to(a.device)).sum(-1)

    @property
    def mteb_model_meta(self):
        """An `mteb.models.ModelMeta` for this model (built once; `ModelMeta.load_model` may replace it)."""
        if self._meta is None:
            self._meta = self._build_meta()
        return self._meta

    @mteb_model_meta.setter
    def mteb_model_meta(self, meta) -> None:
        self._meta = meta

    def _local_folder(self) -> Path | None:
        source = self.encoder.source
        return Path(source).resolve() if source and Path(source).is_dir() else None

    def model_name(self) -> str:
        """The metadata's name: given, else a hub id as it is, else `mirrorbert/<folder name>`."""
        if self._name:
            return self._name
        source = self.encoder.source
        if source and self._local_folder() is None and "/" in source:
            return source  # a hub id: organization/model
        base = public_name(source) if source else type(self.encoder.model).__name__.lower()
        return f"mirrorbert/{base}"

    def base_model(self) -> str | None:
        """The model this one was trained from (mirrorbert.json `base_model`), by hub id or folder name."""
        folder = self._local_folder()
        confined = ConfinedFolder(folder, "model", "model folder") if folder is not None else None
        if confined is None or not confined.exists("mirrorbert.json"):
            return None
        info = confined.read_json("mirrorbert.json")
        base = info.get("base_model") if isinstance(info, dict) else None
        if not base:
            return None
        base = public_name(base)
        return None if base == public_name(folder) else base

    def _build_meta(self):
        try:
            from mteb.models import ModelMeta
        except ImportError:
            raise UserError('this needs mteb: pip install "mirrorbert[mteb]"') from None

        encoder = self.encoder
        n_parameters = sum(p.numel() for p in encoder.model.parameters())
        n_bytes = sum(p.numel() * p.element_size() for p in encoder.model.parameters())
        embeddings = encoder.model.get_input_embeddings()
        folder = self._local_folder()
        loader_kwargs: dict[str, Any] = {"model_path": str(folder) if folder else encoder.source,
                                         "pooling": encoder.pooling, "max_length": encoder.max_length,
                                         "precision": self.precision}
        if self.batch_size is not None:
            loader_kwargs["batch_size"] = self.batch_size
        if self.normalize is not None:
            loader_kwargs["normalize"] = self.normalize
        return ModelMeta(
            loader=load_mteb_model,
            loader_kwargs=loader_kwargs,
            name=self.model_name(),
            revision=self._revision or weights_revision(encoder),
            release_date=None,
            languages=None,
            n_parameters=n_parameters,
            n_embedding_parameters=(embeddings.weight.numel() if embeddings is not None else None),
            memory_usage_mb=round(n_bytes / 2**20, 2),
            max_tokens=encoder.max_length,
            embed_dim=encoder.dim,
            license=None,
            open_weights=None,
            public_training_code=None,
            public_training_data=None,
            framework=["PyTorch", "Transformers"],
            similarity_fn_name="cosine",
            use_instructions=False,
            training_datasets=None,
            adapted_from=self.base_model(),
            modalities=["text"],
            model_type=["dense"],
        )


def load_mteb_model(model_name: str, revision: str | None = None, *, model_path: str | None = None,
                    **kwargs: Any) -> MirrorBertMTEB:
    """The metadata's loader (`ModelMeta.load_model`): loads `model_path` (else `model_name`) again."""
    return MirrorBertMTEB(model_path or model_name, revision, name=model_name, **kwargs)
