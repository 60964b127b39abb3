"""Lexical substitution (SemEval-2007 LS07 and CoInCo/LS14) with a masked LM: candidate generation and the task.

The test sets and the answer-file format are in `lexsub_data`, the official metrics in `lexsub_scoring`.
Substitutes are ranked by p(x|s) = softmax(h_s^T v_x) of the *unmasked* sentence s, h_s the mean of the target's
sub-tokens' final hidden states; only whole alphabetic vocabulary words are candidates. Candidates sharing the
target's lemma, not a WordNet lemma of its POS, or duplicates after lemmatisation are dropped; each is reported
as its lemma (the GR-BERT paper, appendix C).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.evaluation.lexsub_data import LexSubItem, load_lexsub, resolve_dataset, word_span, write_system_file
from mirrorbert.evaluation.lexsub_scoring import LexSubScores, score_lexsub
from mirrorbert.settings.fields import option
from mirrorbert.settings.option_help import COUNT, MODEL_POSITIONS
from mirrorbert.settings.validation import Options


@dataclass(kw_only=True)
class GenerationConfig(Options):
    """How substitutes are generated and re-ranked; each field is a `lexsub` option (settings/fields.py)."""

    post: tuple[str, ...] = option((), help="post-processing, repeatable or comma-separated: emb (mix in "
                                            "input-embedding similarity), valid (re-rank the top candidates by "
                                            "sentence similarity after substitution); default none",
                                   choices=("emb", "valid"), repeat=True)
    emb_weight: float = option(1.0, help="weight of the embedding-similarity log-probability")
    emb_temperature: float = option(1.0 / 15.0, help="temperature of the embedding-similarity softmax (default 1/15)",
                                    range="(0, inf)")
    valid_weight: float = option(0.01, help="weight of the proposal score added to the validation score")
    valid_top: int = option(50, help="how many top candidates 'valid' re-ranks", range=COUNT)
    pool: int = option(300, help="vocabulary candidates considered before filtering", range=COUNT)
    keep: int = option(50, help="substitutes kept per item after filtering", range=COUNT)
    batch_size: int = option(32, shared="batch_size", note="sentences per forward pass")
    max_length: int = option(256, shared="max_length", note=MODEL_POSITIONS)


def word_candidates(tokenizer) -> tuple[list[int], list[str]]:
    """Vocabulary ids that are whole alphabetic words, and the words (lower-cased)."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    ids, words = [], []
    # Byte-level BPE / SentencePiece mark word starts; WordPiece marks continuations with ##.
    n = max(1, len(vocab))
    marker = next((m for m in ("\u0120", "\u2581") if sum(t.startswith(m) for t in vocab) / n > 0.1), "")
    for tok, idx in vocab.items():
        if idx in special or (marker and not tok.startswith(marker)) or (not marker and tok.startswith("##")):
            continue
        word = tok[len(marker):]
        if len(word) >= 2 and word.isascii() and word.isalpha():
            ids.append(idx)
            words.append(word.lower())
    return ids, words


class LexSubGenerator:
    """Ranks substitutes for LexSubItems with a masked LM (see module docstring)."""

    def __init__(self, model, tokenizer, wordnet, device="cpu", config: GenerationConfig | None = None):
        import torch

        from mirrorbert.encoder.masked_lm import model_max_length, require_fast_tokenizer

        require_fast_tokenizer(tokenizer)
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.config = config or GenerationConfig()
        ids, words = word_candidates(tokenizer)
        n_vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else len(tokenizer)
        keep = [i for i, x in enumerate(ids) if x < n_vocab]
        self.cand_ids = torch.tensor([ids[i] for i in keep], dtype=torch.long)
        self.cand_words = [words[i] for i in keep]
        if not self.cand_words:
            raise UserError("the tokenizer vocabulary has no whole-word entries to use as substitutes")
        self._morphy = functools.lru_cache(maxsize=None)(wordnet.morphy)
        self.max_length = min(self.config.max_length, model_max_length(model, tokenizer))

    def _forward(self, sentences: Sequence[str], spans: Sequence[tuple[int, int]]):
        """(final hidden states, input ids, attention mask, target mask) of ``sentences`` on the device; a target
        cut off by truncation falls back to the last real token."""
        import torch

        from mirrorbert.encoder.masked_lm import mlm_forward, span_token_positions

        enc = self.tokenizer(list(sentences), truncation=True, max_length=self.max_length, padding=True,
                             return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        tmask = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
        for i, (s, e) in enumerate(spans):
            pos = span_token_positions(enc["offset_mapping"][i].tolist(), enc["special_tokens_mask"][i].tolist(), s, e)
            tmask[i, pos or [int(enc["attention_mask"][i].sum()) - 2]] = True
        ids, att, tmask = (x.to(self.device) for x in (enc["input_ids"], enc["attention_mask"], tmask))
        with torch.no_grad():
            hidden, _ = mlm_forward(self.model, ids, att)
        return hidden, ids, att, tmask

    def _fit(self, item: LexSubItem) -> tuple[tuple[str, ...], int]:
        """The item's words, cropped around the target (from the longer side) to fit the model's length."""
        tokens, index = tuple(item.tokens), item.index
        limit = self.max_length - 4  # room for special tokens and substitutes longer than the target
        while len(tokens) > 1 and len(self.tokenizer(" ".join(tokens), add_special_tokens=False)["input_ids"]) > limit:
            if index >= len(tokens) - 1 - index:
                tokens, index = tokens[1:], index - 1
            else:
                tokens = tokens[:-1]
        return tokens, index

    def filter_candidates(self, item: LexSubItem, words: Sequence[str], scores: Sequence[float]) -> list[tuple[str, float]]:
        """Drop same-lemma, wrong-POS and lemma-duplicate candidates; return (lemma, score)."""
        from mirrorbert.data.wordnet import shortest_base_form

        pos = item.pos
        target_forms = {item.lemma.replace(" ", "_"), item.target.lower().replace(" ", "_")}
        target_forms.update(self._morphy(item.target.lower(), pos))
        out: list[tuple[str, float]] = []
        seen: set[str] = set()
        for w, s in zip(words, scores):
            lemmas = self._morphy(w, pos)
            if not lemmas:  # not a WordNet word of the target's POS
                continue
            if w in target_forms or any(l in target_forms for l in lemmas):
                continue
            lemma = shortest_base_form(lemmas, w)  # "eggs" -> "egg"
            if lemma in seen:
                continue
            seen.add(lemma)
            out.append((lemma.replace("_", " "), float(s)))
            if len(out) >= self.config.keep:
                break
        return out

    def rank(self, items: Sequence[LexSubItem], show_progress: bool = False) -> dict[tuple[str, str], list[str]]:
        """Ranked, filtered substitutes (lemmas) per item key."""
        import torch

        from mirrorbert.encoder.masked_lm import span_mean
        from mirrorbert.reporting.progress import progress_bar

        cfg = self.config
        out: dict[tuple[str, str], list[str]] = {}
        emb = self.model.get_input_embeddings().weight
        cand = self.cand_ids.to(self.device)
        for b in progress_bar(range(0, len(items), cfg.batch_size), desc="lexsub", show=show_progress):
            chunk = items[b:b + cfg.batch_size]
            fitted = [self._fit(it) for it in chunk]
            sentences, spans = [" ".join(t) for t, _ in fitted], [word_span(t, i) for t, i in fitted]
            hidden, ids, att, tmask = self._forward(sentences, spans)
            with torch.no_grad():
                scores = torch.log_softmax(self._head(span_mean(hidden, tmask)).float()[:, cand], dim=-1)
                if "emb" in cfg.post:
                    scores = scores + cfg.emb_weight * self._emb_scores(emb, ids, tmask, cand)
            n_pool = min(cfg.pool, scores.shape[1])
            top = scores.topk(n_pool, dim=-1)
            for i, it in enumerate(chunk):
                words = [self.cand_words[j] for j in top.indices[i].tolist()]
                kept = self.filter_candidates(it, words, top.values[i].tolist())
                if "valid" in cfg.post and kept:
                    kept = self._validate(fitted[i], kept, hidden[i], tmask[i], att[i])
                out[it.key] = [w for w, _ in kept]
        return out

    def _head(self, h):
        from mirrorbert.encoder.masked_lm import lm_head_of

        head = lm_head_of(self.model)
        if head is None:
            raise UserError(f"{type(self.model).__name__}: no BERT/RoBERTa-style LM head found for substitution")
        return head(h)

    def _emb_scores(self, emb, ids, tmask, cand):
        """log softmax over candidates of cos(input emb of x, mean input emb of the target) / T."""
        import torch
        import torch.nn.functional as F

        tvec = (emb[ids] * tmask.unsqueeze(-1)).sum(1) / tmask.sum(1, keepdim=True).clamp(min=1)
        sims = F.normalize(tvec.float(), dim=-1) @ F.normalize(emb[cand].float(), dim=-1).T
        return torch.log_softmax(sims / self.config.emb_temperature, dim=-1)

    def _validate(self, fitted: tuple[tuple[str, ...], int], kept, hidden, tmask, att):
        """Re-rank the top ``valid_top`` by validation + valid_weight * proposal score, the validation score being
        the mean cosine of the original and the substituted sentence's final hidden states over aligned positions
        (every context token, and the target slot as the mean over its sub-tokens)."""
        import torch.nn.functional as F

        from mirrorbert.encoder.masked_lm import span_mean

        cfg = self.config
        head, tail = kept[: cfg.valid_top], kept[cfg.valid_top:]
        n = int(att.sum())
        orig_ctx = hidden[:n][~tmask[:n]]
        orig_tgt = hidden[:n][tmask[:n]].mean(0)
        tokens, index = fitted
        start = word_span(tokens, index)[0]
        sentences = [" ".join((*tokens[:index], w, *tokens[index + 1:])) for w, _ in head]
        spans = [(start, start + len(w)) for w, _ in head]
        new_scores = []
        for b in range(0, len(sentences), cfg.batch_size):
            h2, _, satt, sm = self._forward(sentences[b:b + cfg.batch_size], spans[b:b + cfg.batch_size])
            tgt2 = span_mean(h2, sm)
            for i in range(h2.shape[0]):
                m = int(satt[i].sum())
                ctx2 = h2[i, :m][~sm[i, :m]]
                if ctx2.shape[0] != orig_ctx.shape[0]:  # truncation changed the context: compare the target only
                    sim = F.cosine_similarity(tgt2[i].float(), orig_tgt.float(), dim=0)
                else:
                    sims = F.cosine_similarity(ctx2.float(), orig_ctx.float(), dim=-1)
                    tsim = F.cosine_similarity(tgt2[i].float(), orig_tgt.float(), dim=0)
                    sim = (sims.sum() + tsim) / (sims.numel() + 1)
                new_scores.append(float(sim))
        rescored = [(w, v + cfg.valid_weight * s) for (w, s), v in zip(head, new_scores)]
        rescored.sort(key=lambda x: -x[1])
        return rescored + tail


def evaluate_lexsub(
    model_path: str,
    dataset: str,
    data_dir: str | os.PathLike | None = None,
    *,
    device: str | None = None,
    config: GenerationConfig | None = None,
    limit: int | None = None,
    output_dir: str | os.PathLike | None = None,
    show_progress: bool = False,
    trust_remote_code: bool = False,
) -> LexSubScores:
    """A masked LM's substitutes for a test set, scored (`trust_remote_code`: see `Encoder.load`)."""
    from mirrorbert.data.wordnet import WordNet
    from mirrorbert.encoder.masked_lm import load_masked_lm
    from mirrorbert.runtime.device import resolve_device

    config = config or GenerationConfig()
    name = resolve_dataset(dataset)
    items = load_lexsub(dataset, data_dir)
    wn = WordNet.load(data_dir)
    if limit:
        items = items[:limit]
    tok, model = load_masked_lm(str(model_path), trust_remote_code)
    gen = LexSubGenerator(model, tok, wn, device=resolve_device(device), config=config)
    ranked = gen.rank(items, show_progress=show_progress)
    gold = {it.key: dict(it.gold) for it in items if it.gold}
    best = {k: v[:1] for k, v in ranked.items()}
    oot = {k: v[:10] for k, v in ranked.items()}
    scores = score_lexsub(gold, best, oot, ranked)
    scores.extra.update({"dataset": name, "model": str(model_path),
                         "post": "+".join(gen.config.post) or "none"})
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_system_file(out / f"{name}.best", best)
        write_system_file(out / f"{name}.oot", oot, oot=True)
        (out / f"{name}.scores.json").write_text(jsonio.dumps(scores.as_dict(), indent=2) + "\n", encoding="utf-8")
    return scores
