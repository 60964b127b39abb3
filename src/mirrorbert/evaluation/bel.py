"""Biomedical entity linking (BEL): acc@1 / acc@5 of nearest-name retrieval, as in SapBERT/BioSyn.

Every dictionary name and query mention is encoded alone; a query part is linked to the dictionary names nearest
by cosine (exact search: :mod:`mirrorbert.search.exact`). A part is correct at k when a CUI of one of its top-k
names is among its gold CUIs, a query when every part is; accuracy is over all queries of the test file,
duplicates included.
NCBI-disease is read in BioSyn's preprocessed layout, BC5CDR-disease rebuilt from the raw corpus (docs/design.md).
"""

from __future__ import annotations

import logging
import os
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mirrorbert.jsonio as jsonio
from mirrorbert.data.strings import read_text_lines
from mirrorbert.errors import UserError
from mirrorbert.evaluation import datasets as ds
from mirrorbert.evaluation.sts import TaskMetrics, TextEncoder
from mirrorbert.search.exact import DEFAULT_CHUNK_SIZE, cosine_topk

logger = logging.getLogger(__name__)

BEL_DATASETS: tuple[str, ...] = ("ncbi", "bc5cdr")


@dataclass
class BelSettings:
    """The task's options, each an `--option bel.KEY=VALUE`: ``datasets`` (default: every BEL set present, a missing
    one skipped with a warning; a set named is required), ``predictions_path`` (one JSON line per query, every set in
    one file, a ``dataset`` field naming it), ``ks`` (acc@1 always), and the exact search's ``chunk_size`` and
    ``use_faiss`` (None: faiss when importable)."""

    datasets: Sequence[str] | str | None = None
    predictions_path: str | os.PathLike[str] | None = None
    ks: Sequence[int] = (1, 5)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    use_faiss: bool | None = None


SETTINGS = BelSettings


@dataclass(frozen=True)
class QueryPart:
    """One mention text and the CUIs that count as a correct link for it."""

    mention: str
    gold: frozenset[str]


@dataclass(frozen=True)
class Query:
    """A test mention; correct only when every part is linked correctly."""

    text: str
    gold: str
    parts: tuple[QueryPart, ...]


@dataclass
class Dictionary:
    """Unique names, each with the CUIs it denotes (a name may denote several concepts)."""

    names: list[str]
    cuis: list[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.names)


def _dictionary(entries: Iterable[tuple[str, Iterable[str]]]) -> Dictionary:
    """The Dictionary of (name, CUIs) entries, a repeated name merging its CUIs (BioSyn's preprocessing)."""
    merged: dict[str, list[str]] = {}
    for name, cuis in entries:
        cuis = list(dict.fromkeys(c for c in cuis if c))
        if name.strip() and cuis:
            known = merged.setdefault(name.strip(), [])
            known += [c for c in cuis if c not in known]
    return Dictionary(list(merged), [tuple(c) for c in merged.values()])


_PUNCT_RE = re.compile(r"[\s{}]+".format(re.escape(string.punctuation)))


def normalize_text(text: str) -> str:
    """BioSyn's name preprocessing: lowercase, every run of punctuation/whitespace becomes one space."""
    return " ".join(_PUNCT_RE.split(text.lower())).strip()


def _split_ids(field: str) -> list[str]:
    return [c.strip() for c in field.split("|") if c.strip()]


def load_dictionary(path: str | os.PathLike[str]) -> Dictionary:
    """Dictionary file ``CUI[|CUI...]||name`` (one name per line); repeated names merge their CUIs."""
    path = Path(path)
    entries = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        line = line.strip()
        if not line:
            continue
        fields = line.split("||")
        if len(fields) != 2:
            raise UserError(f"{path}:{lineno}: expected 'CUI[|CUI...]||name', got {line[:80]!r}")
        entries.append((fields[1], _split_ids(fields[0].replace("+", "|"))))
    dictionary = _dictionary(entries)
    if not len(dictionary):
        raise UserError(f"{path}: empty dictionary")
    return dictionary


def make_query(mention: str, gold: str) -> Query:
    """The parts of a ``mention||gold`` line. In ``gold`` ``|`` separates alternative CUIs and ``+`` the parts of a
    composite mention; ``mention`` may hold parts separated by ``|`` or ``+``. As many mention parts as gold parts:
    aligned; one gold part: every mention part must hit it; one mention, several gold parts: its top-k must cover
    each; any other mismatch: every mention part must hit the union of the gold CUIs."""
    mentions = [m.strip() for m in re.split(r"[|+]", mention) if m.strip()]
    gold_parts = [frozenset(_split_ids(p)) for p in gold.split("+")]
    gold_parts = [p for p in gold_parts if p]
    if not mentions or not gold_parts:
        raise ValueError("empty mention or gold")
    if len(mentions) == len(gold_parts):
        parts = [QueryPart(m, g) for m, g in zip(mentions, gold_parts)]
    elif len(gold_parts) == 1:
        parts = [QueryPart(m, gold_parts[0]) for m in mentions]
    elif len(mentions) == 1:
        parts = [QueryPart(mentions[0], g) for g in gold_parts]
    else:
        union = frozenset().union(*gold_parts)
        parts = [QueryPart(m, union) for m in mentions]
    return Query(text=mention.strip(), gold=gold.strip(), parts=tuple(parts))


def load_queries(path: str | os.PathLike[str]) -> list[Query]:
    """Query file ``mention||gold[||...]`` (BioSyn/kNN-BioEL layout; extra fields are ignored)."""
    path = Path(path)
    queries: list[Query] = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        if not line.strip():
            continue
        fields = line.split("||")
        if len(fields) < 2:
            raise UserError(f"{path}:{lineno}: expected 'mention||CUI[...]', got {line[:80]!r}")
        try:
            queries.append(make_query(fields[0], fields[1]))
        except ValueError:
            raise UserError(f"{path}:{lineno}: empty mention or CUI field") from None
    if not queries:
        raise UserError(f"{path}: no queries")
    return queries


def load_medic(path: str | os.PathLike[str]) -> list[tuple[list[str], list[str]]]:
    """MEDIC concepts as ``(ids, names)`` from the CTD TSV (DiseaseName, DiseaseID, AltDiseaseIDs, ..., Synonyms
    in column 8; ``#`` lines are comments) or BioSyn's ``IDs||name|synonym|...``; ids lose their ``MESH:``/``OMIM:``
    prefixes (others, e.g. ``DO:``, are kept and never match)."""
    path = Path(path)
    concepts: list[tuple[list[str], list[str]]] = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if "\t" in line:
            cols = line.split("\t")
            if len(cols) < 2:
                raise UserError(f"{path}:{lineno}: expected CTD MEDIC TSV columns, got {line[:80]!r}")
            ids = [cols[1]] + (_split_ids(cols[2]) if len(cols) > 2 else [])
            names = [cols[0]] + (cols[7].split("|") if len(cols) > 7 and cols[7] else [])
        else:
            fields = line.split("||")
            if len(fields) != 2:
                raise UserError(f"{path}:{lineno}: expected 'IDs||name|synonym...' or CTD TSV, got {line[:80]!r}")
            ids, names = _split_ids(fields[0]), fields[1].split("|")
        ids = [re.sub(r"^(MESH|OMIM):", "", i.strip()) for i in ids if i.strip()]
        names = [n for n in names if n.strip()]
        if ids and names:
            concepts.append((ids, names))
    if not concepts:
        raise UserError(f"{path}: no MEDIC concepts")
    return concepts


@dataclass(frozen=True)
class PubTatorMention:
    pmid: str
    start: int
    end: int
    text: str
    type: str
    ids: tuple[str, ...]
    individual: tuple[str, ...]  # the parts of a composite mention (7th column), else ()

    @property
    def aligned(self) -> bool:
        """A composite mention whose individual mentions align one to one with its ids."""
        return bool(self.individual) and len(self.individual) == len(self.ids) > 1


@dataclass
class PubTatorDocument:
    pmid: str
    title: str
    abstract: str
    mentions: list[PubTatorMention]


def read_pubtator(path: str | os.PathLike[str]) -> list[PubTatorDocument]:
    """Documents of a PubTator file: ``pmid|t|title``, ``pmid|a|abstract``, TAB annotation lines of 6 fields (pmid,
    start, end, text, type, ids) or 7 (plus a composite's ``|``-separated parts); 4-field relation lines ignored."""
    path = Path(path)
    docs: list[PubTatorDocument] = []
    current: PubTatorDocument | None = None
    for lineno, line in enumerate(read_text_lines(path), 1):
        if not line.strip():
            current = None
            continue
        if "\t" not in line:
            m = re.match(r"^([^|]+)\|([ta])\|(.*)$", line)
            if not m:
                raise UserError(f"{path}:{lineno}: not a PubTator title/abstract line: {line[:80]!r}")
            pmid, kind, text = m.groups()
            if current is None or current.pmid != pmid:
                current = PubTatorDocument(pmid, "", "", [])
                docs.append(current)
            setattr(current, "title" if kind == "t" else "abstract", text)
            continue
        cols = line.split("\t")
        if len(cols) == 4:
            continue
        if len(cols) not in (6, 7) or current is None or cols[0] != current.pmid:
            raise UserError(f"{path}:{lineno}: not a PubTator annotation line of the current document: {line[:60]!r}")
        try:
            start, end = int(cols[1]), int(cols[2])
        except ValueError:
            raise UserError(f"{path}:{lineno}: bad offsets in {line[:80]!r}") from None
        individual = tuple(cols[6].split("|")) if len(cols) == 7 and cols[6].strip() else ()
        current.mentions.append(
            PubTatorMention(cols[0], start, end, cols[3], cols[4], tuple(_split_ids(cols[5])), individual)
        )
    return docs


def _best_long_form(short: str, candidate: str) -> str | None:
    """Schwartz & Hearst (2003): shortest suffix of ``candidate`` whose characters spell ``short`` (matched right
    to left; the first one must start a word)."""
    s, i = len(short) - 1, len(candidate) - 1
    while s >= 0:
        c = short[s].lower()
        if not c.isalnum():
            s -= 1
            continue
        while i >= 0 and (
            candidate[i].lower() != c or (s == 0 and i > 0 and candidate[i - 1].isalnum())
        ):
            i -= 1
        if i < 0:
            return None
        i -= 1
        s -= 1
    start = candidate.rfind(" ", 0, i + 1) + 1
    return candidate[start:]


def find_abbreviations(text: str) -> dict[str, str]:
    """Abbreviation -> long form definitions ``long form (SF)`` in ``text`` (Schwartz & Hearst 2003)."""
    found: dict[str, str] = {}
    for m in re.finditer(r"\(([^()]{1,20})\)", text):
        inner = re.split(r"[;,]", m.group(1))[0].strip()
        words = inner.split()
        if not words or len(words) > 2 or not 2 <= len(inner) <= 10:
            continue
        if not inner[0].isalnum() or not any(ch.isalpha() for ch in inner):
            continue
        before = re.split(r"(?<=[.!?])\s+", text[: m.start()].rstrip())[-1]
        max_words = min(len(inner) + 5, 2 * len(inner))
        window = " ".join(before.split()[-max_words:])
        long_form = _best_long_form(inner, window)
        if not long_form or len(long_form) <= len(inner) or inner.lower() in long_form.lower().split():
            continue
        found.setdefault(inner, long_form)
    return found


def expand_abbreviations(mention: str, abbreviations: dict[str, str], max_rounds: int = 5) -> str:
    """Replace whole tokens that are known abbreviations by their long forms (as BioSyn does)."""
    for _ in range(max_rounds):
        tokens = re.split(r"(\s+|/)", mention)
        new = "".join(abbreviations.get(t, t) for t in tokens)
        if new == mention:
            break
        mention = new
    return mention


def _mention_parts(m: PubTatorMention, abbreviations: dict[str, str]) -> list[tuple[str, list[str]]] | None:
    """(normalised text, CUIs) parts of a PubTator mention; None when no usable id remains."""

    def clean(text: str) -> str:
        return normalize_text(expand_abbreviations(text, abbreviations))

    if m.aligned:
        parts = [(clean(t), [i]) for t, i in zip(m.individual, m.ids) if i != "-1" and clean(t)]
    else:
        ids = [i for i in m.ids if i != "-1"]
        parts = [(clean(m.text), [i]) for i in ids] if clean(m.text) else []
    return parts or None


def load_bc5cdr(folder: str | os.PathLike[str], entity_type: str = "Disease") -> tuple[Dictionary, list[Query]]:
    """BC5CDR-disease dictionary and test queries, rebuilt from the raw corpus as BioSyn does (docs/design.md):
    the queries are the test set's mentions of ``entity_type`` that have a concept id, duplicates kept; the
    dictionary is MEDIC plus the training and development mentions, each text with the abbreviations of its
    abstract expanded and normalised as BioSyn does."""
    folder = Path(folder)
    entries = [(normalize_text(name), ids) for ids, names in load_medic(folder / "medic_06Jul2012.txt")
               for name in names]

    def mentions_of(path: Path) -> Iterable[tuple[PubTatorMention, list[tuple[str, list[str]]] | None]]:
        for doc in read_pubtator(path):
            abbreviations = find_abbreviations(f"{doc.title} {doc.abstract}")
            for m in doc.mentions:
                if m.type == entity_type:
                    yield m, _mention_parts(m, abbreviations)

    for split in ("CDR_TrainingSet.PubTator.txt", "CDR_DevelopmentSet.PubTator.txt"):
        for m, parts in mentions_of(folder / split):
            if parts and m.aligned:
                entries += parts
            elif parts:  # one name for the whole (possibly composite) mention, carrying all its ids
                entries.append((parts[0][0], [c for _, cuis in parts for c in cuis]))
    test = list(mentions_of(folder / "CDR_TestSet.PubTator.txt"))
    queries = [Query(text=m.text, gold="|".join(m.ids), parts=tuple(QueryPart(t, frozenset(c)) for t, c in parts))
               for m, parts in test if parts]
    logger.info("bc5cdr: %d %s queries (%d without a concept id dropped)", len(queries), entity_type,
                len(test) - len(queries))
    return _dictionary(entries), queries


def load_ncbi(folder: str | os.PathLike[str]) -> tuple[Dictionary, list[Query]]:
    """NCBI-disease test dictionary and queries in BioSyn's preprocessed layout."""
    return load_dictionary(Path(folder) / "test_dictionary.txt"), load_queries(Path(folder) / "test_queries.txt")


_LOADERS = {"ncbi": load_ncbi, "bc5cdr": load_bc5cdr}


@dataclass
class LinkResult:
    """Per-query correctness at each k and the candidates of every part (for predictions files)."""

    accuracy: dict[int, float]
    correct: dict[int, list[bool]]
    candidates: list[list[tuple[np.ndarray, np.ndarray]]]  # per query, per part: (dict ids, scores)


def link(encoder: TextEncoder, dictionary: Dictionary, queries: Sequence[Query], settings: BelSettings | None = None,
         *, batch_size: int = 256, show_progress: bool = True) -> LinkResult:
    """Link every query part to its nearest dictionary names and score acc@k for 1 and each k of ``settings.ks``."""
    settings = settings or BelSettings()
    if not queries:
        raise UserError("no queries to link")
    ks = sorted({1, *(int(k) for k in settings.ks)})
    if ks[0] < 1:
        raise UserError(f"acc@k needs k >= 1, got {ks}")
    logger.info("encoding %d dictionary names", len(dictionary))
    dictionary_embeddings = encoder.encode(dictionary.names, batch_size=batch_size, normalize=True,
                                           show_progress=show_progress)
    mention_texts = list(dict.fromkeys(p.mention for q in queries for p in q.parts))
    mention_row = {t: i for i, t in enumerate(mention_texts)}
    logger.info("encoding %d distinct mentions of %d queries", len(mention_texts), len(queries))
    mention_embeddings = encoder.encode(mention_texts, batch_size=batch_size, normalize=True, show_progress=False)
    scores, ids = cosine_topk(mention_embeddings, dictionary_embeddings, max(ks), chunk_size=settings.chunk_size,
                              use_faiss=settings.use_faiss)
    cui_sets = [frozenset(c) for c in dictionary.cuis]
    correct: dict[int, list[bool]] = {k: [] for k in ks}
    candidates: list[list[tuple[np.ndarray, np.ndarray]]] = []
    for q in queries:
        rows = [mention_row[p.mention] for p in q.parts]
        candidates.append([(ids[r], scores[r]) for r in rows])
        for k in ks:
            correct[k].append(all(any(cui_sets[j] & p.gold for j in ids[r, :k]) for p, r in zip(q.parts, rows)))
    accuracy = {k: float(np.mean(correct[k])) for k in ks}
    return LinkResult(accuracy=accuracy, correct=correct, candidates=candidates)


def _prediction_records(name: str, dictionary: Dictionary, queries: Sequence[Query],
                        result: LinkResult) -> Iterable[dict[str, Any]]:
    """One record per query: its parts' gold CUIs and candidates, and whether it is correct at each k."""

    def candidates(ids: np.ndarray, scores: np.ndarray) -> list[dict[str, Any]]:
        return [{"name": dictionary.names[j], "cuis": list(dictionary.cuis[j]), "score": round(float(s), 6)}
                for j, s in zip(ids, scores)]

    for i, q in enumerate(queries):
        parts = [{"mention": p.mention, "gold": sorted(p.gold), "candidates": candidates(*found)}
                 for p, found in zip(q.parts, result.candidates[i])]
        yield {"dataset": name, "index": i, "mention": q.text, "gold": q.gold, "parts": parts,
               **{f"correct@{k}": bool(result.correct[k][i]) for k in result.correct}}


def evaluate_bel(encoder: TextEncoder, data_dir: str | os.PathLike[str] | None = None, *,
                 settings: BelSettings | None = None, batch_size: int = 256, show_progress: bool = True) -> TaskMetrics:
    """acc@k on NCBI-disease and BC5CDR-disease (options: ``BelSettings``); ``primary`` = mean acc@1 over the sets
    evaluated; the result's ``skipped`` maps a skipped set to the reason."""
    settings = settings or BelSettings()
    chosen = BEL_DATASETS if settings.datasets is None else settings.datasets
    names = [chosen] if isinstance(chosen, str) else list(chosen)
    unknown = [n for n in names if n not in _LOADERS]
    if unknown:
        raise UserError(f"unknown BEL data set(s) {', '.join(unknown)}; known: {', '.join(BEL_DATASETS)}")
    folders, skipped = ds.present_sets(data_dir, names, explicit=settings.datasets is not None, what="BEL data set")
    metrics = TaskMetrics()
    metrics.skipped.update(skipped)
    records: list[dict[str, Any]] = []
    for name, folder in folders.items():
        dictionary, queries = _LOADERS[name](folder)
        logger.info("BEL %s: %d names, %d queries", name, len(dictionary), len(queries))
        result = link(encoder, dictionary, queries, settings, batch_size=batch_size, show_progress=show_progress)
        metrics.update({f"{name}_acc@{k}": acc for k, acc in result.accuracy.items()})
        logger.info("BEL %s: %s", name, ", ".join(f"acc@{k}={a:.4f}" for k, a in result.accuracy.items()))
        if settings.predictions_path is not None:
            records.extend(_prediction_records(name, dictionary, queries, result))
    metrics["primary"] = float(np.mean([metrics[f"{n}_acc@1"] for n in folders]))
    if settings.predictions_path is not None:  # the caller applied the write policy (--overwrite)
        from mirrorbert.safeguards.writes import write_text_atomic

        written = write_text_atomic(settings.predictions_path, "".join(jsonio.dumps(r, ensure_ascii=False) + "\n"
                                    for r in records), overwrite=True, option="predictions_path")
        logger.info("BEL predictions written to %s", written)
    return metrics
