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

logger = logging.getLogger(__name__)

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


def warn_if_span_never_applies(token_ids: Sequence[Sequence[int]], k: int, special: set[int]) -> bool:
    """Token unit: a span longer than every string's real tokens masks nothing. Say so once."""
    if k <= 0 or any(sum(1 for t in ids if t not in special) > k for ids in token_ids):
        return False
    logger.warning("--mask-span %d never applies: no training string has more than %d real tokens, so no "
                   "span is masked (use a smaller --mask-span, or 0)", k, k)
    return True


def mask_span(ids: Sequence[int], k: int, mask_id: int, special: set[int], generator: torch.Generator,
              starts: Sequence[int] | None = None) -> list[int]:
    """Replace k consecutive non-special tokens by the mask token; start uniform over valid starts.

    `starts`: `valid_span_starts(ids, k, special)` when the caller has it already (it does not depend on
    the draw, so `SecondViews` computes it once per run rather than once per epoch).
    """
    starts = valid_span_starts(ids, k, special) if starts is None else starts
    out = list(ids)
    if not starts:
        return out
    start = starts[int(torch.randint(len(starts), (1,), generator=generator))]
    out[start:start + k] = [mask_id] * k
    return out


def masked_views(token_ids: Sequence[Sequence[int]], k: int, mask_id: int | None, special: set[int],
                 generator: torch.Generator) -> list[list[int]]:
    """Second views for one epoch (a fresh draw each epoch from the given generator)."""
    if k <= 0:
        return [list(ids) for ids in token_ids]
    assert mask_id is not None
    return [mask_span(ids, k, mask_id, special, generator) for ids in token_ids]


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


def mask_chars(text: str, start: int, k: int, mask_token: str) -> str:
    """text[start:start+k] becomes one mask token, exactly there; nothing else changes (no added spaces)."""
    return text[:start] + mask_token + text[start + k:]


@dataclass
class MaskingStats:
    """What span masking did to the second views, summed over every epoch drawn."""

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
    """The second view x-bar of every string, drawn afresh each epoch by `draw(generator)`.

    unit "char" (the authors' procedure): a k-character span of the raw string becomes one mask token of
    the model's own tokenizer, then the masked strings are tokenised (fast tokenizer, whole list at once,
    same max_length). A masked string counts as many destroyed tokens as original tokens whose character
    span (offset mapping) overlaps the masked characters.
    unit "token" (our variant): k consecutive real tokens become k mask tokens (`masked_views`).
    """

    def __init__(self, tokenizer, strings: Sequence[str], token_ids: Sequence[Sequence[int]], unit: str, k: int,
                 min_chars: int, max_length: int):
        self.tokenizer, self.strings, self.token_ids = tokenizer, list(strings), token_ids
        self.unit, self.k, self.min_chars, self.max_length = unit, k, min_chars, max_length
        self.special = special_token_ids(tokenizer)
        self.mask_id = require_mask_token(tokenizer) if k > 0 else None
        self.stats = MaskingStats()
        self.real_tokens = sum(sum(1 for t in ids if t not in self.special) for ids in token_ids)
        self.token_offsets: list[list[tuple[int, int]]] = []
        if k > 0 and unit == "char":
            if not getattr(tokenizer, "is_fast", False):
                raise UserError("--mask-unit char needs a fast tokenizer (offsets of tokens); use --mask-unit token")
            encoded = tokenizer(self.strings, add_special_tokens=True, truncation=True, max_length=max_length,
                                return_offsets_mapping=True)
            self.token_offsets = [
                [tuple(span) for tok, span in zip(ids, spans) if tok not in self.special]
                for ids, spans in zip(encoded["input_ids"], encoded["offset_mapping"])
            ]
        elif k > 0:  # token mode: where a span may start (so which strings get masked) does not depend on the draw
            self.token_starts = [valid_span_starts(ids, k, self.special) for ids in token_ids]
            self.token_masked = sum(1 for starts in self.token_starts if starts)

    def warn_if_never_applies(self) -> bool:
        """A span that can apply to no string makes the run plain dropout: say so once, in the unit used."""
        if self.k <= 0:
            return False
        if self.unit == "token":
            return warn_if_span_never_applies(self.token_ids, self.k, self.special)
        if any(len(text) > max(self.min_chars, self.k) for text in self.strings):
            return False
        logger.warning("--mask-span %d (characters) never applies: no training string is longer than %d "
                       "characters (--mask-min-chars %d), so no span is masked", self.k,
                       max(self.min_chars, self.k), self.min_chars)
        return True

    def draw(self, generator: torch.Generator) -> list[list[int]]:
        if self.k <= 0:
            self.stats.add(len(self.token_ids), 0, self.real_tokens, 0)
            return [list(ids) for ids in self.token_ids]
        if self.unit == "token":
            self.stats.add(len(self.token_ids), self.token_masked, self.real_tokens, self.k * self.token_masked)
            return [mask_span(ids, self.k, self.mask_id, self.special, generator, starts)
                    for ids, starts in zip(self.token_ids, self.token_starts)]  # = masked_views(...)
        starts = char_span_starts(self.strings, self.k, self.min_chars, generator)
        masked_rows = [row for row, start in enumerate(starts) if start is not None]
        masked_texts = [mask_chars(self.strings[row], starts[row], self.k, self.tokenizer.mask_token)
                        for row in masked_rows]
        views = [list(ids) for ids in self.token_ids]
        if masked_texts:
            for row, ids in zip(masked_rows, tokenize_once(self.tokenizer, masked_texts, self.max_length)):
                views[row] = ids
        destroyed, hit_strings = 0, 0
        for row in masked_rows:
            lo, hi = starts[row], starts[row] + self.k
            hits = sum(1 for a, b in self.token_offsets[row] if a < hi and b > lo)
            destroyed += hits
            hit_strings += hits > 0  # a span beyond the truncated tokens leaves the view unmasked
        self.stats.add(len(self.token_ids), hit_strings, self.real_tokens, destroyed)
        return views
