"""Registry of evaluation sets: where each lives in the data directory and where it officially comes from.

Nothing is shipped or downloaded: ``--data-dir`` (or ``$MIRRORBERT_DATA``) holds the sets in their published
layouts. :func:`require` raises :class:`~mirrorbert.errors.DatasetMissing`, naming the missing files and the
official source, so the runner reports the task as *skipped*. To add a set, add a ``DatasetInfo`` to
``REGISTRY``: ``folder`` is relative to the data directory, ``files`` to ``folder``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mirrorbert.errors import DatasetMissing, UserError

ENV_VAR = "MIRRORBERT_DATA"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetInfo:
    """One evaluation set: its folder under the data directory, required files, provenance."""

    name: str
    folder: str
    files: tuple[str, ...]
    official_source: str
    licence: str


_SENTEVAL = "SentEval (facebookresearch/SentEval, data/downstream/get_transfer_data.bash)"
#: Subsets of STS12-16 as distributed by SentEval (STS13 "SMT" is not redistributable and absent).
STS_YEAR_SUBSETS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
_STS_YEAR_URLS = {
    "STS12": "https://www.cs.york.ac.uk/semeval-2012/task6/ (SemEval-2012 Task 6)",
    "STS13": "https://www.cs.york.ac.uk/semeval-2013/task6/ (*SEM 2013 shared task)",
    "STS14": "https://alt.qcri.org/semeval2014/task10/ (SemEval-2014 Task 10)",
    "STS15": "https://alt.qcri.org/semeval2015/task2/ (SemEval-2015 Task 2)",
    "STS16": "https://alt.qcri.org/semeval2016/task1/ (SemEval-2016 Task 1)",
}
_STS17 = "https://alt.qcri.org/semeval2017/task1/ (SemEval-2017 Task 1: STS2017.eval.v1.1 + STS2017.gs)"
_EVW = "https://github.com/mfaruqui/eval-word-vectors (data/word-sim)"
#: The six BLI pairs of the Mirror-BERT paper (Glavaš et al. 2019 dictionaries).
BLI_PAIRS: tuple[str, ...] = ("en-fr", "en-it", "en-ru", "en-tr", "it-fr", "ru-fr")


def bli_entry(pair: str) -> DatasetInfo:
    """The registry entry of a BLI pair ``xx-yy`` (any pair: the paper's six are registered)."""
    return DatasetInfo(
        name=f"bli-{pair}",
        folder=f"bli/{pair}",
        files=(f"yacle.train.freq.5k.{pair}.tsv", f"yacle.test.freq.2k.{pair}.tsv"),
        official_source="Glavaš et al. 2019, 'How to (properly) evaluate cross-lingual word embeddings' "
        "(https://github.com/codogogo/xling-eval, bli_datasets/<pair>/)",
        licence="as published by the authors (xling-eval repository)",
    )


REGISTRY: dict[str, DatasetInfo] = {entry.name: entry for entry in (
    *(DatasetInfo(
        name=year.lower(),
        folder=f"sts/{year}-en-test",
        files=tuple(f for s in subsets for f in (f"STS.input.{s}.txt", f"STS.gs.{s}.txt")),
        official_source=f"{_STS_YEAR_URLS[year]}; SentEval layout via {_SENTEVAL}",
        licence="per-subset terms of the SemEval STS task (research use)",
    ) for year, subsets in STS_YEAR_SUBSETS.items()),
    DatasetInfo(
        name="stsb",
        folder="sts/STSBenchmark",
        files=("sts-train.csv", "sts-dev.csv", "sts-test.csv"),
        official_source="https://ixa2.si.ehu.eus/stswiki/index.php/STSbenchmark (Cer et al. 2017), "
        "Stsbenchmark.tar.gz; also in SentEval data/downstream/STS/STSBenchmark",
        licence="see LICENSE.txt in the archive (per-source terms)",
    ),
    DatasetInfo(
        name="sickr",
        folder="sts/SICK",
        files=("SICK_test_annotated.txt",),
        official_source="https://zenodo.org/records/2787612 (SICK, Marelli et al. 2014); SentEval files "
        "SICK_train.txt, SICK_trial.txt, SICK_test_annotated.txt",
        licence="CC BY-NC-SA 3.0",
    ),
    *(DatasetInfo(
        name=f"sts-{lang}",
        folder="sts/STS17",
        files=(f"STS.input.{track}.{lang}-{lang}.txt", f"STS.gs.{track}.{lang}-{lang}.txt"),
        official_source=_STS17,
        licence="SemEval-2017 Task 1 terms (research use)",
    ) for lang, track in (("es", "track3"), ("ar", "track1"))),
    DatasetInfo(
        name="sts-ru",
        folder="sts/STS-ru",
        files=("STS.input.ru.txt", "STS.gs.ru.txt"),
        official_source="Russian translation of the STS Benchmark test set "
        "(https://github.com/deepmipt/deepPavlovEval, data/stsb_ru); convert to the pair/score layout",
        licence="as published",
    ),
    DatasetInfo(
        name="simlex999",
        folder="wordsim",
        files=("SimLex-999.txt",),
        official_source="https://fh295.github.io/simlex.html (Hill et al. 2015), SimLex-999.zip",
        licence="see the README shipped in SimLex-999.zip",
    ),
    *(DatasetInfo(
        name=name,
        folder="wordsim",
        files=(file,),
        official_source=f"{source} ({cite}); eval-word-vectors copy: {_EVW}",
        licence="eval-word-vectors: MIT; original data as published",
    ) for name, file, source, cite in (
        ("ws353", "EN-WS-353-ALL.txt", "https://gabrilovich.com/resources/data/wordsim353/", "Finkelstein et al. 2002"),
        ("men", "EN-MEN-TR-3k.txt", "https://staff.fnwi.uva.nl/e.bruni/MEN", "Bruni et al. 2014"),
        ("rw", "EN-RW-STANFORD.txt", "https://nlp.stanford.edu/~lmthang/morphoNLM/", "Luong et al. 2013"),
        ("simverb", "EN-SimVerb-3500.txt", "https://people.ds.cam.ac.uk/dsg40/simverb.html", "Gerz et al. 2016"),
    )),
    DatasetInfo(
        name="multisimlex",
        folder="wordsim",
        files=("multisimlex.tsv",),
        official_source="https://multisimlex.com (Vulić et al. 2020); rebuilt from concepticon/concepticon-data "
        "concepticondata/conceptlists/Vulic-2020-2244.tsv",
        licence="CC BY 4.0",
    ),
    DatasetInfo(
        name="qnli",
        folder="qnli",
        files=("dev.tsv",),
        official_source="GLUE (https://gluebenchmark.com/tasks), QNLI.zip: dev.tsv (Wang et al. 2018, from SQuAD)",
        licence="CC BY-SA 4.0 (SQuAD)",
    ),
    DatasetInfo(
        name="ncbi",
        folder="bel/ncbi",
        files=("test_dictionary.txt", "test_queries.txt"),
        official_source="NCBI-disease corpus (Dogan et al. 2014, https://www.ncbi.nlm.nih.gov/CBBresearch/Dogan/DISEASE/) "
        "as preprocessed by BioSyn (https://github.com/dmis-lab/BioSyn, datasets/ncbi-disease: test_dictionary.txt "
        "and processed_test, one line per query); the copy used here: lzxlin/kNN-BioEL data/benchmarks/ncbi/formatted",
        licence="NCBI-disease: public domain (US government work); BioSyn/kNN-BioEL preprocessing: MIT",
    ),
    DatasetInfo(
        name="bc5cdr",
        folder="bel/bc5cdr",
        files=(
            "CDR_TestSet.PubTator.txt",
            "CDR_TrainingSet.PubTator.txt",
            "CDR_DevelopmentSet.PubTator.txt",
            "medic_06Jul2012.txt",
        ),
        official_source="BioCreative V CDR corpus (Li et al. 2016, "
        "https://biocreative.bioinformatics.udel.edu/tasks/biocreative-v/track-3-cdr/, CDR_Data.zip: "
        "CDR_{Training,Development,Test}Set.PubTator.txt) and the CTD MEDIC disease vocabulary of 6 July 2012 "
        "(http://ctdbase.org/downloads/#alldiseases; BioSyn ships it as preprocess/resources/medic_06Jul2012.txt)",
        licence="BioCreative corpus terms (research use); MEDIC: CTD terms of use",
    ),
    *(bli_entry(pair) for pair in BLI_PAIRS),
)}


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: the argument if given, else ``$MIRRORBERT_DATA``; a clear error otherwise."""
    if data_dir is None or str(data_dir) == "":
        env = os.environ.get(ENV_VAR)
        if not env:
            raise UserError(f"no data directory: pass --data-dir or set the environment variable {ENV_VAR}")
        data_dir = env
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise UserError(f"data directory not found: {path}")
    return path


def info(name: str) -> DatasetInfo:
    """Registry entry by name; unknown names are a user error listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown evaluation set {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def require(data_dir: str | os.PathLike[str] | None, name: str | DatasetInfo,
            files: Sequence[str] | None = None) -> Path:
    """Folder of set ``name`` (a registry name or entry) after checking its files (or only ``files``) exist;
    DatasetMissing names the missing files and the official source."""
    entry = name if isinstance(name, DatasetInfo) else info(name)
    folder = resolve_data_dir(data_dir) / entry.folder
    missing = [f for f in (entry.files if files is None else files) if not (folder / f).is_file()]
    if missing:
        shown = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
        raise DatasetMissing(f"evaluation set '{entry.name}' not found: missing {shown} in {folder}; "
                             f"official source: {entry.official_source}; licence: {entry.licence}")
    return folder


def present_sets(data_dir: str | os.PathLike[str] | None, names: Sequence[str], *, explicit: bool, what: str,
                 entry: Callable[[str], str | DatasetInfo] = str) -> tuple[dict[str, Path], dict[str, str]]:
    """({name: folder} of the sets to evaluate, {name: why skipped}). A set named by the user (``explicit``) is
    required; one of a task's default list is skipped with a warning when absent; none at all is DatasetMissing
    (``what``: "BEL data set")."""
    folders: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            folders[name] = require(data_dir, entry(name))
        except DatasetMissing as err:
            if explicit:
                raise
            logger.warning("%s: skipping %s: %s", what, name, err)
            skipped[name] = str(err)
    if not folders:
        raise nothing_found(what, names, list(skipped.values()))
    return folders, skipped


def nothing_found(what: str, names: Sequence[str], messages: Sequence[str]) -> DatasetMissing:
    """The error of a task none of whose sets is present: the sets looked for and the first one's message."""
    return DatasetMissing(f"no {what} found among {', '.join(names)}" + (f": {messages[0]}" if messages else ""))


def registry_markdown(data_dir: str | os.PathLike[str] | None = None) -> str:
    """Markdown table of the registry (for the README and ``mirrorbert eval --list-data``); with ``data_dir``
    (an existing folder) a first line and a column say which sets are present there and what each one lacks."""
    root = Path(data_dir) if data_dir is not None else None
    lines = []
    if root is not None:
        present = [e.name for e in REGISTRY.values() if not _absent(root, e)]
        lines += [f"data directory {root}: {len(present)} of {len(REGISTRY)} sets present", ""]
    lines += ["| set |" + (" present |" if root is not None else "") + " folder | files | official source | licence |",
              "|---|" + ("---|" if root is not None else "") + "---|---|---|---|"]
    for e in REGISTRY.values():
        files = ", ".join(f"`{f}`" for f in e.files[:4]) + (", ..." if len(e.files) > 4 else "")
        cell = ""
        if root is not None:
            absent = _absent(root, e)
            cell = " yes |" if not absent else (
                f" no (missing {len(absent)} of {len(e.files)} files: " + ", ".join(f"`{f}`" for f in absent[:2])
                + (", ..." if len(absent) > 2 else "") + ") |")
        lines.append(f"| {e.name} |{cell} `{e.folder}` | {files} | {e.official_source} | {e.licence} |")
    return "\n".join(lines)


def _absent(root: Path, entry: DatasetInfo) -> list[str]:
    return [f for f in entry.files if not (root / entry.folder / f).is_file()]


def gold_score(value: str, path: str | os.PathLike, lineno: int,
               score_range: tuple[float, float] | None = None) -> float:
    """A gold score read from an evaluation file: a finite number inside the set's published range (when given).
    NaN, infinity, text or an out-of-range value (`-7` on a 0-5 scale) is one error naming the file and line."""
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        raise UserError(f"{path}:{lineno}: expected a numeric score, got {text[:40]!r}") from None
    if not math.isfinite(number):
        raise UserError(f"{path}:{lineno}: the gold score {text[:40]!r} is not a finite number; fix this "
                        "evaluation file")
    if score_range is not None and not score_range[0] <= number <= score_range[1]:
        raise UserError(f"{path}:{lineno}: the gold score {text[:40]!r} is outside this set's range "
                        f"[{score_range[0]:g}, {score_range[1]:g}]; fix this evaluation file")
    return number


def check_eval_files(root: str | os.PathLike, tasks: Sequence[str]) -> None:
    """Every present file of the selected tasks' sets checked for UTF-8 before any model is loaded (absent sets
    are the tasks' own business: they are reported as skipped)."""
    from mirrorbert.data.strings import check_utf8_file

    for entry in REGISTRY.values():
        if entry.folder.split("/")[0] in tasks:
            for name in entry.files:
                if (Path(root) / entry.folder / name).is_file():
                    check_utf8_file(Path(root) / entry.folder / name, "--data-dir",
                                    hint="fix or replace this evaluation file")
