"""BERT-style masked-language-model corruption (Devlin et al. 2019).

Of the selectable tokens (never special or padding), `probability` (15%) become prediction targets; of those,
80% are replaced by the mask token, 10% by a random ordinary token and 10% are left unchanged. With whole-word
masking the selection is made per word and the 80/10/10 decision per token. All randomness comes from the
`torch.Generator` given, so a batch's corruption is a function of its seed.
"""

from __future__ import annotations

from typing import Sequence

import torch

from mirrorbert.errors import UserError

IGNORE_INDEX = -100  # what torch's cross-entropy (and HF models) skip
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the selected tokens: the mask token, a random ordinary token


class MlmMasker:
    """Corrupts batches of token ids for one tokenizer; holds the id tables so each call is vectorised."""

    def __init__(
        self,
        mask_token_id: int,
        special_ids: Sequence[int],
        vocab_size: int,
        *,
        probability: float = 0.15,
        continuation: torch.Tensor | None = None,
    ):
        """`continuation[id]` is True for sub-word tokens that continue the previous word (whole-word masking)."""
        self.mask_token_id = int(mask_token_id)
        self.probability = probability
        self.vocab_size = int(vocab_size)
        special = torch.zeros(self.vocab_size, dtype=torch.bool)
        ids = [i for i in special_ids if i is not None and 0 <= i < self.vocab_size]
        special[torch.tensor(ids, dtype=torch.long)] = True
        special[self.mask_token_id] = True
        self.special = special
        self.random_candidates = torch.nonzero(~special).flatten()  # random replacements are ordinary tokens
        if self.random_candidates.numel() == 0:
            raise UserError("the tokenizer vocabulary has no ordinary tokens to use as random replacements")
        self.continuation = continuation

    @classmethod
    def from_tokenizer(cls, tokenizer, *, probability: float = 0.15, whole_word: bool = False,
                       vocab_size: int | None = None) -> "MlmMasker":
        """Build from a HF tokenizer; `vocab_size` may cap ids to the model's embedding size."""
        if getattr(tokenizer, "mask_token_id", None) is None:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise UserError(f"tokenizer {name} has no mask token; MLM pre-training needs one (e.g. [MASK] or <mask>)")
        size = len(tokenizer) if vocab_size is None else min(int(vocab_size), len(tokenizer))
        continuation = continuation_table(tokenizer, size) if whole_word else None
        return cls(tokenizer.mask_token_id, tokenizer.all_special_ids, size, probability=probability,
                   continuation=continuation)

    def selectable(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """True where a token may become a target: inside the attention mask and not a special token."""
        ids = input_ids.clamp(0, self.vocab_size - 1)
        ok = ~self.special[ids] & (input_ids >= 0) & (input_ids < self.vocab_size)
        if attention_mask is not None:
            ok &= attention_mask.bool()
        return ok

    def word_ids(self, input_ids: torch.Tensor, selectable: torch.Tensor) -> torch.Tensor:
        """Per-row word index from the continuation table; -1 on non-selectable positions. A continuation right
        after a special token starts its own word (the previous word is not in this sequence)."""
        ids = input_ids.clamp(0, self.vocab_size - 1)
        cont = self.continuation[ids] & selectable
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
        """Bernoulli(probability) per token, or per word when `word_ids` is given."""
        if word_ids is None:
            return (torch.rand(selectable.shape, generator=generator) < self.probability) & selectable
        n_words = int(word_ids.max().item()) + 1 if word_ids.numel() else 0
        if n_words <= 0:
            return torch.zeros_like(selectable)
        word_draws = torch.rand((selectable.shape[0], n_words), generator=generator) < self.probability
        chosen = torch.gather(word_draws, 1, word_ids.clamp(min=0))
        return chosen & selectable & (word_ids >= 0)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(corrupted_ids, labels)` of a [batch, length] batch; labels hold the original id at targets and -100
        elsewhere."""
        if input_ids.dim() != 2:
            raise ValueError("input_ids must be [batch, length]")
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        input_ids = input_ids.long()
        ok = self.selectable(input_ids, attention_mask)
        selected = self.select(ok, generator, self.word_ids(input_ids, ok) if self.continuation is not None else None)
        labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        u = torch.rand(input_ids.shape, generator=generator)  # one draw per position: mask / random / keep
        to_mask = selected & (u < MASK_SHARE)
        to_random = selected & (u >= MASK_SHARE) & (u < MASK_SHARE + RANDOM_SHARE)
        picks = torch.randint(len(self.random_candidates), input_ids.shape, generator=generator)
        random_tokens = self.random_candidates[picks]
        corrupted = input_ids.clone()
        corrupted[to_mask] = self.mask_token_id
        corrupted[to_random] = random_tokens[to_random]
        return corrupted, labels


def continuation_table(tokenizer, vocab_size: int | None = None) -> torch.Tensor:
    """True for vocabulary entries that continue the previous word: WordPiece's `##` tokens, or, where tokens
    mark word starts (byte-level BPE's `Ġ`, SentencePiece's `▁`), every other ordinary token. With neither
    convention every token is its own word."""
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
