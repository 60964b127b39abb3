"""Lexical substitution metrics: the official SemEval-2007 scorer (McCarthy & Navigli 2007, ``score.pl``) and P@k.

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
