"""(word, sentence, gloss) triplets for gloss-regularised pre-training: in ``sentence``, ``word`` at characters
``[start, end)`` means ``gloss``. Every loader finds the span (so the model can mask exactly the target's
sub-tokens) with morphy-style inflection: ``ran`` for *run*, ``looked after`` for *look_after*.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from mirrorbert.data.strings import check_utf8_file
from mirrorbert.data.wordnet import POS_FILES, WordNet, candidate_base_forms
from mirrorbert.errors import UserError
from mirrorbert.reporting.progress import progress_bar
from mirrorbert.safeguards.readback import open_text
from mirrorbert.safeguards.writes import atomic_output_file

logger = logging.getLogger(__name__)

# word tokens: letters/digits with inner hyphens, apostrophes and dots ("well-known", "o'clock", "U.S")
_TOKEN = re.compile(r"[^\W_]+(?:[-'’.][^\W_]+)*", re.UNICODE)
_POSSESSIVE = re.compile(r"['’]s$", re.IGNORECASE)


@dataclass(frozen=True)
class Triplet:
    """A target word, a sentence using it, the gloss of that use, and the target's span."""

    word: str
    sentence: str
    gloss: str
    start: int
    end: int
    sense: str = ""  # e.g. a WordNet synset id; empty for TSV triplets

    @property
    def surface(self) -> str:
        """The target as written in the sentence (possibly inflected)."""
        return self.sentence[self.start:self.end]


def tokenize_spans(text: str) -> list[tuple[str, int, int]]:
    """Word tokens of ``text`` with their character spans (possessive ``'s`` dropped)."""
    out = []
    for m in _TOKEN.finditer(text):
        tok, s, e = m.group(), m.start(), m.end()
        pm = _POSSESSIVE.search(tok)
        if pm and pm.start() > 0:
            tok, e = tok[: pm.start()], s + pm.start()
        out.append((tok, s, e))
    return out


def find_target_span(
    sentence: str,
    lemma: str,
    pos: str | Iterable[str] = tuple(POS_FILES),
    exceptions: dict[str, dict[str, tuple[str, ...]]] | None = None,
) -> tuple[int, int] | None:
    """Character span of the first occurrence of ``lemma`` (possibly inflected) in ``sentence``: a token sequence
    matches when each token, or the sequence joined with ``_``, has the lemma's part among its morphy base forms for
    one of the POS (one letter or several). Exact matches are preferred over inflected ones."""
    parts = [t for t, _, _ in tokenize_spans(lemma.replace("_", " ").lower())]
    if not parts:
        return None
    poses = [pos] if isinstance(pos, str) else list(pos)
    poses = ["a" if p == "s" else p for p in poses]
    exceptions = exceptions or {}
    whole = tokenize_spans(sentence)
    # Hyphenated compounds split into their parts: "flat-out" for flat_out, "crimson-robed" for robed.
    split = [
        (m.group(), s + m.start(), s + m.start() + len(m.group()))
        for tok, s, _ in whole
        for m in re.finditer(r"[^-]+", tok)
    ]
    n = len(parts)
    joined_lemma = "_".join(parts)

    def base_forms(word: str) -> set[str]:
        out: set[str] = set()
        for p in poses:
            out.update(candidate_base_forms(word, p, exceptions.get(p)))
        return out

    # Exact (case-insensitive) matches first, then inflected forms, then inside hyphenated words.
    for toks, exact in ((whole, True), (whole, False), (split, True), (split, False)):
        if toks is split and len(split) == len(whole):
            continue
        for i in range(len(toks) - n + 1):
            window = [t[0].lower() for t in toks[i:i + n]]
            if exact:
                ok = window == parts
            else:
                ok = joined_lemma in base_forms("_".join(window)) or all(
                    parts[k] in base_forms(window[k]) for k in range(n)
                )
            if ok:
                return toks[i][1], toks[i + n - 1][2]
    return None


def build_wordnet_triplets(wn: WordNet, show_progress: bool = False) -> list[Triplet]:
    """One triplet per (synset, lemma, example) where the example contains the lemma; the gloss is the synset's
    definition, the lemma written with spaces instead of WordNet's underscores."""
    out: list[Triplet] = []
    synsets = list(wn.all_synsets())
    for syn in progress_bar(synsets, desc="wordnet triplets", show=show_progress):
        if not syn.examples or not syn.definition:
            continue
        pos = syn.base_pos
        for example in syn.examples:
            for lemma in syn.lemmas:
                span = find_target_span(example, lemma, pos, wn.exceptions)
                if span is not None:
                    out.append(Triplet(lemma.replace("_", " "), example, syn.definition, span[0], span[1], syn.id))
    return out


def wordnet_gloss_inventory(wn: WordNet, words: Iterable[str]) -> dict[str, list[str]]:
    """All WordNet definitions of each word (any POS): the pool for hard negatives."""
    inv: dict[str, list[str]] = {}
    for w in set(words):
        glosses: list[str] = []
        for syn in wn.synsets_of(w):
            if syn.definition and syn.definition not in glosses:
                glosses.append(syn.definition)
        inv[w.lower()] = glosses
    return inv


def gloss_inventory(triplets: Iterable[Triplet]) -> dict[str, list[str]]:
    """The distinct glosses each word has among ``triplets`` (hard negatives for TSV data)."""
    inv: dict[str, list[str]] = defaultdict(list)
    for t in triplets:
        lst = inv[t.word.lower()]
        if t.gloss not in lst:
            lst.append(t.gloss)
    return dict(inv)


def triplet_stats(triplets: Sequence[Triplet]) -> dict[str, int]:
    """Counts reported to the user: distinct words, distinct glosses, triplets."""
    return {
        "words": len({t.word.lower() for t in triplets}),
        "glosses": len({t.gloss for t in triplets}),
        "triplets": len(triplets),
    }


def split_holdout(triplets: Sequence[Triplet], fraction: float = 0.05, seed: int = 0) -> tuple[list[Triplet], list[Triplet]]:
    """A seeded random split into (train, held-out); held-out gets ceil(fraction * n) triplets."""
    if not 0.0 <= fraction < 1.0:
        raise UserError(f"--holdout must be in [0, 1), got {fraction}")
    idx = list(range(len(triplets)))
    random.Random(seed).shuffle(idx)
    n_held = math.ceil(fraction * len(triplets)) if fraction > 0 else 0
    held = set(idx[:n_held])
    train = [t for i, t in enumerate(triplets) if i not in held]
    heldout = [t for i, t in enumerate(triplets) if i in held]
    return train, heldout


def load_triplets_tsv(path: str | os.PathLike, wn: WordNet | None = None) -> list[Triplet]:
    """Read ``word TAB sentence TAB gloss`` lines (blank lines and ``#`` comments skipped); the target's span is
    found by `find_target_span` (any POS; ``wn``'s exception lists help with irregular forms). A malformed line,
    or one whose word is not in its sentence, is a one-line `UserError` naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"triplet file not found: {p}")
    check_utf8_file(p, "--triplets")  # binary data: one line naming the file, not a UnicodeDecodeError
    exceptions = wn.exceptions if wn is not None else None
    out: list[Triplet] = []
    with open_text(p, "--triplets", newline="") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise UserError(
                    f"{p}:{lineno}: expected 3 TAB-separated fields (word, sentence, gloss), got {len(fields)}"
                )
            word, sentence, gloss = (f.strip() for f in fields)
            for name, value in (("word", word), ("sentence", sentence), ("gloss", gloss)):
                if not value:
                    raise UserError(f"{p}:{lineno}: empty {name} field")
            span = find_target_span(sentence, word, tuple(POS_FILES), exceptions)
            if span is None:
                raise UserError(f"{p}:{lineno}: word {word!r} does not occur in its sentence (inflections included)")
            out.append(Triplet(word, sentence, gloss, span[0], span[1]))
    if not out:
        raise UserError(f"{p}: no triplets found")
    return out


def write_triplets_tsv(triplets: Iterable[Triplet], path: str | os.PathLike) -> None:
    """Write triplets as ``word TAB sentence TAB gloss`` (the format load_triplets_tsv reads)."""
    def clean(x: str) -> str:
        return re.sub(r"[\t\r\n]+", " ", x)

    # gloss-pretrain applied the write policy to --export-triplets before any work
    with atomic_output_file(path, overwrite=True, option="--export-triplets") as tmp, \
            open(tmp, "w", encoding="utf-8", newline="") as fh:
        for t in triplets:
            fh.write(f"{clean(t.word)}\t{clean(t.sentence)}\t{clean(t.gloss)}\n")


def load_triplets(source: str, data_dir: str | os.PathLike | None = None, show_progress: bool = False
                  ) -> tuple[list[Triplet], dict[str, list[str]]]:
    """Triplets and the per-word gloss inventory for ``--triplets wordnet`` or a TSV path."""
    if source.lower() == "wordnet":
        wn = WordNet.load(data_dir)
        triplets = build_wordnet_triplets(wn, show_progress=show_progress)
        inventory = wordnet_gloss_inventory(wn, (t.word for t in triplets))
    else:
        wn = None
        try:  # WordNet's exception lists help to find irregular forms; optional for TSV input.
            wn = WordNet.load(data_dir)
        except UserError:
            logger.info("no WordNet under the data directory: irregular inflections in %s will not be matched", source)
        triplets = load_triplets_tsv(source, wn=wn)
        inventory = gloss_inventory(triplets)
    logger.info("triplets from %s: %s", source, triplet_stats(triplets))
    return triplets, inventory
