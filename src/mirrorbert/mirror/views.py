"""The two views (x, x-bar) of each string: tokenisation and random span masking.

Views differ through (a) a masked span in the second view (K characters replaced by one mask token, as the
authors ran the paper; or K tokens, our variant) and (b) dropout, which is set via
the model config for any HF encoder, optionally extended with per-example attention-head dropout
(drophead, `mirrorbert.encoder.dropout`). Controlled dropout (identical masks for both views) is handled by the trainer by replaying
the RNG state, which works for any architecture without touching its modules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from mirrorbert.errors import UserError
from mirrorbert.runtime.randomness import index_uniforms, uniform_choice

logger = logging.getLogger(__name__)

# Random streams derived from the seed, one per purpose, so that resuming can regenerate them.
STREAM_ORDER, STREAM_MASK = 1, 2

# ----------------------------------------------------------------------------- tokenisation
def tokenize_once(tokenizer, strings: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids with special tokens, truncated; done once per run, padding happens per batch."""
    encoded = tokenizer(list(strings), add_special_tokens=True, truncation=True, max_length=max_length)
    return [list(ids) for ids in encoded["input_ids"]]


def drop_tokenless(tokenizer, strings, token_ids: list[list[int]]) -> list[list[int]]:
    """Strings that tokenise to nothing but special tokens (only control characters, zero-width spaces, ...)
    are dropped like blank lines, with a count in a warning: trained on, they would be one and the same
    `[CLS] [SEP]` input under many labels. `strings.strings` is filtered in place; fewer than 2 left is an error."""
    special = special_token_ids(tokenizer)
    empty = [i for i, ids in enumerate(token_ids) if all(t in special for t in ids)]
    if not empty:
        return token_ids
    logger.warning("%s: %d string(s) give no tokens (only control or zero-width characters, e.g. %r) and are "
                   "skipped", strings.source, len(empty), strings.strings[empty[0]][:40])
    dropped = set(empty)
    strings.strings = [s for i, s in enumerate(strings.strings) if i not in dropped]
    strings.n_blank += len(empty)
    if len(strings.strings) < 2:
        raise UserError(f"{strings.source}: needs at least 2 distinct strings that give tokens, found "
                        f"{len(strings.strings)}")
    return [ids for i, ids in enumerate(token_ids) if i not in dropped]


def note_tokenless(strings, dropped: int, example: str | None, kept: int) -> None:
    """The store's side of `drop_tokenless`: the same warning and count for the strings its build dropped
    (`strings.n_blank` grows by them), and the same error when fewer than 2 strings are left."""
    if dropped:
        logger.warning("%s: %d string(s) give no tokens (only control or zero-width characters, e.g. %r) and are "
                       "skipped", strings.source, dropped, example)
        strings.n_blank += dropped
    if kept < 2:
        raise UserError(f"{strings.source}: needs at least 2 distinct strings that give tokens, found {kept}")


def special_token_ids(tokenizer) -> set[int]:
    return {int(i) for i in tokenizer.all_special_ids}


def require_mask_token(tokenizer) -> int:
    if tokenizer.mask_token_id is None:
        raise UserError("--mask-span: this tokenizer has no mask token; use --mask-span 0")
    return int(tokenizer.mask_token_id)


# ----------------------------------------------------------------------------- span masking
def valid_span_starts(ids: Sequence[int], k: int, special: set[int]) -> list[int]:
    """Starts s such that ids[s:s+k] holds no special token; none if the string has <= k real tokens."""
    n_real = sum(1 for t in ids if t not in special)
    if k <= 0 or n_real <= k:
        return []
    starts, run = [], 0
    for pos, tok in enumerate(ids):
        run = 0 if tok in special else run + 1
        if run >= k:
            starts.append(pos - k + 1)
    return starts


def mask_span(ids: Sequence[int], k: int, mask_id: int, special: set[int], generator: torch.Generator,
              starts: Sequence[int] | None = None) -> list[int]:
    """Replace k consecutive non-special tokens by the mask token; start uniform over valid starts.

    `starts`: `valid_span_starts(ids, k, special)` when the caller has it already (it does not depend on
    the draw). `SecondViews` draws per string from (seed, epoch, index) instead of a generator.
    """
    starts = valid_span_starts(ids, k, special) if starts is None else starts
    out = list(ids)
    if not starts:
        return out
    start = starts[int(torch.randint(len(starts), (1,), generator=generator))]
    out[start:start + k] = [mask_id] * k
    return out


# ----------------------------------------------------------------------------- character span masking
def char_span_starts(strings: Sequence[str], k: int, min_chars: int, generator: torch.Generator) -> list[int | None]:
    """Start of the masked k-character span of each string; None where the string stays unmasked.

    A string is masked when it is longer than both min_chars and k; the start is uniform over all
    len - k + 1 valid starts (one draw per masked string, in order, so a seeded generator replays it).
    """
    if k <= 0:
        return [None] * len(strings)
    starts: list[int | None] = []
    for text in strings:
        if len(text) <= max(min_chars, k):
            starts.append(None)
        else:
            starts.append(int(torch.randint(len(text) - k + 1, (1,), generator=generator)))
    return starts


def char_starts_from_draws(texts: Sequence[str], k: int, min_chars: int, draws: Sequence[float]) -> list[int | None]:
    """`char_span_starts` with one given uniform draw per string (`index_uniforms`) instead of a generator:
    a string longer than both min_chars and k starts its span at draw * (len - k + 1), rounded down."""
    return [uniform_choice(float(u), len(text) - k + 1) if k > 0 and len(text) > max(min_chars, k) else None
            for text, u in zip(texts, draws)]


def mask_chars(text: str, start: int, k: int, mask_token: str) -> str:
    """text[start:start+k] becomes one mask token, exactly there; nothing else changes (no added spaces)."""
    return text[:start] + mask_token + text[start + k:]


@dataclass
class MaskingStats:
    """What span masking did to the second views, summed over every batch they were made for."""

    strings: int = 0
    masked_strings: int = 0
    real_tokens: int = 0
    masked_tokens: int = 0

    def add(self, strings: int, masked_strings: int, real_tokens: int, masked_tokens: int) -> None:
        self.strings += strings
        self.masked_strings += masked_strings
        self.real_tokens += real_tokens
        self.masked_tokens += masked_tokens

    def shares(self) -> dict[str, float]:
        """masked_token_share: real tokens of the original strings destroyed by masking / all real tokens;
        masked_string_share: strings whose second view was masked / all strings."""
        return {
            "masked_token_share": round(self.masked_tokens / max(1, self.real_tokens), 6),
            "masked_string_share": round(self.masked_strings / max(1, self.strings), 6),
        }


class SecondViews:
    """The second view x-bar of a batch's strings, made when the batch is trained: `views_for(indices, seed, epoch)`.

    Which span string i hides in epoch e depends only on (seed, epoch, i): one uniform draw per string from
    `index_uniforms(seed, (STREAM_MASK, epoch), [i])`, where i is the string's row in the training data (the
    deduplicated strings, strings without tokens dropped: the rows the epoch's order permutes). Not on the batch
    it falls in, its place there, the batch size or the number of processes; so no epoch is drawn up front, and a
    resumed run makes the views the uninterrupted one made.

    unit "char" (the authors' procedure): a string longer than both min_chars and k has a k-character span,
    its start uniform over the len - k + 1 starts, replaced by one mask token of the model's own tokenizer; the
    batch's masked strings are tokenised again (fast tokenizer, same max_length). A masked string counts as
    many destroyed tokens as original tokens whose character span (offset mapping, computed for the batch's
    masked strings only) overlaps the masked characters.
    unit "token" (our variant): k consecutive real tokens become k mask tokens, the start uniform over the
    valid starts (`valid_span_starts`); a string with k or fewer real tokens stays unmasked.
    `stats` sums what masking did over every batch made.
    """

    def __init__(self, tokenizer, store, unit: str, k: int, min_chars: int, max_length: int):
        self.tokenizer, self.store = tokenizer, store  # store: data.token_store.TokenStore or ListStore
        self.unit, self.k, self.min_chars, self.max_length = unit, k, min_chars, max_length
        self.special = special_token_ids(tokenizer)
        self.mask_id = require_mask_token(tokenizer) if k > 0 else None
        self.stats = MaskingStats()
        if k > 0 and unit == "char" and not getattr(tokenizer, "is_fast", False):
            raise UserError("--mask-unit char needs a fast tokenizer (offsets of tokens); use --mask-unit token")

    @classmethod
    def from_lists(cls, tokenizer, strings: Sequence[str], token_ids: Sequence[Sequence[int]], unit: str, k: int,
                   min_chars: int, max_length: int) -> "SecondViews":
        """Second views over strings and their ids held in lists (small data, tests, Python callers)."""
        from mirrorbert.data.token_store import ListStore

        return cls(tokenizer, ListStore(strings, token_ids, special_token_ids(tokenizer)), unit, k, min_chars,
                   max_length)

    def warn_if_never_applies(self) -> bool:
        """A span that can apply to no string makes the run plain dropout: say so once, in the unit used."""
        if self.k <= 0:
            return False
        if self.unit == "token":
            if self.store.max_real_tokens > self.k:
                return False
            logger.warning("--mask-span %d never applies: no training string has more than %d real tokens, so no "
                           "span is masked (use a smaller --mask-span, or 0)", self.k, self.k)
            return True
        if self.store.max_chars > max(self.min_chars, self.k):
            return False
        logger.warning("--mask-span %d (characters) never applies: no training string is longer than %d "
                       "characters (--mask-min-chars %d), so no span is masked", self.k,
                       max(self.min_chars, self.k), self.min_chars)
        return True

    def views_for(self, indices: Sequence[int], seed: int, epoch: int,
                  first: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
        """The second views of strings `indices` in `epoch` (`first`: their token ids, when read already),
        counted in `stats`."""
        views, counts = self.make_views(indices, seed, epoch, first)
        self.stats.add(*counts)
        return views

    def make_views(self, indices: Sequence[int], seed: int, epoch: int,
                   first: Sequence[Sequence[int]] | None = None) -> tuple[list[list[int]], tuple[int, int, int, int]]:
        """`views_for` without counting: (views, the four `MaskingStats.add` counts). Safe in a prefetch thread
        that has its own tokenizer (`for_thread`): it changes nothing shared."""
        first = self.store.token_ids(indices) if first is None else first
        real = sum(sum(1 for t in ids if t not in self.special) for ids in first)
        if self.k <= 0:
            return [list(ids) for ids in first], (len(first), 0, real, 0)
        draws = index_uniforms(seed, (STREAM_MASK, epoch), indices)
        if self.unit == "token":
            views, masked = self._token_views(first, draws)
            return views, (len(first), masked, real, self.k * masked)
        views, hit_strings, destroyed = self._char_views(indices, first, draws)
        return views, (len(first), hit_strings, real, destroyed)

    def for_thread(self) -> "SecondViews":
        """A copy for a prefetch thread: its own tokenizer (a fast tokenizer's settings are mutable state that
        two threads must not share), the same store, unit, span and counts."""
        import copy

        twin = copy.copy(self)
        if self.k > 0 and self.unit == "char":  # the only views that tokenise
            twin.tokenizer = copy.deepcopy(self.tokenizer)
        return twin

    def _token_views(self, first: Sequence[Sequence[int]], draws) -> tuple[list[list[int]], int]:
        views, masked = [], 0
        for ids, u in zip(first, draws):
            view, starts = list(ids), valid_span_starts(ids, self.k, self.special)
            if starts:
                start = starts[uniform_choice(float(u), len(starts))]
                view[start:start + self.k] = [self.mask_id] * self.k
                masked += 1
            views.append(view)
        return views, masked

    def _char_views(self, indices: Sequence[int], first: Sequence[Sequence[int]], draws):
        """Mask characters, tokenise the masked strings again; count the original tokens the spans overlap."""
        texts = self.store.texts(indices)
        views = [list(ids) for ids in first]
        all_starts = char_starts_from_draws(texts, self.k, self.min_chars, draws)
        rows = [r for r, start in enumerate(all_starts) if start is not None]
        if not rows:
            return views, 0, 0
        starts = [all_starts[r] for r in rows]
        masked = [mask_chars(texts[r], start, self.k, self.tokenizer.mask_token) for r, start in zip(rows, starts)]
        for r, ids in zip(rows, tokenize_once(self.tokenizer, masked, self.max_length)):
            views[r] = ids
        originals = self.tokenizer([texts[r] for r in rows], add_special_tokens=True, truncation=True,
                                   max_length=self.max_length, return_offsets_mapping=True)
        destroyed, hit_strings = 0, 0
        for start, ids, spans in zip(starts, originals["input_ids"], originals["offset_mapping"]):
            hits = sum(1 for tok, (a, b) in zip(ids, spans)
                       if tok not in self.special and a < start + self.k and b > start)
            destroyed += hits
            hit_strings += hits > 0  # a span beyond the truncated tokens leaves the view unmasked
        return views, hit_strings, destroyed
