"""`mirrorbert reproduce` command line (the logic lives in runner.py, cells.py and report.py)."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from typing import Any

from mirrorbert.cli.options import command, options_from_args
from mirrorbert.reproduce.results import ReproduceConfig


def add_reproduce_parser(subparsers: Any) -> argparse.ArgumentParser:
    return command(subparsers, "reproduce", run_reproduce, ReproduceConfig,
                   summary="run the Mirror-BERT / GR-BERT papers' experiments and write a report",
                   description="Runs the experiments of the Mirror-BERT paper (and, with --paper grbert|all, the "
                               "GR-BERT paper) that the data directory allows, for one base MLM, with the paper's "
                               "settings; writes OUTPUT/report.md, OUTPUT/results.json and PNG plots. Results are "
                               "cached per cell: a rerun computes only what is missing.")


def run_reproduce(args: argparse.Namespace) -> int:
    typed = "mirrorbert " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] \
        else "mirrorbert reproduce " + shlex.join(["--model", str(args.model), "--output", str(args.output)])
    cfg = options_from_args(ReproduceConfig, args, command=typed)
    from mirrorbert.reproduce.runner import reproduce

    if not getattr(args, "verbose", False):  # the per-cell progress lines are the output; the tasks' chatter: -v
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
