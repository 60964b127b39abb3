"""`mirrorbert reproduce` command line (the logic lives in runner.py, cells.py and report.py)."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from typing import Any

from mirrorbert.cli import options
from mirrorbert.cli.options import use
from mirrorbert.errors import UserError
from mirrorbert.reproduce.cells import PAPERS


def add_reproduce_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "reproduce", help="run the Mirror-BERT / GR-BERT papers' experiments and write a report",
        description="Runs the experiments of the Mirror-BERT paper (and, with --paper grbert|all, the GR-BERT "
                    "paper) that the data directory allows, for one base MLM, with the paper's settings; writes "
                    "OUTPUT/report.md, OUTPUT/results.json and PNG plots. Results are cached per cell: a rerun "
                    "computes only what is missing.",
    )
    options.add(p, use("model", required=True, note="the base masked LM"),
                use("output", required=True, note="a folder for report.md, results.json, plots/, cells/ (the cache)"),
                use("data_dir", note="evaluation and training data"))
    p.add_argument("--paper", default="mirror", choices=sorted(PAPERS), help="which paper's experiments (default mirror)")
    p.add_argument("--experiments", help="comma list of experiments (default: all of --paper): "
                                         + ", ".join(PAPERS["all"]))
    options.add(p, "seeds")
    p.add_argument("--quick", action="store_true", help="smoke test: few strings, few steps, small evaluation limits")
    p.add_argument("--train-option", action="append", default=[], metavar="KEY=VALUE",
                   help="override a `mirrorbert train` option in every Mirror cell, e.g. lr=5e-5 (repeatable; default none)")
    p.add_argument("--gr-option", action="append", default=[], metavar="KEY=VALUE",
                   help="override a `mirrorbert gloss-pretrain` option of the GR-BERT models, e.g. epochs=1 "
                        "(repeatable; default none: gloss-pretrain's defaults)")
    options.add(p, "device", "eval_batch_size", use("no_progress", note="no progress of the cells' training"))
    p.add_argument("--report-only", action="store_true",
                   help="compute nothing: write the report from the cells already cached in OUTPUT, listing the "
                        "others as not run (e.g. while a long run is still going, or after stopping one)")
    options.add(p, use("overwrite", note="discard what an earlier run left in OUTPUT (its cache included) and start "
                                         "over; default: continue an earlier reproduce run in OUTPUT"))
    p.add_argument("--keep-models", action="store_true", help="keep the trained models in OUTPUT/models (default: "
                                                              "delete each once its cells are done)")
    p.set_defaults(func=run_reproduce)
    return p


def _parse_value(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_options(items: list[str], flag: str = "--train-option") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{flag} {item!r}: expected KEY=VALUE, e.g. lr=5e-5")
        out[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return out


def run_reproduce(args: argparse.Namespace) -> int:
    from mirrorbert.reproduce.runner import ReproduceConfig, reproduce

    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    except ValueError:
        raise UserError(f"--seeds {args.seeds!r}: expected a comma list of integers, e.g. 0,1,2") from None
    experiments = [e.strip() for e in args.experiments.split(",") if e.strip()] if args.experiments else None
    cfg = ReproduceConfig(
        model=args.model, output=args.output, data_dir=args.data_dir, paper=args.paper, experiments=experiments,
        seeds=seeds, quick=args.quick, device=args.device, eval_batch_size=args.eval_batch_size,
        train_options=parse_options(args.train_option), gr_options=parse_options(args.gr_option, "--gr-option"),
        keep_models=args.keep_models, report_only=args.report_only, overwrite=args.overwrite,
        trust_remote_code=getattr(args, "trust_remote_code", False), show_progress=args.show_progress,
        command="mirrorbert " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["reproduce"]
        else "mirrorbert reproduce " + shlex.join(["--model", args.model, "--output", args.output]),
    )
    if not args.verbose:  # the per-cell progress lines are the output; the tasks' own chatter is for -v
        for name in ("mirrorbert.evaluation", "mirrorbert.mirror.train", "mirrorbert.gloss", "mirrorbert.data.strings"):
            logging.getLogger(name).setLevel(logging.WARNING)
    result = reproduce(cfg, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"report: {result.report}")
    print(f"results: {result.report.with_name('results.json')}")
    if result.failed:  # reported, not cached: a rerun tries these cells again
        for r in result.failed:
            seed = "" if r.seed is None else f" seed {r.seed}"
            print(f"mirrorbert: error: cell {r.cell}{seed} failed: {r.message}", file=sys.stderr)
        print(f"mirrorbert: {len(result.failed)} of {len(result.results)} cells failed (see {result.report}); "
              "rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0
