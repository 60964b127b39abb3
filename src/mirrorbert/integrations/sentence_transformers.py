"""Mirror-BERT as a sentence-transformers loss: `SentenceTransformerTrainer` with a one-column dataset of strings,
`MirrorBertLoss` (InfoNCE over the 2B-2 in-batch negatives) and `MirrorBertDataCollator` (docs/guide/saved-model.md).
Without the collator the two views of a string differ by dropout alone; `MirrorBertDataCollator` adds the masked
second view as `mirrorbert train` makes it (`mask_span`, `mask_min_chars`, `mask_unit`), drawn from `seed`, the
batch number and a DataLoader worker's seed. The defaults are `mirrorbert train --preset sentence`'s.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from mirrorbert.errors import UserError
from mirrorbert.mirror.config import TrainConfig
from mirrorbert.mirror.loss import build_loss
from mirrorbert.runtime.randomness import derived_generator
from mirrorbert.mirror.views import char_starts_from_draws, mask_chars, special_token_ids
from mirrorbert.mirror.views import mask_span as mask_span_ids
from mirrorbert.publish.model_card import CITATION

STREAM_ST_MASK = 7  # the collator's own random stream (runtime.randomness.derived_generator)
SENTENCE = TrainConfig(preset="sentence")
MIRROR_SUFFIX = "_mirror"


class MirrorBertLoss(torch.nn.Module):
    """The Mirror-BERT loss for `SentenceTransformerTrainer` (one text column, or the two columns of
    `MirrorBertDataCollator`): `loss` names the loss object of `mirrorbert.mirror.loss` ("infonce":
    `MirrorInfoNCE(temperature)`, "ms": `MirrorMultiSimilarity()`), called on the gathered [2B, d] views."""

    def __init__(self, model, temperature: float = SENTENCE.temperature, loss: str = SENTENCE.loss,
                 gather_across_devices: bool = True):
        super().__init__()
        self.loss = build_loss(loss, temperature)  # the settings are checked there, before any training
        self.model = model
        self.temperature = float(temperature)
        self.gather_across_devices = gather_across_devices

    def embeddings(self, sentence_features: Iterable[dict[str, torch.Tensor]]) -> torch.Tensor:
        """[2B, d]: the first views, then the second views (mirror order), over every process."""
        features = list(sentence_features)
        if len(features) == 1:  # one column: the second view differs by dropout alone
            features = features * 2
        if len(features) != 2:
            raise UserError(f"MirrorBertLoss takes a dataset with one text column (got {len(features)} inputs); "
                            "with MirrorBertDataCollator it gets that column and its masked copy")
        first, second = (self.model(f)["sentence_embedding"] for f in features)
        if self.gather_across_devices and torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            from torch.distributed.nn.functional import all_gather  # gradients flow back to every process

            first, second = torch.cat(all_gather(first)), torch.cat(all_gather(second))
        return torch.cat([first, second])

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: Any = None) -> torch.Tensor:
        return self.loss(self.embeddings(sentence_features))

    def get_config_dict(self) -> dict[str, Any]:  # shown in sentence-transformers' model card
        return {"temperature": self.temperature, "loss": self.loss.name}

    @property
    def citation(self) -> str:
        return CITATION


def MirrorBertDataCollator(model, mask_span: int = SENTENCE.mask_span, mask_min_chars: int = SENTENCE.mask_min_chars,
                           seed: int = SENTENCE.seed, mask_unit: str = SENTENCE.mask_unit, **kwargs):
    """A `SentenceTransformerDataCollator` that adds each string's masked copy as a second column (see the
    module's docstring); `model` is the SentenceTransformer, other keywords go to the sentence-transformers
    collator. `mask_unit="token"` masks `mask_span` consecutive non-special tokens of strings with more."""
    try:
        from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator as base
    except ImportError:
        raise UserError('this needs sentence-transformers: pip install "mirrorbert[st]"') from None
    TrainConfig(preset="sentence", mask_span=mask_span, mask_min_chars=mask_min_chars, mask_unit=mask_unit,
                seed=seed)  # the one check of these values, in the caller's words
    mask_token = getattr(model.tokenizer, "mask_token", None)
    if mask_span > 0 and not mask_token:
        raise UserError("mask_span: the model's tokenizer has no mask token; masking needs one ([MASK] or <mask>)")

    class _Collator(base):
        _batches = 0  # batches drawn so far (each copy of the collator counts its own)

        def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
            text_columns = [k for k, v in features[0].items() if isinstance(v, str) and k != "dataset_name"]
            if len(text_columns) != 1:
                raise UserError(f"MirrorBertDataCollator takes a dataset with one text column, got {text_columns}")
            column = text_columns[0]
            strings = [row[column] for row in features]
            if mask_unit == "token":
                batch = super().__call__([{**row, column + MIRROR_SUFFIX: row[column]} for row in features])
                ids = batch[column + MIRROR_SUFFIX + "_input_ids"]
                batch[column + MIRROR_SUFFIX + "_input_ids"] = self.masked_token_ids(ids)
                return batch
            masked = self.masked_copies(strings)
            rows = [{**row, column + MIRROR_SUFFIX: view} for row, view in zip(features, masked)]
            return super().__call__(rows)

        def masked_token_ids(self, ids: torch.Tensor) -> torch.Tensor:
            """Token unit: `mask_span` consecutive non-special tokens of each padded row replaced by the mask id."""
            draws = torch.rand(len(ids), generator=self._next_generator()).tolist()
            special = special_token_ids(model.tokenizer)
            rows = [mask_span_ids(row, mask_span, model.tokenizer.mask_token_id, special, u)
                    for row, u in zip(ids.tolist(), draws)]
            return torch.tensor(rows, dtype=ids.dtype)

        def _next_generator(self) -> torch.Generator:
            """The generator of the next batch: from `seed`, the batch number and, inside a DataLoader worker
            (each holds its own copy of this collator), the worker's seed, which differs per worker and epoch."""
            stream = [STREAM_ST_MASK, self._batches]
            worker = torch.utils.data.get_worker_info()
            if worker is not None:
                stream += [int(worker.seed) % (2**63), worker.id]
            self._batches += 1
            return derived_generator(seed, *stream)

        def masked_copies(self, strings: list[str]) -> list[str]:
            """Char unit: the second views of one batch; each call is the next batch's draw."""
            draws = torch.rand(len(strings), generator=self._next_generator()).tolist()
            starts = char_starts_from_draws(strings, mask_span, mask_min_chars, draws)
            return [s if start is None else mask_chars(s, start, mask_span, mask_token)
                    for s, start in zip(strings, starts)]

    return _Collator(model.preprocess, **kwargs)


__all__ = ["MirrorBertDataCollator", "MirrorBertLoss"]
