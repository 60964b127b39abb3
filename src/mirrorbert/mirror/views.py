"""The second view x-bar of each string: a random span masked (K characters replaced by one mask token, as the
authors ran the paper, or K tokens, our variant); the two views then differ by dropout too (the encoder's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from mirrorbert.errors import UserError
from mirrorbert.runtime.randomness import index_uniforms, uniform_choice

logger = logging.getLogger(__name__)

# Random streams derived from the seed, one per purpose, so that resuming can regenerate them.
STREAM_ORDER, STREAM_MASK = 1, 2


def tokenize_once(tokenizer, strings: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids with special tokens, truncated; done once per run, padding happens per batch."""
    encoded = tokenizer(list(strings), add_special_tokens=True, truncation=True, max_length=max_length)
    return [list(ids) for ids in encoded["input_ids"]]


def note_tokenless(strings, dropped: int, example: str | None, kept: int) -> None:
    """Strings that give no tokens but special ones (only control or zero-width characters) were left out of the
    store: a warning with their count (`strings.n_blank` grows by it); fewer than 2 strings left is an error."""
    if dropped:
        logger.warning("%s: %d string(s) give no tokens (only control or zero-width characters, e.g. %r) and are "
                       "skipped", strings.source, dropped, example)
        strings.n_blank += dropped
    if kept < 2:
        raise UserError(f"{strings.source}: needs at least 2 distinct strings that give tokens, found {kept}")


def special_token_ids(tokenizer) -> set[int]:
    return {int(i) for i in tokenizer.all_special_ids}


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


def mask_span(ids: Sequence[int], k: int, mask_id: int, special: set[int], draw: float) -> list[int]:
    """`ids` with k consecutive non-special tokens replaced by the mask token, the start picked by a uniform `draw`
    in [0, 1) among the valid starts; unchanged when there is none."""
    starts = valid_span_starts(ids, k, special)
    out = list(ids)
    if starts:
        start = starts[uniform_choice(draw, len(starts))]
        out[start:start + k] = [mask_id] * k
    return out


def char_starts_from_draws(texts: Sequence[str], k: int, min_chars: int, draws: Sequence[float]) -> list[int | None]:
    """Start of the masked k-character span of each string, from one uniform draw in [0, 1) per string; None where
    the string stays unmasked. A string longer than both min_chars and k starts its span at draw * (len - k + 1),
    rounded down (uniform over the starts)."""
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
    """The second views of a batch's strings, made when the batch is trained: `views_for(indices, seed, epoch)`.
    The span string i hides in epoch e depends only on (seed, e, i), not on its batch, the batch size or the
    processes; `stats` sums what masking did over every batch made."""

    def __init__(self, tokenizer, store, unit: str, k: int, min_chars: int, max_length: int):
        self.tokenizer, self.store = tokenizer, store  # store: data.token_store.TokenStore or ListStore
        self.unit, self.k, self.min_chars, self.max_length = unit, k, min_chars, max_length
        self.special = special_token_ids(tokenizer)
        if k > 0 and tokenizer.mask_token_id is None:
            raise UserError("--mask-span: this tokenizer has no mask token; use --mask-span 0")
        self.mask_id = int(tokenizer.mask_token_id) if k > 0 else None
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
            views = [mask_span(ids, self.k, self.mask_id, self.special, float(u)) for ids, u in zip(first, draws)]
            masked = sum(view != list(ids) for view, ids in zip(views, first))
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
