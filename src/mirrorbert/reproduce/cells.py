"""The experiments of the two papers as cells: what to train (if anything), what to evaluate, and why.

A cell is one (experiment, state) point of a paper table or figure, e.g. "sts/after" = Table 3,
"+ Mirror" row. ``build_cells`` turns the configuration and the data directory into the list of
cells that can run here, plus the parts that cannot, each with what it needs. Cells only
*describe* work (plain dicts, hashable for the cache); ``runner.py`` executes them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mirrorbert.safeguards.readback import open_text

MIRROR_EXPERIMENTS = ("wordsim", "random-strings", "sts", "qnli", "bel", "bli", "ablation", "isotropy",
                      "datasize", "frequency")
GRBERT_EXPERIMENTS = ("lexsub", "gr-sts", "gr-supervised")
PAPERS = {"mirror": MIRROR_EXPERIMENTS, "grbert": GRBERT_EXPERIMENTS, "all": MIRROR_EXPERIMENTS + GRBERT_EXPERIMENTS}

#: Experiment -> (paper table/figure, title) for the report.
EXPERIMENT_INFO: dict[str, tuple[str, str]] = {
    "wordsim": ("Table 1", "Word similarity: Multi-SimLex per language"),
    "random-strings": ("Table 10", "Random-string control (en Multi-SimLex)"),
    "sts": ("Table 3", "English sentence similarity (STS)"),
    "qnli": ("Figure 4", "Question-answer entailment (QNLI dev, unsupervised AUC)"),
    "bel": ("Table 2", "Biomedical entity linking"),
    "bli": ("Table 6", "Bilingual lexicon induction"),
    "ablation": ("Tables 3, 7, 8", "Ablations: span masking, dropout, drophead, controlled dropout (STS)"),
    "isotropy": ("Table 9 / Figure 7", "Isotropy of the fine-tuning strings"),
    "datasize": ("Figure 5", "Training-data size"),
    "frequency": ("Figure 8", "Word-frequency buckets (en Multi-SimLex)"),
    "lexsub": ("GR-BERT", "Lexical substitution: base MLM vs GR-MT vs GR-SC"),
    "gr-sts": ("GR-BERT", "Unsupervised STS, first-last pooling, before/after GR"),
    "gr-supervised": ("GR-BERT", "Supervised STS-B fine-tuning with 100/50/20% of the training pairs"),
}

CORPORA = "corpora"
STSB_SENTENCES = "stsbenchmark_train_10k_sents_random_sampled.txt"
QNLI_TRAIN = "qnli/train.tsv"
PAPER_STRINGS = 10_000
DATASIZES = (1_000, 5_000, 10_000, 20_000)
FREQUENCY_BUCKETS, FREQUENCY_BUCKET_SIZE = 10, 10_000
#: Drophead rates of the paper (footnote 12): 0.2 for BERT, 0.05 for RoBERTa.
DROPHEAD_RATE = {"roberta": 0.05, "xlm-roberta": 0.05}
DROPHEAD_DEFAULT = 0.2
BLI_PAIRS = ("en-fr", "en-it", "en-ru", "en-tr", "it-fr", "ru-fr")
LEXSUB_SETS = ("LS07", "LS14")
LEXSUB_POST = {"none": (), "emb+valid": ("emb", "valid")}


@dataclass
class QuickLimits:
    """--quick: a smoke test of every cell, not a result (the evaluation sets are cut too: see quick_data_dir)."""

    strings: int = 64
    steps: int = 3
    batch_size: int = 16
    eval_lines: int = 400  # lines of each evaluation file (STS, QNLI, Multi-SimLex, BLI, BEL queries)
    bel_names: int = 2000  # names of each BEL dictionary (NCBI: 81,820 lines of one name; MEDIC: 11,915 concepts
    #                        of about six names each, so bel_names // 6 of its lines)
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

    def spec(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def file_stem(self) -> str:
        return self.id.replace("/", "__")


@dataclass
class Skipped:
    experiment: str
    what: str
    needs: str


def _lines(path: Path) -> list[str]:
    with open_text(path, "--data-dir") as fh:
        return [s for s in (x.strip() for x in fh.read().splitlines()) if s]


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
    if "data" in source:
        return f"`{Path(source['data']).name}`"
    if "words_top" in source:
        return f"wordfreq top {source['words_top']} ({source.get('lang', 'en')})"
    return f"{source.get('random_strings')} random strings"


def bel_names(data_dir: Path, out: Path, n: int, seed: int = 0) -> Path | None:
    """A seeded sample of n names from the BEL dictionaries present (UMLS itself is licensed)."""
    from mirrorbert.evaluation.bel import load_dictionary, load_medic

    names: list[str] = []
    ncbi = data_dir / "bel/ncbi/test_dictionary.txt"
    medic = data_dir / "bel/bc5cdr/medic_06Jul2012.txt"
    if ncbi.is_file():
        names += list(load_dictionary(ncbi).names)
    if medic.is_file():
        names += [name for _, concept_names in load_medic(medic) for name in concept_names]
    names = sorted(set(s.strip() for s in names if s.strip()))
    if len(names) < 2:
        return None
    random.Random(seed).shuffle(names)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(names[:n]) + "\n", encoding="utf-8")
    return out


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
    """A copy of the data directory with every evaluation file cut to its first lines (--quick).

    The evaluation code runs unchanged on it; the other folders are symbolic links to the originals.
    Files are rewritten only when their content changes, so the cells' data fingerprints stay valid.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(data_dir.iterdir()):
        target = dest / entry.name
        if entry.name in QUICK_CUT and entry.is_dir():
            for src in sorted(p for p in entry.rglob("*") if p.is_file()):
                out = target / src.relative_to(entry)
                text = _head_text(src, quick)
                out.parent.mkdir(parents=True, exist_ok=True)
                data = text.encode("utf-8", errors="surrogateescape")
                if not out.is_file() or out.read_bytes() != data:
                    out.write_bytes(data)
        elif not target.is_symlink() and not target.exists():
            target.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return dest


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # same content keeps the cache valid
        path.write_text(text, encoding="utf-8")
    return path


def _sts_eval(max_texts: int | None = None) -> EvalSpec:
    return EvalSpec("sts", keep=("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg", "stsb_dev"))


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
            self.skipped.append(Skipped(exp, "training on STS-B sentences", f"{self.stsb_file} (the authors' 10k STS-B training sentences, cambridgeltl/mirror-bert data/mirror_corpus)"))
        return self.sentence_train is not None


def build_cells(
    experiments: list[str], data_dir: Path, work_dir: Path, model_type: str, quick: QuickLimits | None,
) -> tuple[list[Cell], list[Skipped]]:
    """Every cell of ``experiments`` that this data directory allows, and what it skips (with its needs)."""
    n_strings = quick.strings if quick else PAPER_STRINGS
    limit = {"limit": quick.strings} if quick else {}
    stsb_file = data_dir / CORPORA / STSB_SENTENCES
    en_words = word_list_source(data_dir, "en")
    ctx = _Context(
        data_dir=data_dir, derived=work_dir / "data", model_type=model_type, quick=quick, n_strings=n_strings,
        limit=limit, stsb_file=stsb_file,
        sentence_train={"preset": "sentence", "data": str(stsb_file), **limit} if stsb_file.is_file() else None,
        en_words=en_words, word_train={"preset": "word", **en_words, **limit} if en_words else None,
    )
    for exp in experiments:
        if exp not in EXPERIMENT_CELLS:  # a caller's bug: the command line refuses unknown experiments first
            raise ValueError(f"unknown experiment {exp}")
        EXPERIMENT_CELLS[exp](ctx, exp)
    ids = [c.id for c in ctx.cells]
    assert len(ids) == len(set(ids)), "cell ids must be unique"
    return ctx.cells, ctx.skipped


def _wordsim_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, quick, data_dir, limit = (ctx.cells, ctx.skipped, ctx.quick, ctx.data_dir, ctx.limit)
    from mirrorbert.evaluation.wordsim import PAPER_LANGUAGES

    langs = ["en"] if quick else list(PAPER_LANGUAGES)
    for lang in langs:
        source = word_list_source(data_dir, lang)
        if source is None:
            skipped.append(Skipped(exp, f"Multi-SimLex {lang}", f"{data_dir / CORPORA}/{lang}_words_top_10k.txt or a wordfreq list for {lang}"))
            continue
        spec = EvalSpec("wordsim", {"sets": ["multisimlex"], "languages": [lang]}, keep=(f"msimlex_{lang}",))
        cells.append(Cell(f"wordsim/before/{lang}", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
        cells.append(Cell(f"wordsim/after/{lang}", exp, "after", spec, train={"preset": "word", **source, **limit},
                          data_note=_describe(source)))


def _random_strings_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, n_strings, en_words, word_train = (
        ctx.cells, ctx.skipped, ctx.n_strings, ctx.en_words, ctx.word_train)
    if word_train is None:
        skipped.append(Skipped(exp, "all", "an English word list"))
        return
    spec = EvalSpec("wordsim", {"sets": ["multisimlex"], "languages": ["en"]}, keep=("msimlex_en",))
    cells.append(Cell("random-strings/before-cls", exp, "before-cls", EvalSpec(**{**asdict(spec), "pooling": "cls"})))
    cells.append(Cell("random-strings/before", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
    cells.append(Cell("random-strings/after", exp, "after", spec, train=word_train, data_note=_describe(en_words)))
    rnd = {"preset": "word", "random_strings": n_strings}
    cells.append(Cell("random-strings/random-strings", exp, "random-strings", spec, train=rnd,
                      data_note=f"{n_strings} random letter/digit strings"))
    cells.append(Cell("random-strings/random-strings-lr5e-5", exp, "random-strings-lr5e-5", spec,
                      train={**rnd, "lr": 5e-5}, data_note=f"{n_strings} random strings, lr 5e-5"))


def _sts_cells(ctx: "_Context", exp: str) -> None:
    cells, sentence_train, need_sentences = (ctx.cells, ctx.sentence_train, ctx.need_sentences)
    spec = _sts_eval()
    cells.append(Cell("sts/before", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
    cells.append(Cell("sts/before-cls", exp, "before-cls", EvalSpec(**{**asdict(spec), "pooling": "cls"})))
    if need_sentences(exp):
        cells.append(Cell("sts/after", exp, "after", spec, train=sentence_train, data_note=f"`{STSB_SENTENCES}`"))


def _qnli_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, data_dir, n_strings, sentence_train, need_sentences = (
        ctx.cells, ctx.skipped, ctx.data_dir, ctx.n_strings, ctx.sentence_train, ctx.need_sentences)
    spec = EvalSpec("qnli", keep=("auc",), rename={"primary": "auc"})
    cells.append(Cell("qnli/before", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
    qnli_train = data_dir / QNLI_TRAIN
    if qnli_train.is_file():
        cells.append(Cell("qnli/after", exp, "after", spec,
                          train={"preset": "sentence", "data": str(qnli_train), "column": "sentence", "limit": n_strings},
                          data_note=f"{n_strings} sentences sampled from the QNLI training set"))
    else:
        skipped.append(Skipped(exp, "Mirror on QNLI training sentences (the paper's setting)",
                               f"{qnli_train} (GLUE QNLI train.tsv); tuned on the STS-B sentences instead"))
        if need_sentences(exp):
            cells.append(Cell("qnli/after-stsb-sentences", exp, "after-stsb-sentences", spec, train=sentence_train,
                              data_note=f"`{STSB_SENTENCES}` (QNLI training sentences absent)"))


def _bel_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, data_dir, derived, n_strings = (ctx.cells, ctx.skipped, ctx.data_dir, ctx.derived, ctx.n_strings)
    spec = EvalSpec("bel", keep=("ncbi_acc@1", "ncbi_acc@5", "bc5cdr_acc@1", "bc5cdr_acc@5"))
    names = bel_names(data_dir, derived / f"bel_names_{n_strings}.txt", n_strings)
    if names is None:
        skipped.append(Skipped(exp, "all", f"{data_dir}/bel/ncbi/test_dictionary.txt or bel/bc5cdr/medic_06Jul2012.txt"))
        return
    cells.append(Cell("bel/before", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
    cells.append(Cell("bel/after", exp, "after", spec, train={"preset": "phrase", "data": str(names)},
                      data_note=f"{n_strings} names sampled from the NCBI/MEDIC dictionaries of the BEL sets "
                                "(the paper samples 10k UMLS names; UMLS needs a licence)"))


def _bli_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, quick, data_dir, derived, n_strings = (
        ctx.cells, ctx.skipped, ctx.quick, ctx.data_dir, ctx.derived, ctx.n_strings)
    pairs = [p for p in BLI_PAIRS if (data_dir / "bli" / p).is_dir()]
    for p in BLI_PAIRS:
        if p not in pairs:
            skipped.append(Skipped(exp, p, f"{data_dir}/bli/{p}/ (Glavaš et al. 2019 dictionaries)"))
    if not pairs:
        return
    if quick:
        pairs = pairs[:1]
    langs = sorted({x for p in pairs for x in p.split("-")})
    words: list[str] = []
    per_lang = max(1, n_strings // len(langs))
    for lang in langs:
        src = word_list_source(data_dir, lang)
        if src is None:
            continue
        if "data" in src:
            words += _lines(Path(src["data"]))[:per_lang]
        else:
            from mirrorbert.data.strings import top_words

            words += top_words(per_lang, lang)
    train_file = _write_lines(derived / f"bli_words_{'_'.join(langs)}_{per_lang}.txt", list(dict.fromkeys(words)))
    bli_opts: dict[str, Any] = {"pairs": pairs, **({"extra_vocab": quick.bli_extra_vocab} if quick else {})}
    spec = EvalSpec("bli", bli_opts, keep=tuple(f"{p}_acc@1" for p in pairs) + ("avg",),
                    rename={"primary": "avg"})
    cells.append(Cell("bli/before", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
    cells.append(Cell("bli/after", exp, "after", spec, train={"preset": "word", "data": str(train_file)},
                      data_note=f"the {per_lang} most frequent words of each of {', '.join(langs)} (one model)"))


def _ablation_cells(ctx: "_Context", exp: str) -> None:
    cells, sentence_train, need_sentences, model_type = (
        ctx.cells, ctx.sentence_train, ctx.need_sentences, ctx.model_type)
    if not need_sentences(exp):
        return
    spec = _sts_eval()
    drophead = DROPHEAD_RATE.get(model_type, DROPHEAD_DEFAULT)
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
        cells.append(Cell(f"ablation/{state}", exp, state, spec, train={**sentence_train, **change},
                          data_note=f"`{STSB_SENTENCES}`; {note}"))


def _isotropy_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, data_dir, derived, n_strings, sentence_train, word_train = (
        ctx.cells, ctx.skipped, ctx.data_dir, ctx.derived, ctx.n_strings, ctx.sentence_train, ctx.word_train)
    levels: dict[str, tuple[dict[str, Any] | None, str]] = {"word": (word_train, "English word list")}
    names = bel_names(data_dir, derived / f"bel_names_{n_strings}.txt", n_strings)
    levels["phrase"] = ({"preset": "phrase", "data": str(names)} if names else None, "BEL dictionary names")
    levels["sentence"] = (sentence_train, "STS-B training sentences")
    for level, (train, what) in levels.items():
        if train is None:
            skipped.append(Skipped(exp, level, f"the {what} in the data directory"))
            continue
        texts_file = train.get("data")
        opts: dict[str, Any] = {"max_texts": n_strings}
        if texts_file:
            opts["texts_file"] = texts_file
        else:  # wordfreq words: written out so that the evaluation reads the same strings
            from mirrorbert.data.strings import top_words

            opts["texts_file"] = str(_write_lines(derived / f"en_words_top_{n_strings}.txt", top_words(n_strings, "en")))
        spec = EvalSpec("isotropy", opts, keep=("is",), rename={"is": f"is_{level}"})
        plot = EvalSpec(**{**asdict(spec), "reference_base": level == "sentence"})
        cells.append(Cell(f"isotropy/before/{level}", exp, "before", EvalSpec(**{**asdict(spec), "pooling": "mean"})))
        cells.append(Cell(f"isotropy/after/{level}", exp, "after", plot, train=train, data_note=what))
        cells.append(Cell(f"isotropy/no-aug/{level}", exp, "no-aug", spec,
                          train={**train, "mask_span": 0, "dropout": 0.0}, data_note=f"{what}; no span mask, no dropout"))


def _datasize_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, quick, limit, stsb_file, sentence_train, en_words, need_sentences = (
        ctx.cells, ctx.skipped, ctx.quick, ctx.limit, ctx.stsb_file, ctx.sentence_train, ctx.en_words, ctx.need_sentences)
    sizes = quick.datasizes if quick else DATASIZES
    if en_words is not None:
        available = len(_lines(Path(en_words["data"]))) if "data" in en_words else None
        spec = EvalSpec("wordsim", {"sets": ["multisimlex"], "languages": ["en"]}, keep=("msimlex_en",))
        for n in sizes:
            if available is not None and n <= available:  # the whole list: the same model as wordsim's
                src = {"data": en_words["data"], **({"limit": n} if n < available else limit)}
                note = f"{n} of `{Path(en_words['data']).name}`"
            elif _wordfreq_has("en"):
                src, note = {"words_top": n, "lang": "en"}, f"wordfreq top {n} (en)"
            else:
                skipped.append(Skipped(exp, f"word, {n} strings", "more English words (wordfreq)"))
                continue
            cells.append(Cell(f"datasize/word/{n}", exp, "word", spec, train={"preset": "word", **src},
                              data_note=note, x=n))
    if stsb_file.is_file():
        available = len(_lines(stsb_file))
        for n in sizes:
            if n > available:
                skipped.append(Skipped(exp, f"sentence, {n} strings",
                                       f"more than the {available} STS-B training sentences (the paper samples NLI sentences)"))
                continue
            cells.append(Cell(f"datasize/sentence/{n}", exp, "sentence", _sts_eval(),
                              train=sentence_train if n == available else
                              {"preset": "sentence", "data": str(stsb_file), "limit": n},
                              data_note=f"{n} STS-B training sentences", x=n))
    else:
        need_sentences(exp)


def _frequency_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, quick, derived = (ctx.cells, ctx.skipped, ctx.quick, ctx.derived)
    n_buckets = quick.buckets if quick else FREQUENCY_BUCKETS
    size = quick.bucket_size if quick else FREQUENCY_BUCKET_SIZE
    try:
        from mirrorbert.data.strings import top_words

        ranked = top_words(n_buckets * size, "en")
    except Exception as exc:  # wordfreq missing or without the list: the figure is skipped
        skipped.append(Skipped(exp, "all", f"wordfreq's English list ({exc})"))
        return
    spec = EvalSpec("wordsim", {"sets": ["multisimlex"], "languages": ["en"]}, keep=("msimlex_en",))
    for b in range(n_buckets):
        bucket = ranked[b * size:(b + 1) * size]
        if len(bucket) < 2:
            skipped.append(Skipped(exp, f"bucket {b + 1}", "more wordfreq words"))
            continue
        path = _write_lines(derived / f"en_words_bucket{b + 1}_of{size}.txt", bucket)
        cells.append(Cell(f"frequency/bucket-{b + 1}", exp, "bucket", spec, train={"preset": "word", "data": str(path)},
                          data_note=f"en words ranked {b * size + 1}-{b * size + len(bucket)} by wordfreq", x=b + 1))


def _lexsub_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, quick, data_dir = (ctx.cells, ctx.skipped, ctx.quick, ctx.data_dir)
    # The cheap comparisons first (LS07 before the 6x larger CoInCo, no post-processing before the
    # costly candidate validation), all three models each: a stopped run still has whole columns.
    for dataset in LEXSUB_SETS:
        if not (data_dir / "lexsub" / dataset).is_dir():
            skipped.append(Skipped(exp, dataset, f"{data_dir}/lexsub/{dataset} (LexSubCon layout)"))
            continue
        for post, post_opts in LEXSUB_POST.items():
            for arch in (None, "mt", "sc"):
                name = "base" if arch is None else f"gr-{arch}"
                opts = {"dataset": dataset, "post": list(post_opts)}
                if quick:
                    opts["limit"] = quick.lexsub_items
                cells.append(Cell(f"lexsub/{name}/{post}/{dataset}", exp, f"{name}/{post}",
                                  EvalSpec("lexsub", opts), gr_arch=arch))


def _gr_sts_cells(ctx: "_Context", exp: str) -> None:
    cells = ctx.cells
    for arch in (None, "mt", "sc"):
        name = "base" if arch is None else f"gr-{arch}"
        cells.append(Cell(f"gr-sts/{name}", exp, name, EvalSpec(**{**asdict(_sts_eval()), "pooling": "first-last"}),
                          gr_arch=arch))


def _gr_supervised_cells(ctx: "_Context", exp: str) -> None:
    cells, skipped, quick, data_dir = (ctx.cells, ctx.skipped, ctx.quick, ctx.data_dir)
    if not (data_dir / "sts/STSBenchmark").is_dir():
        skipped.append(Skipped(exp, "all", f"{data_dir}/sts/STSBenchmark"))
        return
    for arch in (None, "mt", "sc"):
        name = "base" if arch is None else f"gr-{arch}"
        opts: dict[str, Any] = {"fractions": [1.0, 0.5, 0.2]}
        if quick:
            opts.update(epochs=1)
        cells.append(Cell(f"gr-supervised/{name}", exp, name, EvalSpec("finetune-sts", opts), gr_arch=arch))


EXPERIMENT_CELLS = {
    "wordsim": _wordsim_cells,
    "random-strings": _random_strings_cells,
    "sts": _sts_cells,
    "qnli": _qnli_cells,
    "bel": _bel_cells,
    "bli": _bli_cells,
    "ablation": _ablation_cells,
    "isotropy": _isotropy_cells,
    "datasize": _datasize_cells,
    "frequency": _frequency_cells,
    "lexsub": _lexsub_cells,
    "gr-sts": _gr_sts_cells,
    "gr-supervised": _gr_supervised_cells,
}
