"""BERT-style masked-language-model corruption (Devlin et al. 2019).

Of the selectable tokens, `mlm_probability` (15%) are chosen as prediction targets; of those, 80% are
replaced by the mask token, 10% by a random ordinary token and 10% are left unchanged, so the model
cannot learn that "only [MASK] positions matter". Special and padding tokens are never chosen.

With whole-word masking the selection is made per word (all sub-tokens of a chosen word are targets
together), and the 80/10/10 decision is then taken per token, as in Google's original implementation.
The expected fraction of selected tokens stays `mlm_probability`, because every token is selected
exactly when its word is.

All randomness comes from an explicit `torch.Generator`, so a batch's corruption is reproducible
from (seed, epoch, batch index) and a resumed run sees exactly the same masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from mirrorbert.errors import UserError

IGNORE_INDEX = -100  # what torch's cross-entropy (and HF models) skip


@dataclass(frozen=True)
class MaskingConfig:
    mlm_probability: float = 0.15
    mask_fraction: float = 0.8  # of the selected tokens: replaced by the mask token
    random_fraction: float = 0.1  # of the selected tokens: replaced by a random ordinary token
    whole_word: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.mlm_probability < 1.0:
            raise UserError(f"--mlm-probability must be in (0, 1), got {self.mlm_probability}")
        if self.mask_fraction < 0 or self.random_fraction < 0 or self.mask_fraction + self.random_fraction > 1:
            raise UserError(
                "masking fractions must be >= 0 and sum to at most 1 "
                f"(mask {self.mask_fraction}, random {self.random_fraction})"
            )


class MlmMasker:
    """Corrupts batches of token ids for one tokenizer; holds the id tables so each call is vectorised."""

    def __init__(
        self,
        mask_token_id: int,
        special_ids: Sequence[int],
        vocab_size: int,
        config: MaskingConfig = MaskingConfig(),
        continuation: torch.Tensor | None = None,
    ):
        """`continuation[id]` is True for sub-word tokens that continue the previous word (whole-word masking)."""
        if mask_token_id is None:
            raise UserError("the tokenizer has no mask token; MLM pre-training needs one (e.g. [MASK] or <mask>)")
        self.mask_token_id = int(mask_token_id)
        self.config = config
        self.vocab_size = int(vocab_size)
        special = torch.zeros(self.vocab_size, dtype=torch.bool)
        ids = [i for i in special_ids if i is not None and 0 <= i < self.vocab_size]
        special[torch.tensor(ids, dtype=torch.long)] = True
        special[self.mask_token_id] = True
        self.special = special
        # Random replacements are drawn from ordinary tokens only: a random [CLS] or [PAD] mid-sentence
        # would teach nothing and could confuse position-sensitive heads.
        self.random_candidates = torch.nonzero(~special).flatten()
        if self.random_candidates.numel() == 0:
            raise UserError("the tokenizer vocabulary has no ordinary tokens to use as random replacements")
        if continuation is not None and continuation.numel() < self.vocab_size:
            raise ValueError("continuation table is smaller than the vocabulary")
        self.continuation = continuation

    @classmethod
    def from_tokenizer(cls, tokenizer, config: MaskingConfig = MaskingConfig(), vocab_size: int | None = None):
        """Build from a HF tokenizer; `vocab_size` may cap ids to the model's embedding size."""
        if getattr(tokenizer, "mask_token_id", None) is None:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise UserError(f"tokenizer {name} has no mask token; MLM pre-training needs one (e.g. [MASK] or <mask>)")
        size = len(tokenizer) if vocab_size is None else min(int(vocab_size), len(tokenizer))
        continuation = continuation_table(tokenizer, size) if config.whole_word else None
        return cls(tokenizer.mask_token_id, tokenizer.all_special_ids, size, config, continuation)

    # ------------------------------------------------------------------ selection
    def selectable(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """True where a token may become a target: inside the attention mask and not a special token."""
        ids = input_ids.clamp(0, self.vocab_size - 1)
        ok = ~self.special[ids] & (input_ids >= 0) & (input_ids < self.vocab_size)
        if attention_mask is not None:
            ok &= attention_mask.bool()
        return ok

    def word_ids(self, input_ids: torch.Tensor, selectable: torch.Tensor) -> torch.Tensor:
        """Per-row word index from the continuation table; -1 on non-selectable positions."""
        if self.continuation is None:
            raise ValueError("whole-word masking needs a continuation table")
        ids = input_ids.clamp(0, self.vocab_size - 1)
        cont = self.continuation[ids] & selectable
        # A continuation right after a special token (e.g. a sequence that starts mid-word after [CLS])
        # starts its own word: the previous word is not in this sequence.
        prev_selectable = torch.zeros_like(selectable)
        prev_selectable[:, 1:] = selectable[:, :-1]
        starts = selectable & (~cont | ~prev_selectable)
        words = torch.cumsum(starts.long(), dim=1) - 1
        return torch.where(selectable, words, torch.full_like(words, -1))

    def select(
        self,
        selectable: torch.Tensor,
        generator: torch.Generator,
        word_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Bernoulli(mlm_probability) per token, or per word when `word_ids` is given."""
        p = self.config.mlm_probability
        if word_ids is None:
            draws = torch.rand(selectable.shape, generator=generator)
            return (draws < p) & selectable
        n_words = int(word_ids.max().item()) + 1 if word_ids.numel() else 0
        if n_words <= 0:
            return torch.zeros_like(selectable)
        word_draws = torch.rand((selectable.shape[0], n_words), generator=generator) < p
        chosen = torch.gather(word_draws, 1, word_ids.clamp(min=0))
        return chosen & selectable & (word_ids >= 0)

    # ------------------------------------------------------------------ corruption
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        word_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return `(corrupted_ids, labels)`; labels hold the original id at targets and -100 elsewhere.

        `word_ids` (same shape, -1 = no word) overrides the continuation table, e.g. a fast
        tokenizer's `encoding.word_ids()`.
        """
        if input_ids.dim() != 2:
            raise ValueError("input_ids must be [batch, length]")
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        input_ids = input_ids.long()
        ok = self.selectable(input_ids, attention_mask)
        if word_ids is not None:
            word_ids = canonical_word_ids(word_ids, ok)
        elif self.config.whole_word:
            word_ids = self.word_ids(input_ids, ok)
        selected = self.select(ok, generator, word_ids)
        labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

        # One uniform draw per position decides mask / random / keep, so the split is exact in expectation.
        u = torch.rand(input_ids.shape, generator=generator)
        to_mask = selected & (u < self.config.mask_fraction)
        to_random = selected & (u >= self.config.mask_fraction) & (u < self.config.mask_fraction + self.config.random_fraction)
        picks = torch.randint(len(self.random_candidates), input_ids.shape, generator=generator)
        random_tokens = self.random_candidates[picks]
        corrupted = input_ids.clone()
        corrupted[to_mask] = self.mask_token_id
        corrupted[to_random] = random_tokens[to_random]
        return corrupted, labels


def continuation_table(tokenizer, vocab_size: int | None = None) -> torch.Tensor:
    """True for vocabulary entries that continue the previous word, from the tokenizer's conventions.

    WordPiece marks continuations with a `##` prefix; byte-level BPE (RoBERTa, GPT-2) and SentencePiece
    mark word *starts* with `Ġ` / `▁`, so there every other ordinary token is a continuation. With
    neither convention every token is its own word (whole-word masking degrades to token masking).
    Byte-level BPE punctuation without `Ġ` is attached to the preceding word: whole words here are
    whitespace-delimited units.
    """
    size = len(tokenizer) if vocab_size is None else int(vocab_size)
    vocab = tokenizer.get_vocab()
    tokens = [""] * size
    for tok, idx in vocab.items():
        if 0 <= idx < size:
            tokens[idx] = tok
    special = set(tokenizer.all_special_ids)
    ordinary = [t for i, t in enumerate(tokens) if t and i not in special]
    n = max(1, len(ordinary))
    hashes = sum(t.startswith("##") for t in ordinary) / n
    gdots = sum(t.startswith("\u0120") for t in ordinary) / n
    sp = sum(t.startswith("\u2581") for t in ordinary) / n
    table = torch.zeros(size, dtype=torch.bool)
    if hashes >= max(gdots, sp) and hashes > 0:
        for i, t in enumerate(tokens):
            table[i] = t.startswith("##") and i not in special
    elif gdots > 0 or sp > 0:
        marker = "\u0120" if gdots >= sp else "\u2581"
        for i, t in enumerate(tokens):
            table[i] = bool(t) and i not in special and not t.startswith(marker)
    return table


def canonical_word_ids(word_ids: torch.Tensor, selectable: torch.Tensor) -> torch.Tensor:
    """Renumber word ids 0, 1, 2... per row so that words of different sentences in a row never merge.

    Tokenizer word ids restart at 0 for the second segment of a pair; a new word starts wherever the id
    changes or the previous position is not selectable.
    """
    word_ids = word_ids.long()
    valid = selectable & (word_ids >= 0)
    prev = torch.full_like(word_ids, -1)
    prev[:, 1:] = word_ids[:, :-1]
    prev_valid = torch.zeros_like(valid)
    prev_valid[:, 1:] = valid[:, :-1]
    starts = valid & ((word_ids != prev) | ~prev_valid)
    words = torch.cumsum(starts.long(), dim=1) - 1
    return torch.where(valid, words, torch.full_like(words, -1))
