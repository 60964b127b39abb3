"""GR-BERT model: a masked LM (context encoder) plus a gloss encoder, in two architectures.

For a triplet (word, sentence s, gloss t) the target word's sub-tokens are replaced by the
mask token to give the context c. With the encoder output H:

* ``h_c`` = mean of H(c) over the target's sub-token positions (what MLM predicts from),
* ``h_s`` = mean of H(s) over the same positions (the word seen in full context),
* ``e_t`` = the gloss encoder's first-token ([CLS] / ``<s>``) vector of the gloss.

``mt`` (multitask): one context encoder; L = L_MLM(c) + lambda * L_GR(h_s, e).
``sc`` (separate context encoders): enc1 sees c and learns MLM; enc2 sees s for gloss matching
and also learns MLM on c (so it stays a usable MLM for p(x|s) at inference); the gloss
query is h_s(enc2) - h_c(enc1), i.e. what seeing the word adds to what the context
predicts. L = L_MLM1 + L_MLM2 + lambda * L_GR. Only enc2 is kept for inference.

The gloss encoder starts as a copy of the same checkpoint's transformer body (no LM head).
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import nn

from mirrorbert.errors import UserError
from mirrorbert.encoder.masked_lm import (mlm_forward, require_fast_tokenizer, span_mean,
                                         span_token_positions)
from mirrorbert.gloss.losses import (
    DEFAULT_TAU,
    IGNORE_INDEX,
    cosine_logits,
    gloss_candidates,
    gloss_infonce,
    masked_lm_loss,
    pick_hard_negative,
)
from mirrorbert.gloss.triplets import Triplet

logger = logging.getLogger(__name__)

ARCHS = ("mt", "sc")
DEFAULT_LAMBDA = 2.0


# --------------------------------------------------------------------------- tokenisation
@dataclass(frozen=True)
class EncodedTriplet:
    """A triplet's sentence token ids and the positions of the target's sub-tokens."""

    index: int  # position in the triplet list it came from
    input_ids: tuple[int, ...]
    target_positions: tuple[int, ...]


def encode_triplets(tokenizer, triplets: Sequence[Triplet], max_length: int = 128) -> list[EncodedTriplet]:
    """Tokenise sentences once; triplets whose target is cut off by truncation are dropped."""
    require_fast_tokenizer(tokenizer)
    out: list[EncodedTriplet] = []
    dropped = 0
    batch = 1024
    for b in range(0, len(triplets), batch):
        chunk = triplets[b:b + batch]
        enc = tokenizer(
            [t.sentence for t in chunk], truncation=True, max_length=max_length,
            return_offsets_mapping=True, return_special_tokens_mask=True,
        )
        for j, t in enumerate(chunk):
            pos = span_token_positions(enc["offset_mapping"][j], enc["special_tokens_mask"][j], t.start, t.end)
            if not pos:
                dropped += 1
                continue
            out.append(EncodedTriplet(b + j, tuple(enc["input_ids"][j]), tuple(pos)))
    if dropped:
        logger.warning("%d triplets dropped: target word beyond max_length=%d tokens", dropped, max_length)
    return out


@dataclass
class GlossBatch:
    """Tensors for one training or evaluation step."""

    context_ids: torch.Tensor  # [B, L] sentence with target sub-tokens masked (c)
    full_ids: torch.Tensor  # [B, L] the unmasked sentence (s)
    attention_mask: torch.Tensor  # [B, L]
    target_mask: torch.Tensor  # [B, L] True on the target's sub-tokens
    mlm_labels: torch.Tensor  # [B, L] original ids where c is corrupted, -100 elsewhere
    gloss_ids: torch.Tensor  # [G, Lg] distinct glosses (positives first, then hard negatives)
    gloss_attention: torch.Tensor  # [G, Lg]
    targets: torch.Tensor  # [B] index of each triplet's gloss in gloss_ids
    n_hard: int = 0  # how many triplets got a hard negative

    def to(self, device) -> "GlossBatch":
        return GlossBatch(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()})


def collate(
    encoded: Sequence[EncodedTriplet],
    triplets: Sequence[Triplet],
    tokenizer,
    inventory: Mapping[str, Sequence[str]] | None = None,
    rng: random.Random | None = None,
    masker=None,
    generator: torch.Generator | None = None,
    max_gloss_length: int = 64,
) -> GlossBatch:
    """Build a batch: mask targets, optionally add random MLM masking, encode distinct glosses.

    ``inventory`` (word -> its glosses) supplies one hard negative per triplet; ``masker`` (a
    :class:`mirrorbert.mlm.masking.MlmMasker`) adds ordinary 80/10/10 masking of other tokens.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    length = max(len(e.input_ids) for e in encoded)
    n = len(encoded)
    full = torch.full((n, length), pad, dtype=torch.long)
    att = torch.zeros((n, length), dtype=torch.long)
    tmask = torch.zeros((n, length), dtype=torch.bool)
    for i, e in enumerate(encoded):
        full[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
        att[i, : len(e.input_ids)] = 1
        tmask[i, list(e.target_positions)] = True
    context = full.clone()
    context[tmask] = tokenizer.mask_token_id
    labels = torch.where(tmask, full, torch.full_like(full, IGNORE_INDEX))
    if masker is not None:
        corrupted, extra = masker(context, att, generator=generator)
        context = torch.where(tmask, context, corrupted)
        labels = torch.where(tmask, labels, extra)

    positives = [triplets[e.index].gloss for e in encoded]
    hard: list[str | None] = []
    if inventory is not None:
        rng = rng or random.Random(0)
        hard = [pick_hard_negative(triplets[e.index].word, triplets[e.index].gloss, inventory, rng) for e in encoded]
    candidates, targets = gloss_candidates(positives, hard)
    g = tokenizer(candidates, truncation=True, max_length=max_gloss_length, padding=True, return_tensors="pt")
    return GlossBatch(
        context_ids=context, full_ids=full, attention_mask=att, target_mask=tmask, mlm_labels=labels,
        gloss_ids=g["input_ids"], gloss_attention=g["attention_mask"],
        targets=torch.tensor(targets, dtype=torch.long), n_hard=sum(h is not None for h in hard),
    )


# --------------------------------------------------------------------------- model
@dataclass
class GROutput:
    loss: torch.Tensor
    mlm: torch.Tensor
    gr: torch.Tensor
    mlm2: torch.Tensor | None = None
    accuracy: float = 0.0  # in-batch gloss-matching accuracy
    logs: dict = field(default_factory=dict)


class GlossRegularizedMLM(nn.Module):
    """Context encoder(s) with LM head plus a gloss encoder; see the module docstring."""

    def __init__(self, context: nn.Module, gloss_encoder: nn.Module, arch: str = "mt",
                 context2: nn.Module | None = None, lam: float = DEFAULT_LAMBDA, tau: float = DEFAULT_TAU):
        super().__init__()
        if arch not in ARCHS:
            raise UserError(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
        if arch == "sc" and context2 is None:
            raise ValueError("arch 'sc' needs a second context encoder")
        if tau <= 0:
            raise UserError(f"--tau must be > 0, got {tau}")
        self.arch = arch
        self.context = context  # mt: the model; sc: enc1 (masked context only)
        self.context2 = context2 if arch == "sc" else None  # sc: enc2 (kept for inference)
        self.gloss_encoder = gloss_encoder
        self.lam = float(lam)
        self.tau = float(tau)

    @classmethod
    def from_mlm(cls, mlm: nn.Module, arch: str = "mt", lam: float = DEFAULT_LAMBDA, tau: float = DEFAULT_TAU):
        """Build from one loaded masked LM: the other encoders are copies of the same weights."""
        gloss = copy.deepcopy(mlm.base_model)
        context2 = copy.deepcopy(mlm) if arch == "sc" else None
        return cls(mlm, gloss, arch=arch, context2=context2, lam=lam, tau=tau)

    @property
    def inference_model(self) -> nn.Module:
        """The masked LM that users get: the single encoder (mt) or enc2 (sc)."""
        return self.context2 if self.arch == "sc" else self.context

    def save_inference(self, path: str | Path, tokenizer=None) -> None:
        """Save only the inference MLM (HF ``*ForMaskedLM`` format) and the tokenizer."""
        path = Path(path)
        self.inference_model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    # ------------------------------------------------------------------ pieces
    def encode_glosses(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """First-token vectors of the gloss texts: e_t."""
        return self.gloss_encoder(input_ids=ids, attention_mask=attention).last_hidden_state[:, 0]

    def queries(self, batch: GlossBatch) -> torch.Tensor:
        """The gloss-matching query per triplet, without any MLM loss (for evaluation)."""
        hs_model = self.context2 if self.arch == "sc" else self.context
        hidden_s, _ = mlm_forward(hs_model, batch.full_ids, batch.attention_mask)
        h_s = span_mean(hidden_s, batch.target_mask)
        if self.arch == "mt":
            return h_s
        hidden_c, _ = mlm_forward(self.context, batch.context_ids, batch.attention_mask)
        return h_s - span_mean(hidden_c, batch.target_mask)

    def forward(self, batch: GlossBatch) -> GROutput:
        predict = batch.mlm_labels != IGNORE_INDEX
        labels = batch.mlm_labels[predict]
        hidden_c, logits_c = mlm_forward(self.context, batch.context_ids, batch.attention_mask, predict)
        mlm1 = masked_lm_loss(logits_c, labels)
        mlm2 = None
        if self.arch == "mt":
            hidden_s, _ = mlm_forward(self.context, batch.full_ids, batch.attention_mask)
            query = span_mean(hidden_s, batch.target_mask)
        else:
            _, logits_c2 = mlm_forward(self.context2, batch.context_ids, batch.attention_mask, predict)
            mlm2 = masked_lm_loss(logits_c2, labels)
            hidden_s, _ = mlm_forward(self.context2, batch.full_ids, batch.attention_mask)
            query = span_mean(hidden_s, batch.target_mask) - span_mean(hidden_c, batch.target_mask)
        glosses = self.encode_glosses(batch.gloss_ids, batch.gloss_attention)
        gr = gloss_infonce(query, glosses, batch.targets, self.tau)
        loss = mlm1 + (mlm2 if mlm2 is not None else 0.0) + self.lam * gr
        with torch.no_grad():
            acc = (cosine_logits(query, glosses, self.tau).argmax(-1) == batch.targets).float().mean().item()
        return GROutput(loss=loss, mlm=mlm1, gr=gr, mlm2=mlm2, accuracy=acc)


@torch.no_grad()
def gloss_matching_accuracy(
    model: GlossRegularizedMLM,
    tokenizer,
    triplets: Sequence[Triplet],
    encoded: Sequence[EncodedTriplet],
    device: torch.device | str = "cpu",
    batch_size: int = 64,
    max_gloss_length: int = 64,
    autocast_ctx=None,
) -> dict[str, float]:
    """Held-out gloss matching: pick each triplet's gloss by cosine to its query.

    ``accuracy``: among all distinct glosses of the held-out triplets (what the loss trains);
    ``accuracy_word``: among the glosses the same word has in the held-out set, over triplets
    whose word has at least two (a word-sense-disambiguation view).
    """
    import contextlib

    ctx = autocast_ctx or contextlib.nullcontext
    was_training = model.training
    model.eval()
    try:
        glosses: list[str] = []
        gindex: dict[str, int] = {}
        for e in encoded:
            g = triplets[e.index].gloss
            if g not in gindex:
                gindex[g] = len(glosses)
                glosses.append(g)
        gvecs = []
        for b in range(0, len(glosses), batch_size):
            enc = tokenizer(glosses[b:b + batch_size], truncation=True, max_length=max_gloss_length,
                            padding=True, return_tensors="pt").to(device)
            with ctx():
                gvecs.append(model.encode_glosses(enc["input_ids"], enc["attention_mask"]).float())
        gmat = torch.cat(gvecs) if gvecs else torch.zeros(0, 1)
        queries = []
        for b in range(0, len(encoded), batch_size):
            chunk = encoded[b:b + batch_size]
            batch = collate(chunk, triplets, tokenizer, inventory=None, max_gloss_length=8).to(device)
            with ctx():
                queries.append(model.queries(batch).float())
        qmat = torch.cat(queries) if queries else torch.zeros(0, 1)
        sims = cosine_logits(qmat, gmat, 1.0).cpu()
        gold = torch.tensor([gindex[triplets[e.index].gloss] for e in encoded])
        acc = (sims.argmax(-1) == gold).float().mean().item() if len(encoded) else 0.0
        # Per-word: restrict candidates to the word's glosses seen in the held-out set.
        by_word: dict[str, set[int]] = {}
        for e in encoded:
            by_word.setdefault(triplets[e.index].word.lower(), set()).add(gindex[triplets[e.index].gloss])
        hits, total = 0, 0
        for i, e in enumerate(encoded):
            cands = sorted(by_word[triplets[e.index].word.lower()])
            if len(cands) < 2:
                continue
            best = cands[int(sims[i, cands].argmax())]
            hits += int(best == int(gold[i]))
            total += 1
        return {"accuracy": acc, "accuracy_word": hits / total if total else float("nan"),
                "n": float(len(encoded)), "n_glosses": float(len(glosses)), "n_word": float(total)}
    finally:
        model.train(was_training)
