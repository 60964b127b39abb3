#!/usr/bin/env python
"""Build the offline English reference corpus for MLM pre-training (one sentence or definition per line).

Sources, all obtainable on a machine without internet access:
  wiki     <data>/corpora/en_wiki_20k_sents.txt        20k English Wikipedia sentences
  wordnet  <data>/wordnet/data.{noun,verb,adj,adv}     WordNet 3.0 glosses and usage examples
  gcide    /usr/share/dictd/gcide.dict.dz              GNU Collaborative International Dictionary of
                                                       English (Debian package dict-gcide): definitions
                                                       and quotations, markup removed
  stsb     <data>/sts/STSBenchmark/sts-train.csv       STS-B *training* sentences

Every sentence of an evaluation set (STS-B dev and test, SICK train/trial/test, QNLI dev) is removed,
compared after case folding and ignoring punctuation and spacing, and the removals are reported per
source and per evaluation set. Lines are deduplicated the same way, shuffled with a fixed seed and
written as UTF-8; a JSON file of statistics is written next to the corpus.

    python scripts/build_reference_corpus.py --data-dir ../shared/data --output /tmp/ref/corpus.txt \
        --tokenizer ../shared/data/tokenizers/bert-base-uncased
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import logging
import os
import random
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from mirrorbert.safeguards.readback import open_regular, open_text  # regular files, never a FIFO

DEFAULT_GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
GCIDE_INSTALL_HINT = (
    "install it with `sudo apt-get install dict-gcide` (Debian/Ubuntu; it provides "
    "/usr/share/dictd/gcide.dict.dz), pass --gcide PATH to a copy, or --skip-gcide to build without it"
)
SOURCES = ("wiki", "wordnet", "gcide", "stsb")
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")


class CorpusError(Exception):
    """A missing input or bad option: printed as one line, exit status 2."""


# --------------------------------------------------------------------------- normalisation
def normalize_key(text: str) -> str:
    """Comparison key: NFKC, case-folded, words only, so 'A man .' and 'a man.' collide."""
    return " ".join(re.findall(r"\w+", unicodedata.normalize("NFKC", text).casefold()))


def clean_space(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# --------------------------------------------------------------------------- sources
def _need(path: Path, what: str) -> Path:
    if not path.exists():
        raise CorpusError(f"{what} not found: {path} (check --data-dir)")
    return path


def read_wiki(data_dir: Path) -> Iterator[str]:
    path = _need(data_dir / "corpora" / "en_wiki_20k_sents.txt", "English Wikipedia sentences")
    with open_text(path, "--data-dir", errors="replace") as fh:
        for line in fh:
            line = clean_space(line)
            if line:
                yield line


def parse_wordnet_gloss(gloss: str) -> list[str]:
    """A WordNet gloss is `definition[; definition]; "example"; "example"`; return definition and examples."""
    gloss = gloss.strip()
    first_quote = gloss.find('"')
    definition = gloss if first_quote < 0 else gloss[:first_quote]
    out = []
    definition = clean_space(definition.strip().rstrip(";").strip())
    if definition:
        out.append(definition)
    if first_quote >= 0:
        rest = gloss[first_quote:]
        examples = re.findall(r'"([^"]*)"', rest)
        if rest.count('"') % 2 == 1:  # an unclosed final example (a few glosses are malformed)
            examples.append(rest[rest.rfind('"') + 1 :])
        for ex in examples:
            ex = clean_space(re.sub(r"\s+-+\s*[A-Z][\w.' ]*$", "", ex))  # drop a trailing '- Author'
            if ex:
                out.append(ex)
    return out


def read_wordnet(data_dir: Path) -> Iterator[str]:
    folder = _need(data_dir / "wordnet", "WordNet folder")
    for name in WORDNET_FILES:
        path = _need(folder / name, "WordNet data file")
        with open_text(path, "--data-dir", errors="replace") as fh:
            for line in fh:
                if line.startswith("  ") or " | " not in line:  # licence header lines start with two spaces
                    continue
                yield from parse_wordnet_gloss(line.split(" | ", 1)[1])


def _stsb_rows(path: Path) -> Iterator[tuple[str, str]]:
    with open_text(path, "--data-dir", errors="replace") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 7:
                yield parts[5], parts[6]


def read_stsb_train(data_dir: Path) -> Iterator[str]:
    path = _need(data_dir / "sts" / "STSBenchmark" / "sts-train.csv", "STS-B training file")
    for a, b in _stsb_rows(path):
        for s in (a, b):
            s = clean_space(s)
            if s:
                yield s


# ---- GCIDE (dictd format: a gzip'ed text file plus a headword index with base-64 offsets)
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def dictd_b64(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 64 + _B64.index(ch)
    return value


# Multi-letter character entities of the GCIDE markup, e.g. [ae] for the ligature; single letters with a
# diacritic ([a^], ['e], [=o], ["u]) are reduced to the letter by a rule below.
_ENTITIES = {
    "ae": "ae", "AE": "Ae", "oe": "oe", "OE": "Oe", "eth": "th", "th": "th", "ng": "ng", "deg": " degrees",
    "asl": "a", "aum": "a", "add": "a", "udd": "u", "oo": "oo", "=oo": "oo", "oo^": "oo", "=ae": "ae",
    "ae^": "ae", "bar": "", "frac12": "1/2", "frac13": "1/3", "frac14": "1/4", "frac34": "3/4",
}
_SOURCE_TAG = re.compile(r"\[(?:[^\[\]]*(?:Webster|WordNet|PJC|Century|Suppl\.|RDH|MW|Chambers|Dict\.)[^\[\]]*)\]")
_DIACRITIC = re.compile(r"\[(?:[`'\"^~=\-.,*]([A-Za-z])|([A-Za-z])\^)\]")
_LABEL = re.compile(r"\([A-Z][A-Za-z]*\.?(?:\s+(?:&\s+)?[A-Za-z]+\.?){0,2}\)")  # (Bot.), (Akkadian mythology)
_HEADWORD = re.compile(r"^[^\n]*\\[^\\\n]*\\")  # greedy: up to the last \form\ of the first line
_LEAD = re.compile(r"^[\s,;:]*(?:\([^()]*\)[\s,;:]*)?(?:(?:[a-z]{1,6}\.|&|,|;)\s*)*")
_PREFIX_LABELS = ("Note:", "Usage:", "Specifically:", "Hence:")
_SKIP_LABELS = ("Syn:", "Antonym:", "See:")


def _replace_entities(text: str) -> str:
    text = re.sub(r"\[([A-Za-z=^]{2,6}|frac\d\d)\]", lambda m: _ENTITIES.get(m.group(1), m.group(0)), text)
    return _DIACRITIC.sub(lambda m: m.group(1) or m.group(2), text)


def _drop_brackets(text: str) -> str:
    """Remove [...] groups (etymologies, usage labels), innermost first so nested groups go too."""
    previous = None
    while previous != text:
        previous = text
        text = re.sub(r"\[[^\[\]]*\]", " ", text)
    return text.replace("[", " ").replace("]", " ")


def clean_gcide_block(block: str, headword: bool) -> list[str]:
    """Turn one blank-line-separated block of a GCIDE entry into plain-text definitions/quotations."""
    text = block.replace("\ufffd", "'")
    text = _SOURCE_TAG.sub(" ", text)
    if headword:
        text = _HEADWORD.sub(" ", text, count=1)
    text = clean_space(text)
    if not text or text.startswith(_SKIP_LABELS):
        return []
    for label in _PREFIX_LABELS:
        if text.startswith(label):
            text = text[len(label) :]
    text = _replace_entities(text)
    text = _drop_brackets(text)
    # {cross refs} keep their words; inside braces * ` " mark syllables and stress
    text = re.sub(r"\{([^{}]*)\}", lambda m: re.sub(r"[*`\"]", "", m.group(1)), text)
    text = text.replace("{", "").replace("}", "").replace("||", "")
    text = re.sub(r"\\[^\\]*\\", " ", text)
    text = re.sub(r"(?<=\w)[*`](?=\w)", "", text).replace("\\", " ")  # stray syllable/stress marks
    # an attribution (--Milton.) or a run-in derivative (-- Accrimination, n.) ends the useful text
    cut = re.search(r"(?:^|\s)--", text)
    if cut:
        text = text[: cut.start()]
    text = _LABEL.sub(" ", text)
    text = re.sub(r"\s+([,;:.!?])", r"\1", clean_space(text))
    if headword:
        text = _LEAD.sub("", text)
    text = re.sub(r"^\d+\.\s*", "", text)
    out = []
    for part in re.split(r"(?:^|\s)\([a-z]\)\s", " " + text):  # sub-senses (a) ... (b) ...
        part = clean_space(re.sub(r"^\d+\.\s*", "", part.strip()))
        part = _LEAD.sub("", part) if re.match(r"^[a-z]{1,6}\.\s", part) else part
        part = part.strip(" ,;:")
        if part and re.search(r"[A-Za-z]", part):
            out.append(part)
    return out


def _gcide_entries(raw: bytes, index: Path | None) -> Iterator[str]:
    if index is not None and index.exists():
        spans = set()
        with open_text(index, "--data-dir", errors="replace") as fh:
            for line in fh:
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 3 or parts[0].startswith("00-"):
                    continue
                spans.add((dictd_b64(parts[1]), dictd_b64(parts[2])))
        for start, length in sorted(spans):
            yield raw[start : start + length].decode("utf-8", errors="replace")
    else:  # no index: one region; blocks before the first headword line are the database header
        yield raw.decode("utf-8", errors="replace")


def read_gcide(path: Path) -> Iterator[str]:
    if not path.exists():
        raise CorpusError(f"GCIDE dictionary not found at {path}: {GCIDE_INSTALL_HINT}")
    with os.fdopen(open_regular(path, "--gcide"), "rb") as fh:
        raw = fh.read()
    if path.suffix in (".dz", ".gz"):
        raw = gzip.decompress(raw)
    index = path.with_name(path.name.split(".")[0] + ".index")
    seen_headword = False
    for entry in _gcide_entries(raw, index if index.exists() else None):
        for block in re.split(r"\n\s*\n", entry):
            if not block.strip():
                continue
            first = block.lstrip("\n").split("\n", 1)[0]
            is_head = bool(first) and not first[0].isspace() and bool(_HEADWORD.match(first))
            seen_headword = seen_headword or is_head
            if not seen_headword:
                continue
            yield from clean_gcide_block(block, is_head)


# ---- evaluation sets that must never enter the corpus
def _tsv_columns(path: Path, columns: tuple[int, ...], header: bool) -> Iterator[str]:
    with open_text(path, "--data-dir", errors="replace", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        for i, row in enumerate(reader):
            if header and i == 0:
                continue
            for c in columns:
                if c < len(row) and row[c].strip():
                    yield row[c]


def evaluation_sentences(data_dir: Path) -> dict[str, set[str]]:
    """Normalised keys of every evaluation sentence, per evaluation set."""
    sts = data_dir / "sts" / "STSBenchmark"
    sick = data_dir / "sts" / "SICK"
    sets: dict[str, list[tuple[Path, tuple[int, ...], bool]]] = {
        "stsb-dev": [(sts / "sts-dev.csv", (5, 6), False)],
        "stsb-test": [(sts / "sts-test.csv", (5, 6), False)],
        "sick": [(sick / f, (1, 2), True) for f in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt")],
        "qnli-dev": [(data_dir / "qnli" / "dev.tsv", (1, 2), True)],
    }
    out: dict[str, set[str]] = {}
    for name, files in sets.items():
        keys: set[str] = set()
        for path, cols, header in files:
            _need(path, f"evaluation set {name} (needed to keep it out of the corpus)")
            keys.update(k for k in map(normalize_key, _tsv_columns(path, cols, header)) if k)
        out[name] = keys
    return out


# --------------------------------------------------------------------------- assembly
def _with_progress(lines: Iterable[str], source: str) -> Iterable[str]:
    """A source's lines through mirrorbert's progress helper: a bar on a terminal, a line every 30 s off one
    (the quickstart's log), so a long source (GCIDE) is not a silent minute."""
    try:
        from mirrorbert.reporting.progress import progress_bar
    except ImportError:  # run outside the package's environment: the same corpus, without progress
        return lines
    return progress_bar(lines, desc=f"corpus {source}", unit="line")


def build_corpus(
    data_dir: Path,
    output: Path,
    gcide: Path | None,
    tokenizer=None,
    seed: int = 0,
    min_words: int = 3,
    shuffle: bool = True,
    log=print,
) -> dict:
    """Write the corpus and return statistics (also written to `<output>.stats.json`)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise CorpusError(f"--data-dir {data_dir}: no such folder")
    readers: dict[str, Iterable[str]] = {
        "wiki": read_wiki(data_dir),
        "wordnet": read_wordnet(data_dir),
        "gcide": read_gcide(gcide) if gcide is not None else iter(()),
        "stsb": read_stsb_train(data_dir),
    }
    if gcide is not None and not gcide.exists():  # fail before reading anything else
        raise CorpusError(f"GCIDE dictionary not found at {gcide}: {GCIDE_INSTALL_HINT}")
    eval_keys = evaluation_sentences(data_dir)
    all_eval = set().union(*eval_keys.values())

    seen: set[str] = set()
    kept: list[tuple[str, str]] = []
    stats: dict = {"sources": {}, "excluded_by_eval_set": Counter(), "eval_sentences": {k: len(v) for k, v in eval_keys.items()}}
    found_eval: set[str] = set()
    for source, lines in readers.items():
        s = Counter()
        for line in _with_progress(lines, source):
            s["read"] += 1
            key = normalize_key(line)
            if len(key.split()) < min_words:
                s["too_short"] += 1
                continue
            if key in all_eval:
                s["excluded_eval"] += 1
                found_eval.add(key)
                for name, keys in eval_keys.items():
                    if key in keys:
                        stats["excluded_by_eval_set"][name] += 1
                continue
            if key in seen:
                s["duplicates"] += 1
                continue
            seen.add(key)
            kept.append((source, line))
            s["kept"] += 1
            s["words"] += len(line.split())
        stats["sources"][source] = dict(s)
        log(f"{source:8s} read {s['read']:>8d}  kept {s['kept']:>8d}  duplicates {s['duplicates']:>7d}  "
            f"too short {s['too_short']:>6d}  evaluation sentences removed {s['excluded_eval']:>5d}")
    stats["distinct_eval_sentences_found"] = len(found_eval)
    stats["excluded_by_eval_set"] = dict(stats["excluded_by_eval_set"])

    if tokenizer is not None:
        for source in readers:
            texts = [t for s, t in kept if s == source]
            n_tok = 0
            for i in range(0, len(texts), 4096):
                enc = tokenizer(texts[i : i + 4096], add_special_tokens=False, return_attention_mask=False, verbose=False)
                n_tok += sum(len(ids) for ids in enc["input_ids"])
            stats["sources"][source]["tokens"] = n_tok

    if shuffle:
        random.Random(seed).shuffle(kept)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for _, line in kept:
            fh.write(line + "\n")
    os.replace(tmp, output)

    totals = Counter()
    for src in stats["sources"].values():
        totals.update({k: v for k, v in src.items() if isinstance(v, int)})
    stats["total"] = dict(totals)
    stats["output"] = str(output)
    stats["settings"] = {"seed": seed, "min_words": min_words, "shuffle": shuffle, "gcide": str(gcide) if gcide else None}
    stats_path = output.with_name(output.name + ".stats.json")
    stats_path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")

    log("")
    log(f"{'source':8s} {'lines':>9s} {'words':>11s} {'tokens':>11s}")
    for source, s in stats["sources"].items():
        tok = f"{s['tokens']:>11d}" if "tokens" in s else f"{'-':>11s}"
        log(f"{source:8s} {s.get('kept', 0):>9d} {s.get('words', 0):>11d} {tok}")
    tok = f"{totals['tokens']:>11d}" if tokenizer is not None else f"{'-':>11s}"
    log(f"{'total':8s} {totals['kept']:>9d} {totals['words']:>11d} {tok}")
    log("")
    log(
        f"evaluation sentences removed: {totals['excluded_eval']} lines "
        f"({len(found_eval)} distinct evaluation sentences); per set: "
        + ", ".join(f"{k} {stats['excluded_by_eval_set'].get(k, 0)}" for k in eval_keys)
    )
    log(f"wrote {output} and {stats_path}")
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"),
                        help="shared data folder (default: $MIRRORBERT_DATA)")
    parser.add_argument("--output", required=True, help="corpus file to write (UTF-8, one line per sentence)")
    parser.add_argument("--gcide", default=str(DEFAULT_GCIDE), help=f"GCIDE dictd file (default {DEFAULT_GCIDE})")
    parser.add_argument("--skip-gcide", action="store_true", help="build without the GCIDE dictionary")
    parser.add_argument("--tokenizer", help="HF tokenizer folder, to also count tokens per source")
    parser.add_argument("--min-words", type=int, default=3, help="drop lines with fewer words (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--no-shuffle", action="store_true", help="keep source order")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        if not args.data_dir:
            raise CorpusError("no data folder: pass --data-dir or set MIRRORBERT_DATA")
        gcide = None if args.skip_gcide else Path(args.gcide)
        if gcide is not None and not gcide.exists():
            raise CorpusError(f"GCIDE dictionary not found at {gcide}: {GCIDE_INSTALL_HINT}")
        tokenizer = None
        if args.tokenizer:
            if not Path(args.tokenizer).exists():
                raise CorpusError(f"--tokenizer {args.tokenizer}: no such folder")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        build_corpus(Path(args.data_dir), Path(args.output), gcide, tokenizer, args.seed, args.min_words,
                     not args.no_shuffle)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
