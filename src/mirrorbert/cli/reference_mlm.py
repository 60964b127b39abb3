"""`python -m mirrorbert.cli.reference_mlm`: prints the model ./scripts/quickstart.sh trains from: --model when it
loads here, else the reference MLM pre-trained once, within --budget-s, on the offline corpus (mlm/reference.py).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from mirrorbert.cli.options import Parser, add_options, options_from_args
from mirrorbert.errors import UserError
from mirrorbert.mlm.reference import ReferencePlan, model_or_fallback, script_corpus_builder
from mirrorbert.reporting.heartbeat import beating
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options

PROG = "python -m mirrorbert.cli.reference_mlm"
PLAN = ReferencePlan()  # its defaults are the options' defaults, never a copy


@dataclass(kw_only=True)
class ReferenceOptions(Options):
    """The helper's options, in --help order (settings/fields.py)."""

    model: str = option("bert-base-uncased", shared="model", note="the model wanted")
    data_dir: str | None = option(None, shared="data_dir", note="corpora, WordNet, STS-B, tokenizer", required=True)
    work: str = option("runs/quickstart-reference-mlm", help="cache folder of the reference MLM")
    corpus_script: str = option("scripts/build_reference_corpus.py", help="the corpus builder script")
    architecture: str = option(PLAN.architecture, shared="architecture", note="of the reference MLM")
    budget_s: float = option(PLAN.budget_s, help="time budget of corpus + pre-training", range="(0, inf)")
    threads: int | None = option(PLAN.threads, shared="threads")


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="The quickstart's model: --model where it can be downloaded, else a "
                                           "small reference MLM pre-trained here within a time budget.")
    add_options(parser, ReferenceOptions)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = options_from_args(ReferenceOptions, build_parser().parse_args(argv))
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            datefmt="%H:%M:%S")
        logging.getLogger("mirrorbert.data.token_cache").setLevel(logging.WARNING)
        plan = ReferencePlan(architecture=args.architecture, budget_s=args.budget_s, threads=args.threads)
        with beating("preparing the quickstart's model"):  # a line at least every 30 s (corpus, calibration)
            chosen = model_or_fallback(args.model, Path(args.work), Path(args.data_dir),
                                       script_corpus_builder(Path(args.corpus_script), Path(args.data_dir)), plan,
                                       say=lambda line: print(line, file=sys.stderr, flush=True))
    except UserError as exc:
        print(f"mirrorbert: error: {exc}", file=sys.stderr)
        return 2
    print(chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
