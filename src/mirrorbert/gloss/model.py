"""GR-BERT model: a masked LM (context encoder) plus a gloss encoder (a copy of its transformer body), in two
architectures. For a triplet (word, sentence s, gloss t) the target's sub-tokens are masked to give the context c;
h_c and h_s are the means of the encoder's output over the target's positions in c and s, e_t the gloss
encoder's first-token vector of t.

``mt``: one context encoder; L = L_MLM(c) + lambda * L_GR(h_s, e).
``sc``: enc1 sees c and learns MLM; enc2 learns MLM on c too and sees s; the query is h_s(enc2) - h_c(enc1).
L = L_MLM1 + L_MLM2 + lambda * L_GR. Only enc2 is kept for inference. L_GR is InfoNCE of the query against the
glosses of the batch and one other gloss of the same word (cosine over tau = 0.05, as in the paper).
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mirrorbert.encoder.masked_lm import (mlm_forward, require_fast_tokenizer, span_mean,
                                         span_token_positions)
from mirrorbert.gloss.triplets import Triplet
from mirrorbert.mlm.masking import IGNORE_INDEX
from mirrorbert.runtime.device import autocast

logger = logging.getLogger(__name__)

DEFAULT_LAMBDA = 2.0
DEFAULT_TAU = 0.05


def cosine_logits(queries: torch.Tensor, candidates: torch.Tensor, tau: float = DEFAULT_TAU) -> torch.Tensor:
    """``cos(q_i, e_j) / tau`` for all pairs: [B, d] x [G, d] -> [B, G], computed in float32."""
    q = F.normalize(queries.float(), dim=-1)
    e = F.normalize(candidates.float(), dim=-1)
    return q @ e.T / tau


def gloss_infonce(
    queries: torch.Tensor,
    glosses: torch.Tensor,
    targets: torch.Tensor,
    tau: float = DEFAULT_TAU,
) -> torch.Tensor:
    """InfoNCE of each query against all gloss embeddings; ``targets[i]`` indexes its gloss. ``glosses`` holds
    every distinct gloss of the batch (positives and hard negatives), so the other rows are the negatives."""
    return F.cross_entropy(cosine_logits(queries, glosses, tau), targets.long())


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100 (0 when there are none); ``logits`` [..., V]
    aligned with ``labels`` [...], or gathered at the labelled positions ([N, V] with ``labels`` [N])."""
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep], labels[keep].long())


def gloss_candidates(positives: Sequence[str], hard_negatives: Sequence[str | None]) -> tuple[list[str], list[int]]:
    """Distinct glosses of a batch (each encoded once, so a shared gloss is never a negative of itself) and each
    triplet's target index among them."""
    index: dict[str, int] = {}
    candidates: list[str] = []

    def add(g: str) -> int:
        if g not in index:
            index[g] = len(candidates)
            candidates.append(g)
        return index[g]

    targets = [add(g) for g in positives]
    for g in hard_negatives:
        if g is not None:
            add(g)
    return candidates, targets


def pick_hard_negative(word: str, gloss: str, inventory: Mapping[str, Sequence[str]], rng: random.Random) -> str | None:
    """A random other gloss of ``word`` (None when the word has a single gloss)."""
    others = [g for g in inventory.get(word.lower(), ()) if g != gloss]
    return rng.choice(others) if others else None


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
    *,
    inventory: Mapping[str, Sequence[str]] | None = None,
    rng: random.Random | None = None,
    masker=None,
    max_gloss_length: int = 64,
) -> GlossBatch:
    """Build a batch: mask targets, optionally add random MLM masking, encode distinct glosses. ``inventory``
    (word -> its glosses) supplies one hard negative per triplet, drawn from ``rng``; ``masker`` (`(ids, attention)
    -> (corrupted, labels)`, an `MlmMasker` with its generator) adds 80/10/10 masking of the other tokens."""
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
        corrupted, extra = masker(context, att)
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


@dataclass
class GROutput:
    loss: torch.Tensor
    mlm: torch.Tensor
    gr: torch.Tensor
    mlm2: torch.Tensor | None = None
    accuracy: float = 0.0  # in-batch gloss-matching accuracy


class GlossRegularizedMLM(nn.Module):
    """Context encoder(s) with LM head plus a gloss encoder; see the module docstring."""

    def __init__(self, context: nn.Module, gloss_encoder: nn.Module, arch: str = "mt",
                 context2: nn.Module | None = None, lam: float = DEFAULT_LAMBDA, tau: float = DEFAULT_TAU):
        super().__init__()
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

    def save_inference(self, path: str | Path, tokenizer) -> None:
        """Save only the inference MLM (HF ``*ForMaskedLM`` format) and the tokenizer."""
        self.inference_model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    def encode_glosses(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """First-token vectors of the gloss texts: e_t."""
        return self.gloss_encoder(input_ids=ids, attention_mask=attention).last_hidden_state[:, 0]

    def queries(self, batch: GlossBatch, hidden_c: torch.Tensor | None = None) -> torch.Tensor:
        """The gloss-matching query per triplet (`hidden_c`: enc1's output on the context, when computed already)."""
        hidden_s, _ = mlm_forward(self.inference_model, batch.full_ids, batch.attention_mask)
        h_s = span_mean(hidden_s, batch.target_mask)
        if self.arch == "mt":
            return h_s
        if hidden_c is None:
            hidden_c, _ = mlm_forward(self.context, batch.context_ids, batch.attention_mask)
        return h_s - span_mean(hidden_c, batch.target_mask)

    def forward(self, batch: GlossBatch) -> GROutput:
        predict = batch.mlm_labels != IGNORE_INDEX
        labels = batch.mlm_labels[predict]
        hidden_c, logits_c = mlm_forward(self.context, batch.context_ids, batch.attention_mask, predict)
        mlm1 = masked_lm_loss(logits_c, labels)
        mlm2 = None
        if self.arch == "sc":
            _, logits_c2 = mlm_forward(self.context2, batch.context_ids, batch.attention_mask, predict)
            mlm2 = masked_lm_loss(logits_c2, labels)
        query = self.queries(batch, hidden_c)
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
    *,
    batch_size: int = 64,
    max_gloss_length: int = 64,
    precision: str = "fp32",
) -> dict[str, float]:
    """Held-out gloss matching on the model's device: pick each triplet's gloss by cosine to its query.
    ``accuracy``: among all distinct glosses of the held-out triplets (what the loss trains); ``accuracy_word``:
    among the glosses the same word has in the held-out set, over triplets whose word has at least two."""
    device = next(model.parameters()).device
    glosses, gold = gloss_candidates([triplets[e.index].gloss for e in encoded], [])
    was_training = model.training
    model.eval()
    try:
        gvecs, queries = [], []
        for b in range(0, len(glosses), batch_size):
            enc = tokenizer(glosses[b:b + batch_size], truncation=True, max_length=max_gloss_length,
                            padding=True, return_tensors="pt").to(device)
            with autocast(device, precision):
                gvecs.append(model.encode_glosses(enc["input_ids"], enc["attention_mask"]).float().cpu())
        for b in range(0, len(encoded), batch_size):
            batch = collate(encoded[b:b + batch_size], triplets, tokenizer, max_gloss_length=8).to(device)
            with autocast(device, precision):
                queries.append(model.queries(batch).float().cpu())
    finally:
        model.train(was_training)
    gmat = torch.cat(gvecs) if gvecs else torch.zeros(0, 1)
    sims = cosine_logits(torch.cat(queries) if queries else torch.zeros(0, 1), gmat, 1.0)
    acc = (sims.argmax(-1) == torch.tensor(gold)).float().mean().item() if len(encoded) else 0.0
    by_word: dict[str, set[int]] = {}  # per word: the candidates are its glosses seen in the held-out set
    for e, g in zip(encoded, gold):
        by_word.setdefault(triplets[e.index].word.lower(), set()).add(g)
    hits, total = 0, 0
    for i, (e, g) in enumerate(zip(encoded, gold)):
        cands = sorted(by_word[triplets[e.index].word.lower()])
        if len(cands) >= 2:
            hits += int(cands[int(sims[i, cands].argmax())] == g)
            total += 1
    return {"accuracy": acc, "accuracy_word": hits / total if total else float("nan"),
            "n": float(len(encoded)), "n_glosses": float(len(glosses)), "n_word": float(total)}
