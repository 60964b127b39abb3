"""The encoder: a Hugging Face model + tokenizer + pooling, with loading, batched encoding and saving.

Saved folders are at the same time a `transformers` model folder (AutoModel/AutoTokenizer load them) and
a sentence-transformers folder (modules.json, pooling config), plus `mirrorbert.json` describing how the
model was trained. `Encoder.load` reads any of: such a folder, a sentence-transformers folder, a plain
HF masked LM (the "before" state, mean pooling by default) or a hub id.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

import mirrorbert.jsonio as jsonio
from mirrorbert.runtime.distributed import combine_rows, encoding_rows
from mirrorbert.errors import NonFiniteEmbeddings, UserError
from mirrorbert.publish.model_card import write_model_card
from mirrorbert.encoder.pooling import (
    POOLINGS,
    needs_hidden_states,
    pool,
    pooling_from_sentence_transformers,
    sentence_transformers_modules,
)
from mirrorbert.search.exact import as_vectors
from mirrorbert.search.ranking import l2_normalize
from mirrorbert.safeguards.preflight import check_max_length
from mirrorbert.safeguards.writes import atomic_output_dir
from mirrorbert.runtime.device import autocast, check_precision, resolve_device
from mirrorbert.reporting.metrics import library_versions
from mirrorbert.settings.choices import PACKING_MODES, PRECISIONS
from mirrorbert.encoder.batching import pad_batch
from mirrorbert.encoder.architectures import NoPooler, fixed_length, usable_precision
from mirrorbert.encoder.masked_lm import model_max_length
from mirrorbert.encoder.packing import choose_layout, grouped_embed, packed_embed
from mirrorbert.encoder.source import ModelHandle, open_model

logger = logging.getLogger(__name__)

MIRRORBERT_JSON = "mirrorbert.json"


_PYTHON_NAMES = {"--model": "name_or_path", "--trust-remote-code": "trust_remote_code=True", "--pooling": "pooling", "--max-length": "max_length",
                 "--device": "device", "--batch-size": "batch_size", "--precision": "precision", "--packing": "packing"}


def check_finite(vectors: torch.Tensor, model: str, precision: str = "fp32") -> None:
    """NaN or infinite vectors are an error naming the model, never a score computed from them."""
    finite = torch.isfinite(vectors).all(dim=-1)
    if bool(finite.all()):
        return
    bad = (~finite).nonzero().flatten()
    hint = (" (it overflowed in fp16: try --precision fp32 or bf16)" if precision == "fp16"
            else "; are its weights damaged (NaN in the weights)?")
    raise NonFiniteEmbeddings(f"model {model}: it gives NaN or infinite vectors for {len(bad)} of "
                              f"{len(vectors)} inputs (the first is input {int(bad[0])}){hint}")


def _either(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """One of two spellings of the same argument (ours, sentence-transformers'); both given must agree."""
    if alias_value is None:
        return value
    if value is not None and value != alias_value:
        raise UserError(f"{name}={value!r} and {alias}={alias_value!r} disagree; give one of them")
    return alias_value


# A UTF-16 surrogate on its own (what "\\ud800" in JSON or surrogateescape decoding leaves in a str).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_encode_arguments(texts: Any, batch_size: Any, convert_to: Any, precision: Any, packing: Any,
                            normalize: Any = None) -> None:
    if not isinstance(texts, str) and not (isinstance(texts, Sequence) and all(isinstance(t, str) for t in texts)):
        raise UserError(f"texts must be a string or a sequence of strings, not {type(texts).__name__}")
    for i, text in enumerate([texts] if isinstance(texts, str) else texts):
        surrogate = _LONE_SURROGATE.search(text)
        if surrogate:  # no UTF-8 holds one, so no tokenizer can read it: refused, never guessed at
            raise UserError(f"texts[{i}] holds a lone surrogate (U+{ord(surrogate.group()):04X} at character "
                            f"{surrogate.start()}), which is not text: decode the input with errors='strict' (or "
                            f"'replace') instead of 'surrogateescape'/'surrogatepass'")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise UserError(f"batch_size must be an integer >= 1, not {batch_size!r}")
    if convert_to not in ("numpy", "torch"):
        raise UserError(f"convert_to must be 'numpy' or 'torch', not {convert_to!r}")
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if packing is not None and not isinstance(packing, bool) and packing not in PACKING_MODES:
        raise UserError(f"packing must be None, True, False or one of {', '.join(PACKING_MODES)}, not {packing!r}")
    if normalize is not None and not isinstance(normalize, bool):
        raise UserError(f"normalize must be True, False or None, not {normalize!r}")


def python_names(message: str) -> str:
    """A message written in option words (`--model x: ...`) with the Python argument names instead."""
    for option, name in _PYTHON_NAMES.items():
        message = re.sub(re.escape(option) + r"(?![\w-])", name, message)
    return message


def usable_device(device: Any, option: str = "device") -> torch.device:
    """`device` as a torch.device, or a UserError naming `option` when weights cannot live there: an unknown
    name, CUDA or MPS this machine lacks, a CUDA index past its GPUs, or the meta device (which holds no
    weights: moving an encoder there discards them). Checked before anything moves."""
    try:
        target = resolve_device(device if isinstance(device, str) or device is None else str(device))
    except UserError as exc:
        raise UserError(re.sub(r"--device(?![\w-])", option, str(exc))) from None
    if target.type == "meta":
        raise UserError(f"{option} {str(device)!r}: the meta device holds no weights (moving the encoder there "
                        f"would discard them); use cpu, cuda or mps")
    if target.type == "cuda" and target.index is not None and target.index >= torch.cuda.device_count():
        raise UserError(f"{option} {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                        f"(indices from 0)")
    if target.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise UserError(f"{option} {str(device)!r}: Apple MPS is not available on this machine")
    return target


class Encoder(torch.nn.Module):
    """Encodes strings into vectors; also the module Mirror-BERT trains (its forward is the pooled vector)."""

    def __init__(self, model, tokenizer, pooling: str = "mean", max_length: int | None = None,
                 normalize_default: bool = False, source: str | None = None):
        super().__init__()
        if pooling not in POOLINGS:
            raise UserError(f"--pooling: unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_length = max_length or model_max_length(model, tokenizer)
        self.normalize_default = normalize_default
        self.source = source
        self.training_info: dict[str, Any] = {}
        self.packing: bool | str | None = None  # default of `embed`: None = auto (packing.choose_layout)
        # The model's pooler head (unused by every pooling here), kept aside and written back on save
        self.pooler_state: dict[str, torch.Tensor] = detach_pooler(model)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike, pooling: str | None = None, device: str | None = None,
             max_length: int | None = None, config_overrides: dict[str, Any] | None = None, *,
             trust_remote_code: bool = False, cli: bool = False) -> "Encoder":
        """Load a mirrorbert/sentence-transformers/HF folder or hub id; pooling defaults to what was saved.

        `trust_remote_code=True` lets a model that ships its own Python code (an `auto_map` in its config.json
        or tokenizer_config.json) run it; without it such a model is refused (`UserError`), never asked about.
        Errors name the arguments as Python does (`name_or_path`); the commands pass `cli=True` to have
        them name the options (`--model`).
        """
        try:
            if pooling is not None and pooling not in POOLINGS:
                raise UserError(f"--pooling: unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
            with open_model(name_or_path, trust_remote_code=trust_remote_code) as handle:
                return cls.from_handle(handle, pooling=pooling, device=device, max_length=max_length,
                                       config_overrides=config_overrides)
        except UserError as exc:
            if cli:
                raise
            raise UserError(python_names(str(exc))) from None

    @classmethod
    def from_handle(cls, handle: ModelHandle, *, pooling: str | None = None, device: str | None = None,
                    max_length: int | None = None, config_overrides: dict[str, Any] | None = None) -> "Encoder":
        """The encoder of an opened model (`encoder.source.open_model`); pooling defaults to what was saved."""
        saved_pooling, normalize, saved_max, info = _saved_settings(handle)
        config = handle.config(config_overrides)  # checked against the weights' headers before any weight is read
        handle.check_max_length(max_length)
        if max_length is None and saved_max is not None:
            check_max_length(saved_max, config, f"--model {Path(handle.name) / 'sentence_bert_config.json'}: "
                             "max_seq_length", handle.name)
        tokenizer = handle.tokenizer()
        model = handle.load("AutoModel", config)
        encoder = cls(model, tokenizer, pooling=pooling or saved_pooling or "mean", max_length=max_length or saved_max,
                      normalize_default=normalize, source=handle.name)
        encoder.training_info = info.get("training", {})
        encoder.to(resolve_device(device))
        return encoder

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, *args, **kwargs):
        """`torch.nn.Module.to`, all or nothing: a device the weights cannot live on (meta, a GPU this machine
        lacks) is refused before anything moves, and a move that fails halfway is moved back."""
        try:
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
        except Exception:  # noqa: BLE001  torch's own call below reports bad arguments
            device = None
        if device is not None:
            usable_device(device)
        home = self.device
        try:
            return super().to(*args, **kwargs)
        except BaseException:
            with contextlib.suppress(Exception):
                super().to(home)
            raise

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra) -> torch.Tensor:
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask,
            output_hidden_states=needs_hidden_states(self.pooling), return_dict=True, **extra,
        )
        return pool(outputs, attention_mask, self.pooling)

    def embed(self, sequences: Sequence[Sequence[int]], packing: bool | str | None = None) -> torch.Tensor:
        """Pooled vectors of already tokenised sequences, in order, on the model's device (the one entry point of
        training and `encode`). `packing`: None = this encoder's default (`self.packing`, itself None = auto, see
        `packing.choose_layout`), True = packed rows, "grouped" = length groups, False = padded."""
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        layout = choose_layout(self.model, self.packing if packing is None else packing, sequences)
        if layout == "packed":
            return packed_embed(self.model, sequences, self.pooling, pad_id)
        if layout == "grouped":
            return grouped_embed(lambda group: self._embed_padded(group, pad_id), sequences)
        return self._embed_padded(sequences, pad_id)

    def _embed_padded(self, sequences: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
        batch = {k: v.to(self.device) for k, v in pad_batch(sequences, pad_id, fixed_length(self.model)).items()}
        return self(**batch)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        encoded = self.tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=self.max_length)
        return [list(ids) for ids in encoded["input_ids"]]

    def encode(self, texts: str | Sequence[str], batch_size: int = 64, normalize: bool | None = None,
               show_progress: bool = False, convert_to: str = "numpy", precision: str = "fp32",
               packing: bool | str | None = None, *, show_progress_bar: bool | None = None,
               convert_to_numpy: bool | None = None, convert_to_tensor: bool | None = None,
               normalize_embeddings: bool | None = None, device: str | None = None):
        """Vectors in input order. Sorted by length internally so each batch pads (or packs) little.

        packing: None = the encoder's default (auto), True = packed rows, "grouped" = length groups, False =
        padded (see `embed`). sentence-transformers' keywords work with their meaning there:
        `show_progress_bar`, `normalize_embeddings`, `convert_to_tensor=True` (one tensor),
        `convert_to_numpy=False` (a list of tensors), `device` (this call runs there). Bad arguments raise
        `UserError` (a ValueError) naming the argument, before any work.
        """
        normalize = _either("normalize", normalize, "normalize_embeddings", normalize_embeddings)
        show_progress = bool(_either("show_progress", show_progress or None, "show_progress_bar", show_progress_bar))
        as_list = False
        if convert_to_tensor:
            convert_to = "torch"
        elif convert_to_numpy is False:
            convert_to, as_list = "torch", True
        _check_encode_arguments(texts, batch_size, convert_to, precision, packing, normalize)
        if isinstance(packing, str):  # the CLI's spelling: auto | on | grouped | off
            from mirrorbert.encoder.packing import packing_flag

            packing = packing_flag(packing)
        target = usable_device(device) if device is not None else None  # before anything moves
        if target is not None and target != self.device:
            home = self.device
            try:  # the encoder goes back where it was, whatever happens (the object as it was)
                self.to(target)
                out = self._encode(texts, batch_size, normalize, show_progress, convert_to, precision, packing)
            finally:
                self.to(home)
        else:
            out = self._encode(texts, batch_size, normalize, show_progress, convert_to, precision, packing)
        return list(out) if as_list and out.ndim == 2 else out

    def _encode(self, texts, batch_size, normalize, show_progress, convert_to, precision, packing):
        from mirrorbert.reporting.progress import progress_bar

        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        device = self.device
        check_precision(precision, device)
        precision = usable_precision(self.model, precision)
        normalize = self.normalize_default if normalize is None else normalize
        rows = encoding_rows(len(texts))  # all rows, or this process's share under sharded encoding
        out = torch.empty((len(rows), self.dim), dtype=torch.float32)
        if texts:
            ids = self.tokenize([texts[i] for i in rows])
            order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
            was_training = self.training
            self.eval()
            try:
                with torch.inference_mode():
                    starts = range(0, len(order), batch_size)
                    for start in progress_bar(starts, show=show_progress, desc="encode", unit="batch"):
                        index = order[start:start + batch_size]
                        with autocast(device, precision):
                            vectors = self.embed([ids[i] for i in index], packing=packing)
                        out[torch.tensor(index)] = vectors.float().cpu()
            finally:
                self.train(was_training)
            out = combine_rows(out, len(texts))
            check_finite(out, self.source or type(self.model).__name__, precision)
        if normalize:
            out = torch.nn.functional.normalize(out, dim=-1)
        result = out[0] if single else out
        return result if convert_to == "torch" else result.numpy()

    def similarity(self, a, b, batch_size: int = 64) -> np.ndarray:
        """Cosine similarity matrix between two lists of strings (or of already computed vectors)."""
        va = self._similarity_side(a, "a", batch_size)
        vb = self._similarity_side(b, "b", batch_size)
        return va @ vb.T

    def _similarity_side(self, x, name: str, batch_size: int) -> np.ndarray:
        """Unit rows [n, dim] of one argument of `similarity`: strings are encoded, vectors checked (numbers,
        this encoder's dimension, finite); anything else is a UserError naming the argument."""
        if isinstance(x, str):
            return np.atleast_2d(self.encode(x, batch_size=batch_size, normalize=True))
        if isinstance(x, (list, tuple)):
            if not x:
                raise UserError(f"{name}: an empty list; give at least one string or vector")
            kinds = {isinstance(item, str) for item in x}
            if kinds == {True}:
                return self.encode(list(x), batch_size=batch_size, normalize=True)
            if True in kinds:
                bad = next(i for i, item in enumerate(x) if not isinstance(item, str))
                raise UserError(f"{name}: a list mixing strings and other values (item {bad} is "
                                f"{type(x[bad]).__name__}); give strings or vectors")
        return l2_normalize(as_vectors(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, name, self.dim))

    def write(self, folder: str | Path, training_info: dict[str, Any] | None = None) -> Path:
        """Write into an existing (empty) folder; use `save` for the atomic user-facing version."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = self.model.config
        previous_hidden = config.output_hidden_states
        config.output_hidden_states = needs_hidden_states(self.pooling)
        try:
            state = {**self.model.state_dict(), **self.pooler_state} if self.pooler_state else None
            self.model.save_pretrained(folder, state_dict=state)
        finally:
            config.output_hidden_states = previous_hidden
        # the saved tokenizer truncates where this model does: AutoTokenizer(...)(truncation=True) on the folder
        # gives encode's tokens, not the tokenizer's own 512
        previous_max, self.tokenizer.model_max_length = self.tokenizer.model_max_length, self.max_length
        try:
            self.tokenizer.save_pretrained(folder)
        finally:
            self.tokenizer.model_max_length = previous_max
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
        for idx, module in enumerate(sentence_transformers_modules(self.pooling, self.dim, config.num_hidden_layers,
                                                                          self.normalize_default), 1):
            sub = folder / module["folder"]
            sub.mkdir(exist_ok=True)
            (sub / "config.json").write_text(jsonio.dumps(module["config"], indent=2), encoding="utf-8")
            if "weights" in module:
                save_file(module["weights"], str(sub / "model.safetensors"))
            modules.append({"idx": idx, "name": str(idx), "path": module["folder"], "type": module["type"]})
        _write_json(folder / "modules.json", modules)
        _write_json(folder / "sentence_bert_config.json", {"max_seq_length": self.max_length, "do_lower_case": False})
        versions = library_versions()
        _write_json(folder / "config_sentence_transformers.json", {
            "__version__": {"sentence_transformers": _st_version(), "transformers": versions["transformers"],
                            "pytorch": versions["torch"]},
            "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine",
        })
        info = training_info if training_info is not None else self.training_info
        meta = {
            "format_version": 1, "pooling": self.pooling, "dim": self.dim, "max_length": self.max_length,
            "base_model": info.get("config", {}).get("model", self.source), "versions": versions, "training": info,
        }
        _write_json(folder / MIRRORBERT_JSON, meta)
        write_model_card(folder, meta)
        return folder

    def save(self, path: str | Path, training_info: dict[str, Any] | None = None, overwrite: bool = False) -> Path:
        """Atomic: the folder appears complete or not at all; an existing one is kept unless overwrite."""
        with atomic_output_dir(path, overwrite=overwrite, option="path") as tmp:
            self.write(tmp, training_info)
        return Path(path)


def _saved_settings(handle: ModelHandle) -> tuple[str | None, bool, int | None, dict[str, Any]]:
    """(pooling, normalize, max length, mirrorbert.json) a saved folder records, as the folder check parsed them."""
    folder = Path(handle.name)
    saved_pooling, normalize = pooling_from_sentence_transformers(handle.files)
    info = handle.json(MIRRORBERT_JSON, {})
    if not isinstance(info, dict):
        raise UserError(f"--model: {folder / MIRRORBERT_JSON} is damaged (expected a JSON object)")
    saved_pooling = info.get("pooling", saved_pooling)
    if saved_pooling is not None and saved_pooling not in POOLINGS:
        raise UserError(f"--model: {folder / MIRRORBERT_JSON}: unknown pooling {str(saved_pooling)[:40]!r}")
    st_cfg = handle.json("sentence_bert_config.json", {})
    if not isinstance(st_cfg, dict):
        raise UserError(f"--model: {folder / 'sentence_bert_config.json'} is damaged (expected a JSON object)")
    saved_max = st_cfg.get("max_seq_length")
    if saved_max is not None and (not isinstance(saved_max, int) or isinstance(saved_max, bool) or saved_max < 1):
        raise UserError(f"--model: {folder / 'sentence_bert_config.json'}: max_seq_length {str(saved_max)[:30]!r} "
                        "is not a positive whole number")
    return saved_pooling, normalize, saved_max, info


def detach_pooler(model) -> dict[str, torch.Tensor]:
    """Take the pooler head (BERT/RoBERTa's tanh layer over [CLS], which no pooling here uses and which must
    not train) out of the model, returning its weights for `write` to save as loaded."""
    pooler = getattr(model, "pooler", None)
    if not isinstance(pooler, torch.nn.Module):
        return {}
    state = {f"pooler.{k}": v.detach().cpu().clone() for k, v in pooler.state_dict().items()}
    model.pooler = NoPooler()  # some types (SqueezeBERT) call their pooler without checking for one
    return state


def _write_json(path: Path, obj) -> None:
    path.write_text(jsonio.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _st_version() -> str:
    try:
        from importlib.metadata import version

        return version("sentence-transformers")
    except Exception:
        return "unknown"
