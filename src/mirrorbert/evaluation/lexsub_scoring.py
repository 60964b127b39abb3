"""Lexical substitution metrics, percentages as the official SemEval-2007 scorer (``score.pl``) prints them, and P@k.

* scored items: gold lines with at least two responses once the entries containing ``pn`` (proper nouns) are
  dropped; H_i = the item's total response count; P averages over the attempted items, R over all scored ones;
* **best**: the gold counts of the guesses summed / number of guesses / H_i; **best-mode**: over the items with a
  unique most frequent response, 1 when the *first* guess is that mode; **oot**: up to 10 guesses, their gold
  counts summed / H_i; **oot-mode**: 1 when the mode is among the guesses;
* answers and mode normalised as the scorer does (one apostrophe removed, hyphens as spaces, ``non-x``/``non x``
  -> ``nonx``) and lower-cased (docs/design.md); P@k: the share of the top-k in the gold set (any count) over the
  scored items, an item with fewer than k guesses still dividing by k.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence


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
    """The item as the scorer sees it (module docstring), or None when it is not scored."""
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
        return {**{k: v for k, v in self.__dict__.items() if k != "extra"}, **self.extra}


def _pct(num: float, den: float) -> float:
    return 100.0 * num / den if den else 0.0


def score_lexsub(
    gold: Mapping[tuple[str, str], Mapping[str, int]],
    best: Mapping[tuple[str, str], Sequence[str]],
    oot: Mapping[tuple[str, str], Sequence[str]] | None = None,
    ranked: Mapping[tuple[str, str], Sequence[str]] | None = None,
    oot_k: int = 10,
) -> LexSubScores:
    """Official best / best-mode / oot / oot-mode (P and R) and P@1, P@3 of each item's ``best`` guesses, ``oot``
    guesses (cut to ``oot_k``) and ``ranked`` list (for P@k); ``oot`` defaults to ``best``, ``ranked`` to ``oot``.
    An item absent from a mapping or without a guess is unanswered."""
    oot = best if oot is None else oot
    ranked = oot if ranked is None else ranked
    items = [(g, _answers(best, key), _answers(oot, key)[:oot_k], _answers(ranked, key))
             for key, raw in gold.items() if (g := prepare_gold(raw)) is not None]
    best_tried = [(g, guesses) for g, guesses, _, _ in items if guesses]
    oot_tried = [(g, guesses) for g, _, guesses, _ in items if guesses]
    best_sum = sum(sum(g.counts.get(x, 0) for x in guesses) / len(guesses) / g.total for g, guesses in best_tried)
    oot_sum = sum(sum(g.counts.get(x, 0) for x in guesses) / g.total for g, guesses in oot_tried)
    best_mode = [guesses[0] == g.mode for g, guesses in best_tried if g.mode is not None]
    oot_mode = [g.mode in guesses for g, guesses in oot_tried if g.mode is not None]
    n, n_mode = len(items), sum(g.mode is not None for g, *_ in items)
    p1 = sum(sum(x in g.counts for x in ranked_guesses[:1]) / 1.0 for g, _, _, ranked_guesses in items)
    p3 = sum(sum(x in g.counts for x in ranked_guesses[:3]) / 3.0 for g, _, _, ranked_guesses in items)
    return LexSubScores(
        best_p=_pct(best_sum, len(best_tried)), best_r=_pct(best_sum, n),
        best_mode_p=_pct(sum(best_mode), len(best_mode)), best_mode_r=_pct(sum(best_mode), n_mode),
        oot_p=_pct(oot_sum, len(oot_tried)), oot_r=_pct(oot_sum, n),
        oot_mode_p=_pct(sum(oot_mode), len(oot_mode)), oot_mode_r=_pct(sum(oot_mode), n_mode),
        p_at_1=_pct(p1, n), p_at_3=_pct(p3, n),
        n_items=n, n_attempted=len(best_tried), n_mode=n_mode,
    )


def _answers(answers: Mapping[tuple[str, str], Sequence[str]], key: tuple[str, str]) -> list[str]:
    """An item's answers, normalised as the scorer does (blank ones dropped)."""
    return [normalize_answer(x) for x in answers.get(key, ()) if x.strip()]
