"""`python -m mirrorbert.cli.reference_mlm`: the quickstart's model, or its offline fallback (mlm/reference.py).

Prints the model ./scripts/quickstart.sh should train from: --model when it can be loaded here, else the
reference MLM pre-trained (once, within --budget-s) on the offline corpus. A helper of the quickstart rather
than a `mirrorbert` command, it still takes its shared options from `options.py`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mirrorbert.cli import options
from mirrorbert.cli.options import use
from mirrorbert.errors import UserError
from mirrorbert.mlm.reference import ReferencePlan, model_or_fallback, script_corpus_builder

PROG = "python -m mirrorbert.cli.reference_mlm"


def build_parser() -> argparse.ArgumentParser:
    plan = ReferencePlan()
    p = argparse.ArgumentParser(prog=PROG, description="The quickstart's model: --model where it can be "
                                "downloaded, else a small reference MLM pre-trained here within a time budget.")
    options.add(p, use("model", default="bert-base-uncased", note="the model wanted"),
                use("data_dir", required=True, note="corpora, WordNet, STS-B, tokenizer"))
    p.add_argument("--work", default="runs/quickstart-reference-mlm", help="cache folder of the reference MLM")
    p.add_argument("--corpus-script", default="scripts/build_reference_corpus.py", help="the corpus builder script")
    defaults = {"architecture": plan.architecture, "threads": plan.threads}  # ReferencePlan's, never a copy
    options.add(p, use("architecture", note="of the reference MLM"), defaults=defaults)
    p.add_argument("--budget-s", type=float, default=plan.budget_s, help="time budget of corpus + pre-training")
    options.add(p, "threads", defaults=defaults)
    options.state_defaults(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("mirrorbert.mlm.corpus").setLevel(logging.WARNING)
    plan = ReferencePlan(architecture=args.architecture, budget_s=args.budget_s, threads=args.threads)
    try:
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
