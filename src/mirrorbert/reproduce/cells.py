"""The experiments of the two papers as cells: what to train (if anything), what to evaluate, and why.

A cell is one (experiment, state) point of a paper table or figure, e.g. "sts/after" = Table 3, "+ Mirror" row.
``build_cells`` lists the cells this data directory allows and what it skips (with its needs); cells only
*describe* work (plain data, hashed for the cache); ``runner.py`` executes them.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

from mirrorbert.data.strings import read_text_lines, top_words
from mirrorbert.evaluation.datasets import BLI_PAIRS
from mirrorbert.safeguards.readback import open_text

CORPORA = "corpora"
STSB_SENTENCES = "stsbenchmark_train_10k_sents_random_sampled.txt"
QNLI_TRAIN = "qnli/train.tsv"
PAPER_STRINGS = 10_000
DATASIZES = (1_000, 5_000, 10_000, 20_000)
FREQUENCY_BUCKETS, FREQUENCY_BUCKET_SIZE = 10, 10_000
#: Drophead rates of the paper (footnote 12): 0.2 for BERT, 0.05 for RoBERTa.
DROPHEAD_RATE = {"roberta": 0.05, "xlm-roberta": 0.05}
DROPHEAD_DEFAULT = 0.2
LEXSUB_SETS = ("LS07", "LS14")
LEXSUB_POST = {"none": (), "emb+valid": ("emb", "valid")}
#: The GR-BERT cells' models: the base MLM and the two GR architectures, with their names.
GR_MODELS = ((None, "base"), ("mt", "gr-mt"), ("sc", "gr-sc"))


@dataclass
class QuickLimits:
    """--quick: a smoke test of every cell, not a result (the evaluation sets are cut too: see quick_data_dir)."""

    strings: int = 64
    steps: int = 3
    batch_size: int = 16
    eval_lines: int = 400  # lines of each evaluation file (STS, QNLI, Multi-SimLex, BLI, BEL queries)
    bel_names: int = 2000  # names of each BEL dictionary (MEDIC: bel_names // 6 lines of about six names each)
    pubtator_docs: int = 40  # abstracts of each BC5CDR PubTator file
    bli_extra_vocab: int = 500  # wordfreq words added to the BLI search space (the paper: 20k per language)
    lexsub_items: int = 20
    gr_triplets: int = 64
    datasizes: tuple[int, ...] = (32, 64)
    buckets: int = 2
    bucket_size: int = 64


@dataclass
class EvalSpec:
    """One evaluation task on the cell's model (see ``mirrorbert.evaluation``)."""

    task: str  # an evaluation task name, or "lexsub" / "finetune-sts" for the GR-BERT cells
    options: dict[str, Any] = field(default_factory=dict)
    pooling: str | None = None  # None: the saved pooling of a trained model, mean for a plain MLM
    keep: tuple[str, ...] | None = None  # metric keys to keep (None: all)
    rename: dict[str, str] = field(default_factory=dict)
    reference_base: bool = False  # pass the base MLM as the "before" model (isotropy plot)


@dataclass
class Cell:
    id: str  # "<experiment>/<state>[/<variant>]", unique
    experiment: str
    state: str  # the paper's row (before, after, no-span-mask, ...); the key into paper_numbers.json
    evaluation: EvalSpec
    train: dict[str, Any] | None = None  # TrainConfig overrides; None: evaluate the base MLM as is
    gr_arch: str | None = None  # GR-BERT cells: evaluate a GR model of this architecture (mt | sc)
    data_note: str = ""  # what the model was tuned on, for the report
    x: float | None = None  # position on a curve (data size, bucket)

    @property
    def seeded(self) -> bool:
        """Cells whose result depends on the seed run once per --seeds value."""
        return self.train is not None or self.gr_arch is not None or self.evaluation.task == "finetune-sts"

    @property
    def file_stem(self) -> str:
        return self.id.replace("/", "__")


@dataclass
class Skipped:
    experiment: str
    what: str
    needs: str


def _lines(path: Path) -> list[str]:
    return [s for s in (x.strip() for x in read_text_lines(path)) if s]


def _wordfreq_has(lang: str) -> bool:
    try:
        import wordfreq

        return bool(wordfreq.top_n_list(lang, 10))
    except (ImportError, LookupError):
        return False


def word_list_source(data_dir: Path, lang: str) -> dict[str, Any] | None:
    """Training strings for a language's word-level model: the authors' list, else wordfreq's."""
    path = data_dir / CORPORA / f"{lang}_words_top_10k.txt"
    if path.is_file():
        return {"data": str(path)}
    return {"words_top": PAPER_STRINGS, "lang": lang} if _wordfreq_has(lang) else None


def _describe(source: dict[str, Any]) -> str:
    """A word_list_source as the report names it."""
    if "data" in source:
        return f"`{Path(source['data']).name}`"
    return f"wordfreq top {source['words_top']} ({source['lang']})"


#: Evaluation folders that --quick cuts (the others, e.g. training corpora, WordNet, lexsub, are linked whole).
QUICK_CUT = ("sts", "qnli", "bel", "bli", "wordsim")


def _head_text(path: Path, quick: QuickLimits) -> str:
    """The first lines of an evaluation file (whole documents for PubTator), as --quick evaluates it."""
    with open_text(path, "--data-dir", errors="surrogateescape", newline="") as f:
        if path.name.endswith(".PubTator.txt"):
            docs, current = [], []
            for line in f:
                if line.strip():
                    current.append(line)
                elif current:
                    docs.append("".join(current) + "\n")
                    current = []
                    if len(docs) == quick.pubtator_docs:
                        break
            return "".join(docs + (["".join(current)] if current and len(docs) < quick.pubtator_docs else []))
        n = quick.eval_lines
        if path.name == "test_dictionary.txt":
            n = quick.bel_names
        elif path.name.startswith("medic"):
            n = quick.bel_names // 6
        return "".join(line for _, line in zip(range(n), f))


def quick_data_dir(data_dir: Path, dest: Path, quick: QuickLimits) -> Path:
    """A copy of the data directory with every evaluation file cut to its first lines (--quick), the other folders
    linked; a file is rewritten only when its content changes, so the cells' data fingerprints stay valid."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(data_dir.iterdir()):
        target = dest / entry.name
        if entry.name in QUICK_CUT and entry.is_dir():
            for src in sorted(p for p in entry.rglob("*") if p.is_file()):
                head = _head_text(src, quick).encode("utf-8", errors="surrogateescape")
                _write(target / src.relative_to(entry), head)
        elif not target.is_symlink() and not target.exists():
            target.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return dest


def _write_lines(path: Path, lines: list[str]) -> Path:
    return _write(path, ("\n".join(lines) + "\n").encode("utf-8"))


def _write(path: Path, data: bytes) -> Path:
    """``data`` written at ``path`` unless the file holds it already (the same content keeps the cache valid)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not _holds(path, data):
        path.write_bytes(data)
    return path


def _holds(path: Path, data: bytes) -> bool:
    """Whether the file mirrorbert wrote at `path` holds `data` (read as a regular file, never through a link)."""
    from mirrorbert.safeguards.readback import NotRegularFile, open_checked

    try:
        fd = open_checked(path, follow=False, limit=len(data))
    except NotRegularFile:
        return False
    with os.fdopen(fd, "rb") as fh:
        return fh.read(len(data) + 1) == data


def _sts_eval() -> EvalSpec:
    return EvalSpec("sts", keep=("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg", "stsb_dev"))


def _msimlex_eval(lang: str) -> EvalSpec:
    return EvalSpec("wordsim", {"sets": ["multisimlex"], "languages": [lang]}, keep=(f"msimlex_{lang}",))


def _before(exp: str, spec: EvalSpec, suffix: str = "", pooling: str = "mean") -> Cell:
    """The base model's cell of an experiment: evaluated as it is, with ``pooling``."""
    state = "before" if pooling == "mean" else f"before-{pooling}"
    return Cell(f"{exp}/{state}{suffix}", exp, state, replace(spec, pooling=pooling))


@dataclass
class _Context:
    """What every experiment's cells draw on: the data found, the quick limits, the lists being filled."""

    data_dir: Path
    derived: Path
    model_type: str
    quick: QuickLimits | None
    n_strings: int
    limit: dict[str, Any]
    stsb_file: Path
    sentence_train: dict[str, Any] | None
    en_words: dict[str, Any] | None
    word_train: dict[str, Any] | None
    cells: list[Cell] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def need_sentences(self, exp: str) -> bool:
        if self.sentence_train is None:
            self.skipped.append(Skipped(exp, "training on STS-B sentences", f"{self.stsb_file} (the authors' 10k "
                                        "STS-B training sentences, cambridgeltl/mirror-bert data/mirror_corpus)"))
        return self.sentence_train is not None

    def bel_names(self) -> Path | None:
        """A seeded sample of n_strings names from the BEL dictionaries present (UMLS itself is licensed)."""
        from mirrorbert.evaluation.bel import load_dictionary, load_medic

        names: list[str] = []
        ncbi = self.data_dir / "bel/ncbi/test_dictionary.txt"
        medic = self.data_dir / "bel/bc5cdr/medic_06Jul2012.txt"
        if ncbi.is_file():
            names += list(load_dictionary(ncbi).names)
        if medic.is_file():
            names += [name for _, concept_names in load_medic(medic) for name in concept_names]
        names = sorted(set(s.strip() for s in names if s.strip()))
        if len(names) < 2:
            return None
        random.Random(0).shuffle(names)
        return _write_lines(self.derived / f"bel_names_{self.n_strings}.txt", names[:self.n_strings])


def build_cells(
    experiments: list[str], data_dir: Path, work_dir: Path, model_type: str, quick: QuickLimits | None,
) -> tuple[list[Cell], list[Skipped]]:
    """Every cell of ``experiments`` that this data directory allows, and what it skips (with its needs)."""
    limit = {"limit": quick.strings} if quick else {}
    stsb_file = data_dir / CORPORA / STSB_SENTENCES
    en_words = word_list_source(data_dir, "en")
    ctx = _Context(
        data_dir=data_dir, derived=work_dir / "data", model_type=model_type, quick=quick,
        n_strings=quick.strings if quick else PAPER_STRINGS, limit=limit, stsb_file=stsb_file,
        sentence_train={"preset": "sentence", "data": str(stsb_file), **limit} if stsb_file.is_file() else None,
        en_words=en_words, word_train={"preset": "word", **en_words, **limit} if en_words else None,
    )
    for exp in experiments:
        EXPERIMENTS[exp][2](ctx, exp)
    ids = [c.id for c in ctx.cells]
    assert len(ids) == len(set(ids)), "cell ids must be unique"
    return ctx.cells, ctx.skipped


def _wordsim_cells(ctx: _Context, exp: str) -> None:
    from mirrorbert.evaluation.wordsim import PAPER_LANGUAGES

    for lang in ["en"] if ctx.quick else list(PAPER_LANGUAGES):
        source = word_list_source(ctx.data_dir, lang)
        if source is None:
            needs = f"{ctx.data_dir / CORPORA}/{lang}_words_top_10k.txt or a wordfreq list for {lang}"
            ctx.skipped.append(Skipped(exp, f"Multi-SimLex {lang}", needs))
            continue
        ctx.cells.append(_before(exp, _msimlex_eval(lang), f"/{lang}"))
        ctx.cells.append(Cell(f"wordsim/after/{lang}", exp, "after", _msimlex_eval(lang),
                              train={"preset": "word", **source, **ctx.limit}, data_note=_describe(source)))


def _random_strings_cells(ctx: _Context, exp: str) -> None:
    if ctx.word_train is None:
        ctx.skipped.append(Skipped(exp, "all", "an English word list"))
        return
    spec, n = _msimlex_eval("en"), ctx.n_strings
    rnd = {"preset": "word", "random_strings": n}
    ctx.cells += [
        _before(exp, spec, pooling="cls"),
        _before(exp, spec),
        Cell("random-strings/after", exp, "after", spec, train=ctx.word_train, data_note=_describe(ctx.en_words)),
        Cell("random-strings/random-strings", exp, "random-strings", spec, train=rnd,
             data_note=f"{n} random letter/digit strings"),
        Cell("random-strings/random-strings-lr5e-5", exp, "random-strings-lr5e-5", spec, train={**rnd, "lr": 5e-5},
             data_note=f"{n} random strings, lr 5e-5"),
    ]


def _sts_cells(ctx: _Context, exp: str) -> None:
    ctx.cells += [_before(exp, _sts_eval()), _before(exp, _sts_eval(), pooling="cls")]
    if ctx.need_sentences(exp):
        ctx.cells.append(Cell("sts/after", exp, "after", _sts_eval(), train=ctx.sentence_train,
                              data_note=f"`{STSB_SENTENCES}`"))


def _qnli_cells(ctx: _Context, exp: str) -> None:
    spec = EvalSpec("qnli", keep=("auc",), rename={"primary": "auc"})
    ctx.cells.append(_before(exp, spec))
    qnli_train = ctx.data_dir / QNLI_TRAIN
    if qnli_train.is_file():
        train = {"preset": "sentence", "data": str(qnli_train), "column": "sentence", "limit": ctx.n_strings}
        ctx.cells.append(Cell("qnli/after", exp, "after", spec, train=train,
                              data_note=f"{ctx.n_strings} sentences sampled from the QNLI training set"))
        return
    ctx.skipped.append(Skipped(exp, "Mirror on QNLI training sentences (the paper's setting)",
                               f"{qnli_train} (GLUE QNLI train.tsv); tuned on the STS-B sentences instead"))
    if ctx.need_sentences(exp):
        ctx.cells.append(Cell("qnli/after-stsb-sentences", exp, "after-stsb-sentences", spec, train=ctx.sentence_train,
                              data_note=f"`{STSB_SENTENCES}` (QNLI training sentences absent)"))


def _bel_cells(ctx: _Context, exp: str) -> None:
    spec = EvalSpec("bel", keep=("ncbi_acc@1", "ncbi_acc@5", "bc5cdr_acc@1", "bc5cdr_acc@5"))
    names = ctx.bel_names()
    if names is None:
        ctx.skipped.append(Skipped(exp, "all", f"{ctx.data_dir}/bel/ncbi/test_dictionary.txt or "
                                   "bel/bc5cdr/medic_06Jul2012.txt"))
        return
    ctx.cells.append(_before(exp, spec))
    ctx.cells.append(Cell("bel/after", exp, "after", spec, train={"preset": "phrase", "data": str(names)},
                          data_note=f"{ctx.n_strings} names sampled from the NCBI/MEDIC dictionaries of the BEL sets "
                                    "(the paper samples 10k UMLS names; UMLS needs a licence)"))


def _bli_cells(ctx: _Context, exp: str) -> None:
    pairs = [p for p in BLI_PAIRS if (ctx.data_dir / "bli" / p).is_dir()]
    ctx.skipped += [Skipped(exp, p, f"{ctx.data_dir}/bli/{p}/ (Glavaš et al. 2019 dictionaries)")
                    for p in BLI_PAIRS if p not in pairs]
    if not pairs:
        return
    pairs = pairs[:1] if ctx.quick else pairs
    langs = sorted({x for p in pairs for x in p.split("-")})
    per_lang = max(1, ctx.n_strings // len(langs))
    words: list[str] = []
    for lang in langs:
        src = word_list_source(ctx.data_dir, lang)
        if src is not None:
            words += _lines(Path(src["data"]))[:per_lang] if "data" in src else top_words(per_lang, lang)
    train_file = _write_lines(ctx.derived / f"bli_words_{'_'.join(langs)}_{per_lang}.txt", list(dict.fromkeys(words)))
    options: dict[str, Any] = {"pairs": pairs, **({"extra_vocab": ctx.quick.bli_extra_vocab} if ctx.quick else {})}
    spec = EvalSpec("bli", options, keep=tuple(f"{p}_acc@1" for p in pairs) + ("avg",), rename={"primary": "avg"})
    ctx.cells.append(_before(exp, spec))
    ctx.cells.append(Cell("bli/after", exp, "after", spec, train={"preset": "word", "data": str(train_file)},
                          data_note=f"the {per_lang} most frequent words of each of {', '.join(langs)} (one model)"))


def _ablation_cells(ctx: _Context, exp: str) -> None:
    if not ctx.need_sentences(exp):
        return
    drophead = DROPHEAD_RATE.get(ctx.model_type, DROPHEAD_DEFAULT)
    variants = {
        "after": {},
        "drophead": {"dropout": 0.0, "drophead": drophead},
        "no-dropout": {"dropout": 0.0},
        "no-span-mask": {"mask_span": 0},
        "no-dropout-no-span-mask": {"dropout": 0.0, "mask_span": 0},
        "controlled-dropout-no-span-mask": {"mask_span": 0, "controlled_dropout": True},
    }
    for state, change in variants.items():
        note = ", ".join(f"{k}={v}" for k, v in change.items()) or "the sentence preset"
        ctx.cells.append(Cell(f"ablation/{state}", exp, state, _sts_eval(), train={**ctx.sentence_train, **change},
                              data_note=f"`{STSB_SENTENCES}`; {note}"))


def _isotropy_cells(ctx: _Context, exp: str) -> None:
    names, n = ctx.bel_names(), ctx.n_strings
    levels: dict[str, tuple[dict[str, Any] | None, str]] = {
        "word": (ctx.word_train, "English word list"),
        "phrase": ({"preset": "phrase", "data": str(names)} if names else None, "BEL dictionary names"),
        "sentence": (ctx.sentence_train, "STS-B training sentences"),
    }
    for level, (train, what) in levels.items():
        if train is None:
            ctx.skipped.append(Skipped(exp, level, f"the {what} in the data directory"))
            continue
        # wordfreq words are written out, so that the evaluation reads the strings the model was tuned on
        texts_file = train.get("data") or str(_write_lines(ctx.derived / f"en_words_top_{n}.txt", top_words(n, "en")))
        spec = EvalSpec("isotropy", {"max_texts": n, "texts_file": texts_file}, keep=("is",),
                        rename={"is": f"is_{level}"})
        ctx.cells += [
            _before(exp, spec, f"/{level}"),
            Cell(f"isotropy/after/{level}", exp, "after", replace(spec, reference_base=level == "sentence"),
                 train=train, data_note=what),
            Cell(f"isotropy/no-aug/{level}", exp, "no-aug", spec, train={**train, "mask_span": 0, "dropout": 0.0},
                 data_note=f"{what}; no span mask, no dropout"),
        ]


def _datasize_cells(ctx: _Context, exp: str) -> None:
    sizes = ctx.quick.datasizes if ctx.quick else DATASIZES
    if ctx.en_words is not None:
        _word_datasize_cells(ctx, exp, sizes)
    if not ctx.need_sentences(exp):
        return
    available = len(_lines(ctx.stsb_file))
    for n in sizes:
        if n > available:
            ctx.skipped.append(Skipped(exp, f"sentence, {n} strings", f"more than the {available} STS-B training "
                                       "sentences (the paper samples NLI sentences)"))
            continue
        whole = n == available
        train = ctx.sentence_train if whole else {"preset": "sentence", "data": str(ctx.stsb_file), "limit": n}
        ctx.cells.append(Cell(f"datasize/sentence/{n}", exp, "sentence", _sts_eval(), train=train,
                              data_note=f"{n} STS-B training sentences", x=n))


def _word_datasize_cells(ctx: _Context, exp: str, sizes: tuple[int, ...]) -> None:
    words = ctx.en_words.get("data")
    available = len(_lines(Path(words))) if words else None
    for n in sizes:
        if available is not None and n <= available:  # the whole list: the same model as wordsim's
            src = {"data": words, **({"limit": n} if n < available else ctx.limit)}
            note = f"{n} of `{Path(words).name}`"
        elif _wordfreq_has("en"):
            src, note = {"words_top": n, "lang": "en"}, f"wordfreq top {n} (en)"
        else:
            ctx.skipped.append(Skipped(exp, f"word, {n} strings", "more English words (wordfreq)"))
            continue
        ctx.cells.append(Cell(f"datasize/word/{n}", exp, "word", _msimlex_eval("en"), train={"preset": "word", **src},
                              data_note=note, x=n))


def _frequency_cells(ctx: _Context, exp: str) -> None:
    n_buckets = ctx.quick.buckets if ctx.quick else FREQUENCY_BUCKETS
    size = ctx.quick.bucket_size if ctx.quick else FREQUENCY_BUCKET_SIZE
    try:
        ranked = top_words(n_buckets * size, "en")
    except Exception as exc:  # wordfreq missing or without the list: the figure is skipped
        ctx.skipped.append(Skipped(exp, "all", f"wordfreq's English list ({exc})"))
        return
    for b in range(n_buckets):
        bucket = ranked[b * size:(b + 1) * size]
        if len(bucket) < 2:
            ctx.skipped.append(Skipped(exp, f"bucket {b + 1}", "more wordfreq words"))
            continue
        path = _write_lines(ctx.derived / f"en_words_bucket{b + 1}_of{size}.txt", bucket)
        ctx.cells.append(Cell(f"frequency/bucket-{b + 1}", exp, "bucket", _msimlex_eval("en"),
                              train={"preset": "word", "data": str(path)}, x=b + 1,
                              data_note=f"en words ranked {b * size + 1}-{b * size + len(bucket)} by wordfreq"))


def _lexsub_cells(ctx: _Context, exp: str) -> None:
    # cheapest first (LS07, no post-processing), all three models each: a stopped run still has whole columns
    for dataset in LEXSUB_SETS:
        if not (ctx.data_dir / "lexsub" / dataset).is_dir():
            ctx.skipped.append(Skipped(exp, dataset, f"{ctx.data_dir}/lexsub/{dataset} (LexSubCon layout)"))
            continue
        for post, post_opts in LEXSUB_POST.items():
            for arch, name in GR_MODELS:
                opts = {"dataset": dataset, "post": list(post_opts), **({"limit": ctx.quick.lexsub_items}
                                                                        if ctx.quick else {})}
                ctx.cells.append(Cell(f"lexsub/{name}/{post}/{dataset}", exp, f"{name}/{post}",
                                      EvalSpec("lexsub", opts), gr_arch=arch))


def _gr_sts_cells(ctx: _Context, exp: str) -> None:
    ctx.cells += [Cell(f"gr-sts/{name}", exp, name, replace(_sts_eval(), pooling="first-last"), gr_arch=arch)
                  for arch, name in GR_MODELS]


def _gr_supervised_cells(ctx: _Context, exp: str) -> None:
    if not (ctx.data_dir / "sts/STSBenchmark").is_dir():
        ctx.skipped.append(Skipped(exp, "all", f"{ctx.data_dir}/sts/STSBenchmark"))
        return
    opts: dict[str, Any] = {"fractions": [1.0, 0.5, 0.2], **({"epochs": 1} if ctx.quick else {})}
    ctx.cells += [Cell(f"gr-supervised/{name}", exp, name, EvalSpec("finetune-sts", opts), gr_arch=arch)
                  for arch, name in GR_MODELS]


#: Experiment -> (paper table/figure, title for the report, the function that adds its cells).
EXPERIMENTS: dict[str, tuple[str, str, Callable[[_Context, str], None]]] = {
    "wordsim": ("Table 1", "Word similarity: Multi-SimLex per language", _wordsim_cells),
    "random-strings": ("Table 10", "Random-string control (en Multi-SimLex)", _random_strings_cells),
    "sts": ("Table 3", "English sentence similarity (STS)", _sts_cells),
    "qnli": ("Figure 4", "Question-answer entailment (QNLI dev, unsupervised AUC)", _qnli_cells),
    "bel": ("Table 2", "Biomedical entity linking", _bel_cells),
    "bli": ("Table 6", "Bilingual lexicon induction", _bli_cells),
    "ablation": ("Tables 3, 7, 8", "Ablations: span masking, dropout, drophead, controlled dropout (STS)",
                 _ablation_cells),
    "isotropy": ("Table 9 / Figure 7", "Isotropy of the fine-tuning strings", _isotropy_cells),
    "datasize": ("Figure 5", "Training-data size", _datasize_cells),
    "frequency": ("Figure 8", "Word-frequency buckets (en Multi-SimLex)", _frequency_cells),
    "lexsub": ("GR-BERT", "Lexical substitution: base MLM vs GR-MT vs GR-SC", _lexsub_cells),
    "gr-sts": ("GR-BERT", "Unsupervised STS, first-last pooling, before/after GR", _gr_sts_cells),
    "gr-supervised": ("GR-BERT", "Supervised STS-B fine-tuning with 100/50/20% of the training pairs",
                      _gr_supervised_cells),
}
GRBERT_EXPERIMENTS = tuple(exp for exp, (table, _, _) in EXPERIMENTS.items() if table == "GR-BERT")
MIRROR_EXPERIMENTS = tuple(exp for exp in EXPERIMENTS if exp not in GRBERT_EXPERIMENTS)
PAPERS = {"mirror": MIRROR_EXPERIMENTS, "grbert": GRBERT_EXPERIMENTS, "all": tuple(EXPERIMENTS)}
