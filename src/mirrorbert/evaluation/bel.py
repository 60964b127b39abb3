"""Biomedical entity linking (BEL): acc@1 / acc@5 of nearest-name retrieval, as in SapBERT/BioSyn.

Protocol (the one used by the Mirror-BERT paper through SapBERT's evaluation code):

* every dictionary name and every query mention is encoded on its own (no context); a query part is
  linked to the dictionary names nearest by cosine (exact, chunked search: :mod:`.retrieval`);
* a part is correct at k when a CUI of one of its top-k names is among its gold CUIs; a query is
  correct at k when **every** part is (composite mentions);
* accuracy is over all queries of the test file, duplicates included (NCBI: 960 queries).

Gold field conventions (BioSyn files): ``|`` separates alternative CUIs, ``+`` separates the parts of a
composite mention. How a query line ``mention||gold`` becomes parts (``mention`` may itself hold the
parts of a resolved composite separated by ``|`` or ``+``, the BioSyn convention):

* as many mention parts as ``+`` gold parts: aligned, part i must hit gold part i;
* one gold part, several mention parts (BioSyn's resolved composites ``m1|m2||C1|C2``, whose order
  is not reliable): every mention part must hit one of the gold CUIs (BioSyn/SapBERT rule);
* one mention, several gold parts: the same mention stands for each part, so its top-k must cover
  every gold part (a dictionary name carrying several CUIs can do this at k = 1);
* any other mismatch: every mention part must hit the union of the gold CUIs.

The NCBI copy used here (BioSyn preprocessing; lowercased, punctuation removed, abbreviations resolved
with Ab3P, composite mentions resolved) has no ``+`` and no multi-part mentions in its test queries;
``|`` occurs in 13 gold fields and is read as alternatives. Its dictionary is BioSyn's
``test_dictionary.txt`` (MEDIC names plus train/dev mentions).

BC5CDR-disease is built from the raw files with the same recipe (:func:`load_bc5cdr`); see its
docstring for every choice.
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
from mirrorbert.errors import DatasetMissing, UserError
from mirrorbert.evaluation import datasets as ds
from mirrorbert.evaluation.retrieval import DEFAULT_CHUNK_SIZE, cosine_topk
from mirrorbert.evaluation.sts import TaskMetrics, TextEncoder

logger = logging.getLogger(__name__)

BEL_DATASETS: tuple[str, ...] = ("ncbi", "bc5cdr")
DEFAULT_KS: tuple[int, ...] = (1, 5)


# ------------------------------------------------------------------------------------ data model
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


class _DictionaryBuilder:
    """Collects (name, CUIs) pairs, merging repeated names as BioSyn's dictionary preprocessing does."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self.names: list[str] = []
        self.cuis: list[list[str]] = []

    def add(self, name: str, cuis: Iterable[str]) -> None:
        name = name.strip()
        cuis = [c for c in cuis if c]
        if not name or not cuis:
            return
        i = self._index.get(name)
        if i is None:
            self._index[name] = len(self.names)
            self.names.append(name)
            self.cuis.append(list(dict.fromkeys(cuis)))
        else:
            self.cuis[i].extend(c for c in cuis if c not in self.cuis[i])

    def build(self) -> Dictionary:
        return Dictionary(self.names, [tuple(c) for c in self.cuis])


# ---------------------------------------------------------------------------------- text helpers
_PUNCT_RE = re.compile(r"[\s{}]+".format(re.escape(string.punctuation)))


def normalize_text(text: str) -> str:
    """BioSyn's name preprocessing: lowercase, every run of punctuation/whitespace becomes one space."""
    return " ".join(_PUNCT_RE.split(text.lower())).strip()


def _split_ids(field: str) -> list[str]:
    return [c.strip() for c in field.split("|") if c.strip()]


def _strip_prefix(cui: str) -> str:
    """MEDIC/CTD ids carry ``MESH:``/``OMIM:`` prefixes; the corpora use bare MeSH and OMIM ids."""
    for prefix in ("MESH:", "OMIM:"):
        if cui.startswith(prefix):
            return cui[len(prefix) :]
    return cui


# --------------------------------------------------------------------------------- BioSyn format
def load_dictionary(path: str | os.PathLike[str]) -> Dictionary:
    """Dictionary file ``CUI[|CUI...]||name`` (one name per line); repeated names merge their CUIs."""
    path = Path(path)
    builder = _DictionaryBuilder()
    for lineno, line in enumerate(read_text_lines(path), 1):
        line = line.strip()
        if not line:
            continue
        fields = line.split("||")
        if len(fields) != 2:
            raise UserError(f"{path}:{lineno}: expected 'CUI[|CUI...]||name', got {line[:80]!r}")
        builder.add(fields[1], _split_ids(fields[0].replace("+", "|")))
    dictionary = builder.build()
    if not len(dictionary):
        raise UserError(f"{path}: empty dictionary")
    return dictionary


def make_query(mention: str, gold: str) -> Query:
    """Turn a ``mention||gold`` pair into parts following the rules of the module docstring."""
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
        line = line.rstrip("\n")
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


# ----------------------------------------------------------------------------------- MEDIC / CTD
def load_medic(path: str | os.PathLike[str]) -> list[tuple[list[str], list[str]]]:
    """MEDIC concepts as ``(ids, names)``; reads the CTD TSV and BioSyn's ``IDs||name|synonym|...``.

    CTD TSV columns: DiseaseName, DiseaseID, AltDiseaseIDs, Definition, ParentIDs, TreeNumbers,
    ParentTreeNumbers, Synonyms, ... (``#`` lines are comments). Ids are the main id plus the
    alternative ids, with the ``MESH:``/``OMIM:`` prefixes removed (other prefixes, e.g. ``DO:``, are
    kept and simply never match MeSH gold ids); names are the name plus the synonyms.
    """
    path = Path(path)
    concepts: list[tuple[list[str], list[str]]] = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        line = line.rstrip("\n")
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
        ids = [_strip_prefix(i.strip()) for i in ids if i.strip()]
        names = [n for n in names if n.strip()]
        if ids and names:
            concepts.append((ids, names))
    if not concepts:
        raise UserError(f"{path}: no MEDIC concepts")
    return concepts


# -------------------------------------------------------------------------------------- PubTator
@dataclass(frozen=True)
class PubTatorMention:
    pmid: str
    start: int
    end: int
    text: str
    type: str
    ids: tuple[str, ...]
    individual: tuple[str, ...]  # the parts of a composite mention (7th column), else ()


@dataclass
class PubTatorDocument:
    pmid: str
    title: str
    abstract: str
    mentions: list[PubTatorMention]


def read_pubtator(path: str | os.PathLike[str]) -> list[PubTatorDocument]:
    """Documents of a PubTator file: ``pmid|t|title``, ``pmid|a|abstract``, TAB annotation lines.

    Annotation lines have 6 fields (pmid, start, end, text, type, ids) or 7 (plus the individual
    mentions of a composite, ``|``-separated); 4-field relation lines (CID) are ignored.
    """
    path = Path(path)
    docs: list[PubTatorDocument] = []
    current: PubTatorDocument | None = None
    for lineno, line in enumerate(read_text_lines(path), 1):
        line = line.rstrip("\n")
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
            if kind == "t":
                current.title = text
            else:
                current.abstract = text
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


# ------------------------------------------------------------------------- abbreviation resolution
def _best_long_form(short: str, candidate: str) -> str | None:
    """Schwartz & Hearst (2003): shortest suffix of ``candidate`` whose characters spell ``short``.

    Characters of the short form are matched right to left; the first one must start a word.
    """
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
    """Abbreviation -> long form definitions ``long form (SF)`` in ``text`` (Schwartz & Hearst 2003).

    BioSyn resolved abbreviations with Ab3P, which is not available offline; this simpler published
    algorithm finds the same ``long form (short form)`` definitions in the common cases.
    """
    found: dict[str, str] = {}
    for m in re.finditer(r"\(([^()]{1,20})\)", text):
        inner = re.split(r"[;,]", m.group(1))[0].strip()
        words = inner.split()
        if not words or len(words) > 2 or not 2 <= len(inner) <= 10:
            continue
        if not inner[0].isalnum() or not any(ch.isalpha() for ch in inner):
            continue
        # Long-form window: same sentence, at most min(|SF| + 5, 2 |SF|) words before the parenthesis.
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
    if not abbreviations:
        return mention
    for _ in range(max_rounds):
        tokens = re.split(r"(\s+|/)", mention)
        new = "".join(abbreviations.get(t, t) for t in tokens)
        if new == mention:
            break
        mention = new
    return mention


# ------------------------------------------------------------------------------------------ BC5CDR
def _mention_parts(m: PubTatorMention, abbreviations: dict[str, str]) -> list[tuple[str, list[str]]] | None:
    """(normalised text, CUIs) parts of a PubTator mention; None when no usable id remains."""

    def clean(text: str) -> str:
        return normalize_text(expand_abbreviations(text, abbreviations))

    if m.individual and len(m.individual) == len(m.ids) and len(m.ids) > 1:
        parts = [(clean(t), [i]) for t, i in zip(m.individual, m.ids) if i != "-1" and clean(t)]
    else:
        ids = [i for i in m.ids if i != "-1"]
        parts = [(clean(m.text), [i]) for i in ids] if clean(m.text) else []
    return parts or None


def load_bc5cdr(folder: str | os.PathLike[str], entity_type: str = "Disease") -> tuple[Dictionary, list[Query]]:
    """BC5CDR-disease dictionary and test queries, rebuilt from the raw corpus as BioSyn does.

    * Queries: every ``Disease`` mention of ``CDR_TestSet.PubTator.txt`` (duplicates kept, as the
      4,424 mentions counted by BioSyn); ids ``-1`` (no MeSH concept) are dropped and a mention left
      without ids is dropped (61 in the test set). ``|`` in the ids marks a *composite* mention: with
      the individual mentions of the 7th column the parts are aligned one to one; without them the
      whole mention must reach every id within its top-k.
    * Text: abbreviations defined in the same abstract are expanded (:func:`find_abbreviations`,
      standing in for BioSyn's Ab3P), then lowercased with punctuation removed (BioSyn).
    * Dictionary: MEDIC names and synonyms with their MeSH/OMIM ids (prefixes removed), normalised the
      same way, plus the Disease mentions of the training and development sets with their ids (BioSyn's
      ``test_dictionary``, which the NCBI copy also follows); repeated names merge their ids.
    """
    folder = Path(folder)
    builder = _DictionaryBuilder()
    for ids, names in load_medic(folder / "medic_06Jul2012.txt"):
        for name in names:
            builder.add(normalize_text(name), ids)

    def mentions_of(path: Path) -> Iterable[tuple[PubTatorMention, list[tuple[str, list[str]]] | None]]:
        for doc in read_pubtator(path):
            abbreviations = find_abbreviations(f"{doc.title} {doc.abstract}")
            for m in doc.mentions:
                if m.type == entity_type:
                    yield m, _mention_parts(m, abbreviations)

    for split in ("CDR_TrainingSet.PubTator.txt", "CDR_DevelopmentSet.PubTator.txt"):
        for m, parts in mentions_of(folder / split):
            if not parts:
                continue
            if m.individual and len(m.individual) == len(m.ids) and len(m.ids) > 1:
                for text, cuis in parts:
                    builder.add(text, cuis)
            else:  # one name for the whole (possibly composite) mention, carrying all its ids
                builder.add(parts[0][0], [c for _, cuis in parts for c in cuis])

    queries: list[Query] = []
    dropped = 0
    for m, parts in mentions_of(folder / "CDR_TestSet.PubTator.txt"):
        if not parts:
            dropped += 1
            continue
        queries.append(
            Query(text=m.text, gold="|".join(m.ids), parts=tuple(QueryPart(t, frozenset(c)) for t, c in parts))
        )
    logger.info("bc5cdr: %d %s queries (%d without a concept id dropped)", len(queries), entity_type, dropped)
    return builder.build(), queries


def load_ncbi(folder: str | os.PathLike[str]) -> tuple[Dictionary, list[Query]]:
    """NCBI-disease test dictionary and queries in BioSyn's preprocessed layout."""
    folder = Path(folder)
    return load_dictionary(folder / "test_dictionary.txt"), load_queries(folder / "test_queries.txt")


_LOADERS = {"ncbi": load_ncbi, "bc5cdr": load_bc5cdr}


# ----------------------------------------------------------------------------------------- linking
@dataclass
class LinkResult:
    """Per-query correctness at each k and the candidates of every part (for predictions files)."""

    accuracy: dict[int, float]
    correct: dict[int, list[bool]]
    candidates: list[list[tuple[np.ndarray, np.ndarray]]]  # per query, per part: (dict ids, scores)


def link(
    encoder: TextEncoder,
    dictionary: Dictionary,
    queries: Sequence[Query],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    batch_size: int = 256,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = None,
    show_progress: bool = True,
    dictionary_embeddings: np.ndarray | None = None,
) -> LinkResult:
    """Link every query part to its nearest dictionary names and score acc@k for each k in ``ks``."""
    if not queries:
        raise UserError("no queries to link")
    ks = sorted({int(k) for k in ks})
    if ks[0] < 1:
        raise UserError(f"acc@k needs k >= 1, got {ks}")
    if dictionary_embeddings is None:
        logger.info("encoding %d dictionary names", len(dictionary))
        dictionary_embeddings = encoder.encode(
            dictionary.names, batch_size=batch_size, normalize=True, show_progress=show_progress
        )
    mention_texts = list(dict.fromkeys(p.mention for q in queries for p in q.parts))
    mention_row = {t: i for i, t in enumerate(mention_texts)}
    logger.info("encoding %d distinct mentions of %d queries", len(mention_texts), len(queries))
    mention_embeddings = encoder.encode(mention_texts, batch_size=batch_size, normalize=True, show_progress=False)
    scores, ids = cosine_topk(
        mention_embeddings, dictionary_embeddings, max(ks), chunk_size=chunk_size, use_faiss=use_faiss
    )

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


def _prediction_records(
    name: str, dictionary: Dictionary, queries: Sequence[Query], result: LinkResult
) -> Iterable[dict[str, Any]]:
    for i, q in enumerate(queries):
        yield {
            "dataset": name,
            "index": i,
            "mention": q.text,
            "gold": q.gold,
            "parts": [
                {
                    "mention": p.mention,
                    "gold": sorted(p.gold),
                    "candidates": [
                        {"name": dictionary.names[j], "cuis": list(dictionary.cuis[j]), "score": round(float(s), 6)}
                        for j, s in zip(cand_ids, cand_scores)
                    ],
                }
                for p, (cand_ids, cand_scores) in zip(q.parts, result.candidates[i])
            ],
            **{f"correct@{k}": bool(result.correct[k][i]) for k in result.correct},
        }


# -------------------------------------------------------------------------------------- entry point
def evaluate_bel(
    encoder: TextEncoder,
    data_dir: str | os.PathLike[str] | None = None,
    datasets: Sequence[str] | None = None,
    batch_size: int = 256,
    predictions_path: str | os.PathLike[str] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_faiss: bool | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    show_progress: bool = True,
) -> TaskMetrics:
    """acc@k on NCBI-disease and BC5CDR-disease; ``primary`` = mean acc@1 over the sets evaluated.

    ``datasets=None`` evaluates every BEL set present, skipping a missing one with a warning (and
    raising :class:`DatasetMissing` only when none is present; the result's ``skipped`` maps a
    skipped set to the reason); naming sets explicitly makes each of them required.
    ``predictions_path`` writes one JSON line per query (all sets in one file, with a ``dataset``
    field). ``use_faiss=None`` uses faiss when importable (exact search either way).
    """
    ks = sorted({1, *(int(k) for k in ks)})  # acc@1 is always reported: it is the primary metric
    folders, messages = _set_folders(data_dir, datasets)
    metrics = TaskMetrics()
    metrics.skipped.update(messages)
    records: list[dict[str, Any]] = []
    for name, folder in folders.items():
        dictionary, queries = _LOADERS[name](folder)
        logger.info("BEL %s: %d names, %d queries", name, len(dictionary), len(queries))
        result = link(
            encoder,
            dictionary,
            queries,
            ks,
            batch_size=batch_size,
            chunk_size=chunk_size,
            use_faiss=use_faiss,
            show_progress=show_progress,
        )
        for k, acc in result.accuracy.items():
            metrics[f"{name}_acc@{k}"] = acc
        logger.info("BEL %s: %s", name, ", ".join(f"acc@{k}={a:.4f}" for k, a in result.accuracy.items()))
        if predictions_path is not None:
            records.extend(_prediction_records(name, dictionary, queries, result))

    metrics["primary"] = float(np.mean([metrics[f"{n}_acc@1"] for n in folders]))
    if predictions_path is not None:
        _write_predictions(predictions_path, records)
    return metrics


def _set_folders(data_dir: str | os.PathLike[str] | None,
                 datasets: Sequence[str] | str | None) -> tuple[dict[str, Path], dict[str, str]]:
    """({set: folder} of the sets to evaluate, {set: why skipped}): a set named explicitly is required, one of
    the default list is skipped with a warning when absent; none at all is DatasetMissing."""
    explicit = datasets is not None
    names = [datasets] if isinstance(datasets, str) else list(BEL_DATASETS if datasets is None else datasets)
    unknown = [n for n in names if n not in _LOADERS]
    if unknown:
        raise UserError(f"unknown BEL data set(s) {', '.join(unknown)}; known: {', '.join(BEL_DATASETS)}")
    folders: dict[str, Path] = {}
    messages: dict[str, str] = {}
    for name in names:
        try:
            folders[name] = ds.require(data_dir, name)
        except DatasetMissing as err:
            if explicit:
                raise
            logger.warning("BEL: skipping %s: %s", name, err)
            messages[name] = str(err)
    if not folders:
        raise DatasetMissing("; ".join(messages.values()) if messages else "no BEL data set requested")
    return folders, messages


def _write_predictions(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> None:
    """One JSON line per query; the caller applied the write policy (`eval` refuses an existing file without
    --overwrite)."""
    from mirrorbert.safeguards.writes import write_text_atomic

    written = write_text_atomic(path, "".join(jsonio.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                overwrite=True, option="predictions_path")
    logger.info("BEL predictions written to %s", written)
