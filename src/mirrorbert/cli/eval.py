"""The ``mirrorbert eval`` subcommand: run the evaluation suite on one model from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from mirrorbert.cli import options
from mirrorbert.cli.options import use
from mirrorbert.errors import UserError
from mirrorbert.settings.choices import POOLINGS

logger = logging.getLogger(__name__)

def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``eval`` on an argparse subparsers object; the parser's ``func`` default is ``run_eval``."""
    from mirrorbert.evaluation.runner import DEFAULT_TASKS, TASKS

    p = subparsers.add_parser(
        "eval",
        help="evaluate an encoder on the paper's benchmarks (STS, word similarity, BEL, QNLI, BLI, isotropy)",
        description="Evaluate a model (a folder this project trained, a plain Hugging Face masked LM, any "
        "sentence-transformers model, or 'glove' for static GloVe vectors) on the Mirror-BERT paper's "
        "benchmarks. Scores print x100 with two decimals; sets absent from the data directory are skipped.",
    )
    options.add(p, use("model", note="'glove' (or 'glove:DIR') for the GloVe 50d baseline"))
    p.add_argument(
        "--tasks",
        default=",".join(DEFAULT_TASKS),
        help=f"comma-separated tasks among {', '.join(TASKS)} (default: all)",
    )
    options.add(p, use("data_dir", note="the evaluation sets"), use("output", note="all metrics as a JSON file"))
    p.add_argument("--report", help="write a Markdown report (with PNG plots beside it) to this file")
    options.add(p, use("overwrite", note="also --report and its plot folder"))
    p.add_argument("--plot-dir", help="folder for PNG plots (default: <report stem>_files next to --report)")
    options.add(p, use("batch_size", note="strings per forward pass"), use("pooling", choices=POOLINGS), "device",
                "max_length")
    p.add_argument(
        "--backend",
        choices=("auto", "sentence-transformers"),
        default="auto",
        help="auto: mirrorbert's Encoder (reads HF and sentence-transformers folders); "
        "sentence-transformers: run the model through SentenceTransformer.encode",
    )
    p.add_argument(
        "--reference-model",
        help="the 'before' model (e.g. the MLM before Mirror tuning) for the isotropy before/after plot",
    )
    p.add_argument("--reference-pooling", choices=POOLINGS, help="pooling of --reference-model")
    p.add_argument("--sts-sets", help="comma-separated STS sets (default: sts12..sts16, stsb, sickr, sts-es/ar/ru)")
    p.add_argument("--wordsim-languages", help="Multi-SimLex languages, e.g. en,fr,et,ar,zh,ru,es,pl (default: all)")
    p.add_argument("--xling-pairs", help="cross-lingual Multi-SimLex pairs, e.g. en-fr,en-ru")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="TASK.KEY=VALUE",
        help="extra keyword argument of a task (VALUE parsed as JSON when possible); repeatable, "
        "e.g. --option bel.predictions_path=preds.jsonl --option sts.include_dev=false",
    )
    options.add(p, "packing", use("no_progress", dest="progress"))
    p.add_argument("--progress", dest="progress", action="store_true", help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--list-data", action="store_true", help="print the data registry (files, sources, and which sets the data directory holds) and exit")
    p.set_defaults(func=run_eval)
    return p


def _parse_option(text: str) -> tuple[str, str, Any]:
    key, sep, raw = text.partition("=")
    task, dot, name = key.partition(".")
    if not sep or not dot or not task or not name:
        raise UserError(f"--option {text!r}: expected TASK.KEY=VALUE, e.g. sts.include_dev=false")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return task.strip(), name.strip().replace("-", "_"), value


def run_eval(args: argparse.Namespace) -> int:
    """Run the evaluation described by parsed ``eval`` arguments; 0 if no task failed, 1 otherwise."""
    from mirrorbert.evaluation import datasets
    from mirrorbert.evaluation.runner import check_eval_data, check_task_options, parse_tasks

    if getattr(args, "list_data", False):  # with a data directory (--data-dir or MIRRORBERT_DATA): what is there
        root = None
        if getattr(args, "data_dir", None) or os.environ.get(datasets.ENV_VAR):
            root = datasets.resolve_data_dir(getattr(args, "data_dir", None))  # one named but absent: an error
        else:
            logger.warning("no data directory (--data-dir or %s): which sets are present is not shown",
                           datasets.ENV_VAR)
        print(datasets.registry_markdown(root))
        return 0
    if not args.model:
        raise UserError("eval: --model is required (a model folder, a hub id, or 'glove')")
    tasks = parse_tasks(args.tasks)
    from mirrorbert.cli.typed_options import EvalOptions
    from mirrorbert.runtime.device import check_device_and_precision

    EvalOptions(  # every value checked once, as `EvalOptions(...)` checks it in Python
        model=args.model, tasks=tasks, data_dir=args.data_dir, output=args.output, report=args.report,
        overwrite=args.overwrite, plot_dir=args.plot_dir, batch_size=args.batch_size, pooling=args.pooling,
        reference_pooling=args.reference_pooling, device=args.device, max_length=args.max_length,
        backend=args.backend, packing=args.packing, show_progress=args.progress,
        trust_remote_code=getattr(args, "trust_remote_code", False))
    check_device_and_precision(args.device)
    data_dir = datasets.resolve_data_dir(args.data_dir)
    options: dict[str, dict[str, Any]] = {}
    for text in args.option:
        task, key, value = _parse_option(text)
        options.setdefault(task, {})[key] = value
    if args.sts_sets:
        options.setdefault("sts", {})["sets"] = [s.strip() for s in args.sts_sets.split(",") if s.strip()]
    if args.wordsim_languages:
        options.setdefault("wordsim", {})["languages"] = [s.strip() for s in args.wordsim_languages.split(",") if s.strip()]
    if args.xling_pairs:
        options.setdefault("wordsim", {})["cross_lingual"] = args.xling_pairs
    check_task_options(options)  # before any model is loaded
    check_eval_data(data_dir, tasks)
    with _write_plan(args, data_dir, options).locked():
        return _run_eval(args, tasks, data_dir, options)


def _write_plan(args: argparse.Namespace, data_dir: Path, options: dict[str, dict[str, Any]]):
    """Every path `eval` writes (JSON, report, plot folder, BEL predictions), under the write policy."""
    from mirrorbert.evaluation.baselines import GLOVE
    from mirrorbert.safeguards.writes import WritePlan

    inputs = {"--model": None if args.model == GLOVE else args.model.removeprefix(GLOVE + ":"),
              "--data-dir": data_dir, "--reference-model": args.reference_model}
    plan = WritePlan(inputs, overwrite=getattr(args, "overwrite", False))
    plan.file("--output", args.output).file("--report", args.report)
    plot_dir = plot_folder(args.report, args.plot_dir)
    plan.folder("--plot-dir" if args.plot_dir else "--report (its plot folder)", plot_dir)
    predictions = options.get("bel", {}).get("predictions_path")
    plan.file("--option bel.predictions_path", predictions)
    return plan


def plot_folder(report: str | Path | None, plot_dir: str | Path | None) -> Path | None:
    """--plot-dir, or `<report stem>_files` beside the report; None without either."""
    if plot_dir is not None:
        return Path(plot_dir)
    return Path(report).with_name(Path(report).stem + "_files") if report is not None else None


def _run_eval(args: argparse.Namespace, tasks: list[str], data_dir: Path, options: dict[str, dict[str, Any]]) -> int:
    from mirrorbert.runtime.distributed import init_from_env, sharded_encoding
    from mirrorbert.evaluation.baselines import load_model
    from mirrorbert.evaluation.runner import evaluate

    dist_ctx = init_from_env(args.device)  # under torchrun the processes share the encoding work
    # "auto" is the library's None: sentence-transformers then picks the device itself, as it always did
    device = str(dist_ctx.device) if dist_ctx.enabled else (None if args.device == "auto" else args.device)
    reference, trust = None, getattr(args, "trust_remote_code", False)  # --trust-remote-code (cli.build_parser)
    if args.reference_model:
        if "isotropy" not in tasks:
            logger.warning("--reference-model is only used by the isotropy task, which is not selected")
        else:
            reference = load_model(
                args.reference_model, args.reference_pooling, device, args.max_length, args.backend,
                option="--reference-model", packing=args.packing, trust_remote_code=trust,
            )
            options.setdefault("isotropy", {}).setdefault("reference_label", Path(args.reference_model).name)
    encoder = load_model(args.model, args.pooling, device, args.max_length, args.backend, packing=args.packing,
                         trust_remote_code=trust)
    with sharded_encoding(dist_ctx):  # every process runs every task; only rank 0 writes and prints
        result = evaluate(
            encoder,
            tasks=tasks,
            data_dir=data_dir,
            output=args.output if dist_ctx.is_main else None,
            report=args.report if dist_ctx.is_main else None,
            plot_dir=plot_folder(args.report, args.plot_dir) if dist_ctx.is_main else None,
            overwrite=getattr(args, "overwrite", False),
            batch_size=args.batch_size,
            task_options=options,
            reference_encoder=reference,
            model_name=args.model,
            show_progress=args.progress and dist_ctx.is_main,
        )
    if not dist_ctx.is_main:
        return 1 if any(o.status == "error" for o in result.outcomes.values()) else 0
    print(result.table())
    for outcome in result.outcomes.values():
        if outcome.status == "skipped":
            print(f"skipped {outcome.task}: {outcome.message}")
    if args.output:
        print(f"results: {Path(args.output)}")
    if args.report:
        print(f"report: {Path(args.report)}")
    if all(o.status == "skipped" for o in result.outcomes.values()):
        raise UserError(f"nothing was evaluated: the data of every selected task is missing from {data_dir} "
                        "(see `mirrorbert eval --list-data`)")
    return 1 if any(o.status == "error" for o in result.outcomes.values()) else 0
