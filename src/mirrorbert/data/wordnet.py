"""A reader of the WordNet 3.0 database files (``data.*``, ``index.*``, ``*.exc``; their formats: wndb(5WN)) and a
morphy-style lemmatiser: synsets, lemmas, glosses and examples for GR-BERT, POS checks and lemmatisation for
lexical substitution.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import open_text

logger = logging.getLogger(__name__)

#: WordNet POS letters and the file suffixes that hold them (adjective satellites, "s", are in the adjective files).
POS_FILES: dict[str, str] = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}

#: Morphy's detachment rules (suffix, replacement), from the morphy(7WN) manual.
DETACHMENT_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
          ("men", "man"), ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"),
          ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}

# Syntactic markers on adjective lemmas in data.adj: "galore(ip)", "ready_to_hand(p)".
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")
_QUOTED = re.compile(r'"([^"]*)"')
_QUOTED_ATTRIBUTED = re.compile(r'"[^"]*"(?:\s*-{1,2}\s*[^;"]*)?')


def normalize_pos(pos: str) -> str:
    """Map the POS spellings used by WordNet and the lexsub data sets to n/v/a/r."""
    p = pos.strip().lower()
    table = {"n": "n", "noun": "n", "v": "v", "verb": "v", "a": "a", "s": "a", "j": "a", "adj": "a",
             "adjective": "a", "r": "r", "adv": "r", "adverb": "r"}
    if p not in table:
        raise ValueError(f"unknown part of speech {pos!r} (expected one of n, v, a, s, r, j)")
    return table[p]


@dataclass(frozen=True)
class Synset:
    """One synset: its lemmas (WordNet spelling, ``_`` for spaces), definition and examples."""

    offset: int
    pos: str  # n, v, a, s or r, as in the data file
    lemmas: tuple[str, ...]
    definition: str
    examples: tuple[str, ...]

    @property
    def id(self) -> str:
        """A stable identifier, e.g. ``02084071-n``."""
        return f"{self.offset:08d}-{self.pos}"

    @property
    def base_pos(self) -> str:
        """POS with satellites folded into adjectives (what morphy and the index use)."""
        return "a" if self.pos == "s" else self.pos


def split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """(definition, examples) of a WordNet gloss: the examples are its double-quoted segments, the definition
    what remains, trimmed of the ``;`` separators."""
    examples = tuple(e.strip() for e in _QUOTED.findall(gloss) if e.strip())
    # An attribution like '"..." - Shakespeare' belongs to the example, not the definition.
    definition = _QUOTED_ATTRIBUTED.sub("", gloss)
    definition = re.sub(r"(\s*;\s*)+$", "", definition.strip())
    definition = re.sub(r"(\s*;\s*){2,}", "; ", definition).strip(" ;")
    return definition, examples


def _parse_data_line(line: str, path: Path, lineno: int) -> Synset:
    head, _, gloss = line.partition("|")
    fields = head.split()
    try:
        lemmas = tuple(_ADJ_MARKER.sub("", fields[4 + 2 * i]) for i in range(int(fields[3], 16)))
        offset, pos = int(fields[0]), fields[2]
    except (IndexError, ValueError) as exc:
        raise UserError(f"{path}:{lineno}: malformed WordNet data line ({exc})") from None
    return Synset(offset, pos, lemmas, *split_gloss(gloss.strip()))


def _content_lines(path: Path):
    """Yield (line number, line) for non-header lines of a WordNet database file."""
    with open_text(path, "WordNet file", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip() or line.startswith(" "):
                continue
            yield lineno, line.rstrip("\n")


class WordNet:
    """In-memory WordNet: synsets, lemma index and morphological exception lists."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.synsets: dict[tuple[str, int], Synset] = {}
        self.index: dict[str, dict[str, tuple[int, ...]]] = {p: {} for p in POS_FILES}
        self.exceptions: dict[str, dict[str, tuple[str, ...]]] = {p: {} for p in POS_FILES}
        for pos, name in POS_FILES.items():
            self._load(pos, name)
        logger.info("WordNet loaded from %s: %d synsets", self.root, len(self.synsets))

    @classmethod
    def load(cls, data_dir: str | os.PathLike | None = None) -> "WordNet":
        """Load from ``<data_dir>/wordnet`` or ``data_dir`` itself (default: $MIRRORBERT_DATA), holding every data
        and index file (a UserError names the one missing)."""
        data_dir = data_dir if data_dir is not None else os.environ.get("MIRRORBERT_DATA")
        if not data_dir:
            raise UserError("no data directory given: pass --data-dir or set MIRRORBERT_DATA")
        base = Path(data_dir)
        root = next((cand for cand in (base / "wordnet", base) if (cand / "data.noun").is_file()), None)
        if root is None:
            raise UserError(f"WordNet 3.0 not found: expected {base / 'wordnet' / 'data.noun'} "
                            "(the standard WordNet database files data.*, index.*, *.exc)")
        for name in POS_FILES.values():
            for prefix in ("data", "index"):
                f = root / f"{prefix}.{name}"
                if not f.is_file():
                    raise UserError(f"WordNet database incomplete: missing {f}")
        return cls(root)

    def _load(self, pos: str, name: str) -> None:
        data_path = self.root / f"data.{name}"
        for lineno, line in _content_lines(data_path):
            syn = _parse_data_line(line, data_path, lineno)
            self.synsets[(pos, syn.offset)] = syn  # keyed by the file's POS: satellites (s) found from "a"
        index_path = self.root / f"index.{name}"
        for lineno, line in _content_lines(index_path):
            fields = line.split()
            try:
                n_syn = int(fields[2])
                self.index[pos][fields[0].lower()] = tuple(int(x) for x in fields[len(fields) - n_syn:])
            except (IndexError, ValueError):
                raise UserError(f"{index_path}:{lineno}: malformed WordNet index line") from None
        exc_path = self.root / f"{name}.exc"
        if not exc_path.is_file():
            logger.warning("WordNet exception list %s missing; irregular forms will not be lemmatised", exc_path)
            return
        for _, line in _content_lines(exc_path):
            fields = line.split()
            if len(fields) >= 2:
                self.exceptions[pos][fields[0].lower()] = tuple(f.lower() for f in fields[1:])

    def all_synsets(self):
        """Iterate over every synset (satellites among the adjectives), in the data files' order."""
        yield from self.synsets.values()

    @staticmethod
    def _key(word: str) -> str:
        return word.strip().lower().replace(" ", "_")

    def synsets_of(self, word: str, pos: str | None = None) -> list[Synset]:
        """Synsets listing ``word`` as a lemma (base form, any case; spaces or ``_``)."""
        key = self._key(word)
        return [self.synsets[(p, off)] for p in ([normalize_pos(pos)] if pos else list(POS_FILES))
                for off in self.index[p].get(key, ()) if (p, off) in self.synsets]

    def morphy(self, word: str, pos: str) -> list[str]:
        """Base forms of ``word`` for ``pos`` that exist in WordNet, most likely first (morphy(7WN): the word
        itself, the exception list, then the detachment rules)."""
        p = normalize_pos(pos)
        return [cand for cand in candidate_base_forms(self._key(word), p, self.exceptions[p]) if cand in self.index[p]]


def shortest_base_form(forms: list[str], word: str) -> str:
    """Pick the lemma of a word among its morphy forms: the shortest ("eggs" -> "egg"), but
    never a one-letter form of a longer word ("as" is not "a"); ``word`` when there is none."""
    usable = [f for f in forms if len(f) > 1 or len(word) <= 1]
    return min(usable, key=len) if usable else word


def candidate_base_forms(word: str, pos: str, exceptions: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """All morphy base-form hypotheses for ``word`` (lower case), without an index check, each once."""
    p = normalize_pos(pos)
    w = word.lower()
    out = [w]
    if exceptions:
        out.extend(exceptions.get(w, ()))
    for suffix, repl in DETACHMENT_RULES[p]:
        if w.endswith(suffix) and len(w) > len(suffix):
            out.append(w[: len(w) - len(suffix)] + repl)
    # Multiword expressions: morphy the first word (verbs: "looked_after") or the last (nouns).
    if "_" in w:
        parts = w.split("_")
        for i in (0, len(parts) - 1):
            for base in candidate_base_forms(parts[i], p, exceptions)[1:]:
                out.append("_".join(parts[:i] + [base] + parts[i + 1:]))
    return list(dict.fromkeys(out))
