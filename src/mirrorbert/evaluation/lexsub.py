"""Lexical substitution (SemEval-2007 LS07 and CoInCo/LS14) with a masked LM, and its metrics.

Data (``<data_dir>/lexsub``, the LexSubCon preprocessing):

* ``*.preprocessed``: ``lemma.pos TAB id TAB target-token-index TAB sentence`` (sentence
  tokens separated by single spaces, lower-cased);
* ``*.gold``: ``lemma.pos id :: sub count;sub count;...``.

Candidate generation (the GR-BERT protocol): the *unmasked* sentence s goes through the MLM
and the substitutes are ranked by p(x|s) = softmax(h_s^T v_x) at the target position. A
target that the tokenizer splits into several sub-tokens is represented by the mean of its
sub-tokens' final hidden states (the same h_s as in GR-BERT training), and that single vector
goes through the LM head. Only whole-word vocabulary entries are candidates (WordPiece
tokens without ``##``, byte-level BPE tokens with the word-start marker, alphabetic).
Candidates are then filtered (paper appendix C): those sharing the target's lemma, those
that are not a WordNet lemma of the target's POS, and duplicates after lemmatisation (the
best-scored form is kept and reported as its lemma, since gold substitutes are lemmas).

Metrics follow the official SemEval-2007 scorer (McCarthy & Navigli 2007, ``score.pl``):

* scored items T: gold lines with at least two responses in total (after removing entries
  containing ``pn``, the annotators' proper-noun marker); H_i = total response count;
* **best**: per item, sum of gold counts of the guesses / number of guesses / H_i;
  precision averages over attempted items, recall over all of T;
* **best-mode**: over items with a unique most frequent response, 1 when the *first* guess
  is that mode;
* **oot**: up to 10 guesses, sum of their gold counts / H_i (not divided by the number of
  guesses); **oot-mode**: 1 when the mode is among the guesses;
* precision and recall differ only when some items are unanswered; both are reported.
* Normalisation as in the scorer (one apostrophe removed, hyphens read as spaces,
  ``non-x``/``non x`` -> ``nonx``), plus lower-casing of both sides (our vocabulary is
  lower-cased; the official scorer is case-sensitive, which only matters for the few
  capitalised CoInCo substitutes) and the same normalisation of the mode (the scorer
  compares a hyphenated mode with de-hyphenated guesses, so it can never match).

P@k (the lexsub generation literature, e.g. Zhou et al. 2019; LexSubCon): over the scored
items, the fraction of the top-k generated substitutes that are in the gold set (any gold
count), averaged over items; an item with fewer than k guesses still divides by k.
All scores are percentages, as the official scorer prints them.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import DatasetMissing, UserError

logger = logging.getLogger(__name__)

DATASETS: dict[str, tuple[str, str]] = {
    "LS07": ("LS07/test/lst_test.preprocessed", "LS07/test/lst_test.gold"),
    "LS14": ("LS14/test/coinco_test.preprocessed", "LS14/test/coinco_test.gold"),
}
ALIASES = {"ls07": "LS07", "semeval2007": "LS07", "ls14": "LS14", "coinco": "LS14"}

#: Post-processing defaults. The GR-BERT paper's own values could not be looked up offline;
#: these follow the methods it builds on. emb: product of experts with the embedding
#: similarity distribution (Arefyev et al. 2020 style, weight 1, temperature 1/15).
#: valid: Zhou et al. (2019) add 0.01 x the proposal score to the validation score.
DEFAULT_EMB_WEIGHT = 1.0
DEFAULT_EMB_TEMPERATURE = 1.0 / 15.0
DEFAULT_VALID_WEIGHT = 0.01
DEFAULT_VALID_TOP = 50
POST_CHOICES = ("none", "emb", "valid")


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class LexSubItem:
    """One target occurrence: ``key`` is (``lemma.pos``, id), the scorer's item identity."""

    lemma_pos: str
    id: str
    tokens: tuple[str, ...]
    index: int
    gold: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.lemma_pos, self.id)

    @property
    def lemma(self) -> str:
        return self.lemma_pos.rsplit(".", 1)[0].lower()

    @property
    def pos(self) -> str:
        """The target's POS as n/v/a/r (CoInCo's J is an adjective)."""
        from mirrorbert.data.wordnet import normalize_pos

        return normalize_pos(self.lemma_pos.rsplit(".", 1)[1])

    @property
    def target(self) -> str:
        return self.tokens[self.index]

    @property
    def sentence(self) -> str:
        return " ".join(self.tokens)

    def target_span(self) -> tuple[int, int]:
        start = sum(len(t) + 1 for t in self.tokens[: self.index])
        return start, start + len(self.tokens[self.index])


def _read_lines(path: Path) -> list[str]:
    # One LS07 sentence has a stray Latin-1 byte; replacing it is harmless for scoring.
    from mirrorbert.safeguards.readback import read_regular_bytes

    return read_regular_bytes(path, "lexical substitution file", 1 << 30).decode("utf-8", errors="replace").splitlines()


def read_preprocessed(path: str | os.PathLike) -> list[LexSubItem]:
    """Parse a ``.preprocessed`` file; malformed lines raise a UserError naming file and line."""
    path = Path(path)
    items: list[LexSubItem] = []
    for lineno, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise UserError(f"{path}:{lineno}: expected 4 TAB-separated fields (lemma.pos, id, index, sentence)")
        lemma_pos, item_id, idx, sentence = fields
        tokens = tuple(sentence.strip().split(" "))
        try:
            index = int(idx)
        except ValueError:
            raise UserError(f"{path}:{lineno}: target index {idx!r} is not an integer") from None
        if not 0 <= index < len(tokens) or "." not in lemma_pos:
            raise UserError(f"{path}:{lineno}: target index {index} outside the sentence or bad lemma.pos {lemma_pos!r}")
        items.append(LexSubItem(lemma_pos.strip(), item_id.strip(), tokens, index))
    return items


_GOLD_ENTRY = re.compile(r"^\s*(.*\S)\s+(\d+)\s*$")


def parse_answer_line(line: str) -> tuple[str, str, str, list[str]] | None:
    """Split ``lemma.pos id :: a;b`` (best) or ``lemma.pos id ::: a;b`` (oot).

    Returns (lemma.pos, id, separator, entries) or None for a line in neither format.
    """
    m = re.match(r"^(.*\S)\s+(\S+)\s+(:::?)\s?(.*)$", line.rstrip("\r\n"))
    if not m:
        return None
    entries = [e for e in m.group(4).split(";") if e.strip()]
    return m.group(1).strip(), m.group(2), m.group(3), entries


def read_gold(path: str | os.PathLike) -> dict[tuple[str, str], dict[str, int]]:
    """``{(lemma.pos, id): {substitute: count}}`` from a ``.gold`` file (file order kept)."""
    path = Path(path)
    gold: dict[tuple[str, str], dict[str, int]] = {}
    for lineno, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        parsed = parse_answer_line(line)
        if parsed is None or parsed[2] != "::":
            raise UserError(f"{path}:{lineno}: expected 'lemma.pos id :: substitute count;...'")
        lemma_pos, item_id, _, entries = parsed
        subs: dict[str, int] = {}
        for entry in entries:
            m = _GOLD_ENTRY.match(entry)
            if not m and re.fullmatch(r"\s*\d+\s*", entry):
                # CoInCo has one response that was ";" itself ("...;; 1;"): skipped, as score.pl does.
                logger.debug("%s:%d: gold entry without a substitute skipped", path, lineno)
                continue
            if not m:
                raise UserError(f"{path}:{lineno}: gold entry {entry.strip()!r} is not 'substitute count'")
            subs[m.group(1)] = subs.get(m.group(1), 0) + int(m.group(2))
        key = (lemma_pos, item_id)
        if key in gold:
            logger.warning("%s:%d: duplicate gold item %s %s ignored", path, lineno, *key)
            continue
        gold[key] = subs
    return gold


def resolve_dataset(name: str) -> str:
    key = ALIASES.get(name.lower(), name)
    if key not in DATASETS:
        raise UserError(f"--dataset: unknown lexical substitution set {name!r}; choose LS07 or LS14 (CoInCo)")
    return key


def lexsub_dir(data_dir: str | os.PathLike | None) -> Path:
    if data_dir is None:
        data_dir = os.environ.get("MIRRORBERT_DATA")
        if not data_dir:
            raise UserError("no data directory given: pass --data-dir or set MIRRORBERT_DATA")
    base = Path(data_dir)
    return base / "lexsub" if (base / "lexsub").is_dir() else base


def load_lexsub(name: str, data_dir: str | os.PathLike | None = None) -> list[LexSubItem]:
    """Test items of LS07 or LS14 (CoInCo) with their gold substitutes attached.

    Items without a gold line are kept (with empty gold): the scorer ignores them.
    """
    key = resolve_dataset(name)
    root = lexsub_dir(data_dir)
    pre, gold_path = (root / p for p in DATASETS[key])
    for p in (pre, gold_path):
        if not p.is_file():
            raise DatasetMissing(f"{key}: {p} not found (expected the LexSubCon layout under <data_dir>/lexsub)")
    items = read_preprocessed(pre)
    gold = read_gold(gold_path)
    out = []
    seen: set[tuple[str, str]] = set()
    for it in items:
        if it.key in seen:
            continue
        seen.add(it.key)
        g = gold.get(it.key, {})
        out.append(LexSubItem(it.lemma_pos, it.id, it.tokens, it.index, tuple(g.items())))
    logger.info("%s: %d items, %d with gold", key, len(out), sum(bool(i.gold) for i in out))
    return out


# --------------------------------------------------------------------------- metrics
def normalize_answer(text: str) -> str:
    """The scorer's normalisation of a substitute (see module docstring), plus lower-casing."""
    t = text.strip().lower()
    t = re.sub(r"^non[\s-](.*)$", r"non\1", t)
    t = t.replace("-", " ")
    t = t.replace("'", "", 1)
    return re.sub(r"\s+", " ", t).strip()


@dataclass(frozen=True)
class ScoredGold:
    """An item's gold as the scorer sees it: normalised counts, total, and unique mode."""

    counts: dict[str, int]
    total: int
    mode: str | None


def prepare_gold(gold: Mapping[str, int]) -> ScoredGold | None:
    """Apply the scorer's item rules; None when the item is not scored.

    Entries containing ``pn`` are dropped; an item is scored when at least two responses
    remain in total; the mode is the single response with the strictly highest count.
    """
    counts: dict[str, int] = {}
    for sub, n in gold.items():
        if "pn" in sub:
            continue
        key = normalize_answer(sub)
        if len(key) < 2 or n <= 0:
            continue
        counts[key] = counts.get(key, 0) + int(n)
    total = sum(counts.values())
    if total < 2:
        return None
    top = max(counts.values())
    tops = [s for s, n in counts.items() if n == top]
    return ScoredGold(counts, total, tops[0] if len(tops) == 1 else None)


@dataclass
class LexSubScores:
    """Percentages; P = over attempted items, R = over all scored items."""

    best_p: float
    best_r: float
    best_mode_p: float
    best_mode_r: float
    oot_p: float
    oot_r: float
    oot_mode_p: float
    oot_mode_r: float
    p_at_1: float
    p_at_3: float
    n_items: int
    n_attempted: int
    n_mode: int
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


def _pct(num: float, den: float) -> float:
    return 100.0 * num / den if den else 0.0


def score_lexsub(
    gold: Mapping[tuple[str, str], Mapping[str, int]],
    best: Mapping[tuple[str, str], Sequence[str]],
    oot: Mapping[tuple[str, str], Sequence[str]] | None = None,
    ranked: Mapping[tuple[str, str], Sequence[str]] | None = None,
    oot_k: int = 10,
) -> LexSubScores:
    """Official best / best-mode / oot / oot-mode (P and R) and P@1, P@3.

    ``best`` holds each item's best guesses (usually one), ``oot`` up to 10 guesses (more
    are cut, as the scorer does), ``ranked`` the full ranked list for P@k; ``oot`` and
    ``ranked`` default to ``best``. Items absent from a mapping or with no guess are
    unanswered.
    """
    oot = best if oot is None else oot
    ranked = oot if ranked is None else ranked
    n_items = n_mode = 0
    b_att = o_att = b_mode_att = o_mode_att = 0
    b_sum = o_sum = 0.0
    b_mode_hits = o_mode_hits = 0
    p1 = p3 = 0.0
    for key, raw in gold.items():
        g = prepare_gold(raw)
        if g is None:
            continue
        n_items += 1
        n_mode += g.mode is not None
        guesses = [normalize_answer(x) for x in best.get(key, ()) if x.strip()]
        if guesses:
            b_att += 1
            b_sum += sum(g.counts.get(x, 0) for x in guesses) / len(guesses) / g.total
            if g.mode is not None:
                b_mode_att += 1
                b_mode_hits += guesses[0] == g.mode
        oguesses = [normalize_answer(x) for x in oot.get(key, ()) if x.strip()][:oot_k]
        if oguesses:
            o_att += 1
            o_sum += sum(g.counts.get(x, 0) for x in oguesses) / g.total
            if g.mode is not None:
                o_mode_att += 1
                o_mode_hits += g.mode in oguesses
        rguesses = [normalize_answer(x) for x in ranked.get(key, ()) if x.strip()]
        p1 += sum(x in g.counts for x in rguesses[:1]) / 1.0
        p3 += sum(x in g.counts for x in rguesses[:3]) / 3.0
    return LexSubScores(
        best_p=_pct(b_sum, b_att), best_r=_pct(b_sum, n_items),
        best_mode_p=_pct(b_mode_hits, b_mode_att), best_mode_r=_pct(b_mode_hits, n_mode),
        oot_p=_pct(o_sum, o_att), oot_r=_pct(o_sum, n_items),
        oot_mode_p=_pct(o_mode_hits, o_mode_att), oot_mode_r=_pct(o_mode_hits, n_mode),
        p_at_1=_pct(p1, n_items), p_at_3=_pct(p3, n_items),
        n_items=n_items, n_attempted=b_att, n_mode=n_mode,
    )


def read_system_file(path: str | os.PathLike) -> dict[tuple[str, str], list[str]]:
    """Read a system answer file in the official format (``::`` best or ``:::`` oot lines)."""
    path = Path(path)
    out: dict[tuple[str, str], list[str]] = {}
    for lineno, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        parsed = parse_answer_line(line)
        if parsed is None:
            raise UserError(f"{path}:{lineno}: expected 'lemma.pos id :: answers' or 'lemma.pos id ::: answers'")
        lemma_pos, item_id, _, entries = parsed
        out.setdefault((lemma_pos, item_id), [e.strip() for e in entries])  # later duplicates ignored
    return out


def write_system_file(path: str | os.PathLike, answers: Mapping[tuple[str, str], Sequence[str]], oot: bool = False) -> None:
    """Write answers in the official format (usable with the original ``score.pl``)."""
    sep = ":::" if oot else "::"
    with open(path, "w", encoding="utf-8") as fh:
        for (lemma_pos, item_id), subs in answers.items():
            fh.write(f"{lemma_pos} {item_id} {sep} {';'.join(subs)}\n")


# --------------------------------------------------------------------------- generation
@dataclass
class GenerationConfig:
    post: tuple[str, ...] = ()
    emb_weight: float = DEFAULT_EMB_WEIGHT
    emb_temperature: float = DEFAULT_EMB_TEMPERATURE
    valid_weight: float = DEFAULT_VALID_WEIGHT
    valid_top: int = DEFAULT_VALID_TOP
    pool: int = 300  # vocabulary candidates considered before filtering
    keep: int = 50  # substitutes kept per item after filtering
    batch_size: int = 32
    max_length: int = 256

    def validate(self) -> None:
        """Each value checked once, where lexsub starts (CLI or Python), naming its option."""
        from mirrorbert.settings.typed import check_finite_numbers, check_types

        check_types(self)
        check_finite_numbers(self)
        for part in self.post:
            if part not in ("emb", "valid"):
                raise UserError(f"--post: unknown post-processing {part!r}; choose from emb, valid, none")
        if self.emb_temperature <= 0:
            raise UserError(f"--emb-temperature must be > 0, got {self.emb_temperature}")
        for name in ("valid_top", "pool", "keep", "batch_size", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")


def word_candidates(tokenizer) -> tuple[list[int], list[str]]:
    """Vocabulary ids that are whole alphabetic words, and the words (lower-cased)."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    ids, words = [], []
    # Byte-level BPE / SentencePiece mark word starts; WordPiece marks continuations with ##.
    n = max(1, len(vocab))
    markers = [m for m in ("\u0120", "\u2581") if sum(t.startswith(m) for t in vocab) / n > 0.1]
    for tok, idx in vocab.items():
        if idx in special:
            continue
        if markers:
            if not tok.startswith(markers[0]):
                continue
            word = tok[len(markers[0]):]
        else:
            if tok.startswith("##"):
                continue
            word = tok
        if len(word) >= 2 and word.isascii() and word.isalpha():
            ids.append(idx)
            words.append(word.lower())
    return ids, words


class LexSubGenerator:
    """Ranks substitutes for LexSubItems with a masked LM (see module docstring)."""

    def __init__(self, model, tokenizer, wordnet, device="cpu", config: GenerationConfig | None = None):
        import torch

        from mirrorbert.encoder.masked_lm import require_fast_tokenizer

        require_fast_tokenizer(tokenizer)
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.wn = wordnet
        self.device = torch.device(device)
        self.config = config or GenerationConfig()
        for p in self.config.post:
            if p not in ("emb", "valid"):
                raise UserError(f"--post: unknown post-processing {p!r}; choose from emb, valid")
        ids, words = word_candidates(tokenizer)
        n_vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else len(tokenizer)
        keep = [i for i, x in enumerate(ids) if x < n_vocab]
        self.cand_ids = torch.tensor([ids[i] for i in keep], dtype=torch.long)
        self.cand_words = [words[i] for i in keep]
        if not self.cand_words:
            raise UserError("the tokenizer vocabulary has no whole-word entries to use as substitutes")
        self._lemma_cache: dict[tuple[str, str], list[str]] = {}
        from mirrorbert.encoder.masked_lm import model_max_length

        self.max_length = min(self.config.max_length, model_max_length(model, tokenizer))

    # ------------------------------------------------------------------ helpers
    def _encode(self, sentences: Sequence[str], spans: Sequence[tuple[int, int]]):
        from mirrorbert.encoder.masked_lm import span_token_positions

        enc = self.tokenizer(list(sentences), truncation=True, max_length=self.max_length, padding=True,
                             return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        import torch

        tmask = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
        for i, (s, e) in enumerate(spans):
            pos = span_token_positions(enc["offset_mapping"][i].tolist(), enc["special_tokens_mask"][i].tolist(), s, e)
            if not pos:  # target cut off by truncation: fall back to the last real token
                pos = [int(enc["attention_mask"][i].sum()) - 2]
            tmask[i, pos] = True
        return enc, tmask

    def _fit(self, item: LexSubItem) -> tuple[tuple[str, ...], int]:
        """The item's words, cropped around the target when the sentence exceeds the model's length.

        Cropping (dropping words alternately from the longer side) keeps the target and
        the nearest context instead of truncating the target away.
        """
        tokens, index = tuple(item.tokens), item.index
        limit = self.max_length - 4  # room for special tokens and substitutes longer than the target
        while len(tokens) > 1 and len(self.tokenizer(" ".join(tokens), add_special_tokens=False)["input_ids"]) > limit:
            if index >= len(tokens) - 1 - index:
                tokens, index = tokens[1:], index - 1
            else:
                tokens = tokens[:-1]
        return tokens, index

    def _morphy(self, word: str, pos: str) -> list[str]:
        key = (word, pos)
        if key not in self._lemma_cache:
            self._lemma_cache[key] = self.wn.morphy(word, pos)
        return self._lemma_cache[key]

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
            lemma = shortest_base_form(lemmas, w)  # as WordNet.lemmatize: "eggs" -> "egg"
            if lemma in seen:
                continue
            seen.add(lemma)
            out.append((lemma.replace("_", " "), float(s)))
            if len(out) >= self.config.keep:
                break
        return out

    # ------------------------------------------------------------------ main
    def rank(self, items: Sequence[LexSubItem], show_progress: bool = False) -> dict[tuple[str, str], list[str]]:
        """Ranked, filtered substitutes (lemmas) per item key."""
        import torch
        from mirrorbert.reporting.progress import progress_bar

        from mirrorbert.encoder.masked_lm import mlm_forward, span_mean

        cfg = self.config
        out: dict[tuple[str, str], list[str]] = {}
        emb = self.model.get_input_embeddings().weight
        cand = self.cand_ids.to(self.device)
        bs = cfg.batch_size
        for b in progress_bar(range(0, len(items), bs), desc="lexsub", show=show_progress):
            chunk = items[b:b + bs]
            fitted = [self._fit(it) for it in chunk]
            enc, tmask = self._encode([" ".join(t) for t, _ in fitted],
                                      [_span(t, i) for t, i in fitted])
            ids = enc["input_ids"].to(self.device)
            att = enc["attention_mask"].to(self.device)
            tmask = tmask.to(self.device)
            with torch.no_grad():
                hidden, _ = mlm_forward(self.model, ids, att)
                h = span_mean(hidden, tmask)
                logits = self._head(h).float()[:, cand]
                scores = torch.log_softmax(logits, dim=-1)
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
        """Re-rank the top ``valid_top`` by how little the substitution changes the sentence.

        Validation score: mean cosine between the original and the substituted sentence's
        final hidden states over aligned positions (every context token, plus the target slot
        as the mean over its sub-tokens); final = validation + valid_weight * proposal score.
        """
        import torch
        import torch.nn.functional as F

        from mirrorbert.encoder.masked_lm import mlm_forward, span_mean

        cfg = self.config
        head, tail = kept[: cfg.valid_top], kept[cfg.valid_top:]
        n = int(att.sum())
        orig = hidden[:n]
        tm = tmask[:n]
        orig_ctx = orig[~tm]
        orig_tgt = orig[tm].mean(0)
        sentences, spans = [], []
        tokens, index = fitted
        start = _span(tokens, index)[0]
        for w, _ in head:
            toks = list(tokens)
            toks[index] = w
            sentences.append(" ".join(toks))
            spans.append((start, start + len(w)))
        new_scores = []
        for b in range(0, len(sentences), cfg.batch_size):
            enc, sm = self._encode(sentences[b:b + cfg.batch_size], spans[b:b + cfg.batch_size])
            sid, satt, sm = (x.to(self.device) for x in (enc["input_ids"], enc["attention_mask"], sm))
            with torch.no_grad():
                h2, _ = mlm_forward(self.model, sid, satt)
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


def _span(tokens: Sequence[str], index: int) -> tuple[int, int]:
    """Character span of ``tokens[index]`` in ``" ".join(tokens)``."""
    start = sum(len(t) + 1 for t in tokens[:index])
    return start, start + len(tokens[index])


def evaluate_lexsub(
    model_path: str,
    dataset: str,
    data_dir: str | os.PathLike | None = None,
    device: str | None = None,
    config: GenerationConfig | None = None,
    limit: int | None = None,
    output_dir: str | os.PathLike | None = None,
    show_progress: bool = False,
    trust_remote_code: bool = False,
) -> LexSubScores:
    """Load a masked LM, generate substitutes for a test set and score them (`trust_remote_code`: see
    `Encoder.load`)."""
    from mirrorbert.data.wordnet import WordNet
    from mirrorbert.runtime.device import resolve_device

    config = config or GenerationConfig()
    config.validate()
    items = load_lexsub(dataset, data_dir)
    wn = WordNet.load(data_dir)
    if limit:
        items = items[:limit]
    dev = resolve_device(device)
    from mirrorbert.safeguards.preflight import first_line, inspect_model, weights_load_error

    from mirrorbert.safeguards.model_loading import load_model, load_tokenizer

    # before the weights load (max_length: capped)
    inspect_model(str(model_path), need_mask=True, mask_option="--model", trust_remote_code=trust_remote_code)
    try:
        tok = load_tokenizer(model_path, trust_remote_code=trust_remote_code)
        model = load_model(model_path, "AutoModelForMaskedLM", trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  damaged weights raise safetensors' own error type
        error = weights_load_error(str(model_path), exc)
        if error is None and not isinstance(exc, (OSError, ValueError)):
            raise
        raise error or UserError(f"--model {model_path}: cannot load a masked LM ({first_line(exc)})") from None
    gen = LexSubGenerator(model, tok, wn, device=dev, config=config)
    ranked = gen.rank(items, show_progress=show_progress)
    gold = {it.key: dict(it.gold) for it in items if it.gold}
    best = {k: v[:1] for k, v in ranked.items()}
    oot = {k: v[:10] for k, v in ranked.items()}
    scores = score_lexsub(gold, best, oot, ranked)
    scores.extra.update({"dataset": resolve_dataset(dataset), "model": str(model_path),
                         "post": "+".join(gen.config.post) or "none"})
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        name = resolve_dataset(dataset)
        write_system_file(out / f"{name}.best", best)
        write_system_file(out / f"{name}.oot", oot, oot=True)
        (out / f"{name}.scores.json").write_text(jsonio.dumps(scores.as_dict(), indent=2) + "\n", encoding="utf-8")
    return scores
