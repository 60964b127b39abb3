"""`mirrorbert eval`: the evaluation suite on one model."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirrorbert.cli.options import command, json_or_text, options_from_args
from mirrorbert.errors import UserError
from mirrorbert.evaluation.runner import DEFAULT_TASKS, TASKS
from mirrorbert.settings.choices import POOLINGS
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class EvalOptions(Options):
    """`mirrorbert eval`'s options, in --help order (settings/fields.py)."""

    model: str | None = option(None, shared="model", note="'glove' (or 'glove:DIR') for the GloVe 50d baseline",
                               required=True)
    tasks: list[str] = option(help=f"comma-separated tasks among {', '.join(TASKS)} (default: all)",
                              default_factory=lambda: list(DEFAULT_TASKS), metavar="TASKS")
    data_dir: str | None = option(None, shared="data_dir", note="the evaluation sets")
    output: str | None = option(None, shared="output", note="all metrics as a JSON file")
    report: str | None = option(None, help="write a Markdown report (with PNG plots beside it) to this file")
    overwrite: bool = option(False, shared="overwrite", note="also --report and its plot folder")
    plot_dir: str | None = option(None, help="folder for PNG plots (default: <report stem>_files next to --report)")
    batch_size: int = option(64, shared="batch_size", note="strings per forward pass")
    pooling: str | None = option(None, shared="pooling")
    device: str = option("auto", shared="device")
    max_length: int | None = option(None, shared="max_length")
    backend: str = option("auto", help="auto: mirrorbert's Encoder (reads HF and sentence-transformers folders); "
                                       "sentence-transformers: run the model through SentenceTransformer.encode",
                          choices=("auto", "sentence-transformers"))
    reference_model: str | None = option(None, help="the 'before' model (e.g. the MLM before Mirror tuning) for the "
                                                    "isotropy before/after plot")
    reference_pooling: str | None = option(None, help="pooling of --reference-model", choices=POOLINGS)
    sts_sets: list[str] | None = option(None, help="comma-separated STS sets (default: sts12..sts16, stsb, sickr, "
                                                   "sts-es/ar/ru)")
    wordsim_languages: list[str] | None = option(None, help="Multi-SimLex languages, e.g. en,fr,et,ar,zh,ru,es,pl "
                                                            "(default: all)")
    xling_pairs: str | None = option(None, help="cross-lingual Multi-SimLex pairs, e.g. en-fr,en-ru")
    task_options: list[str] | None = option(None, help="extra keyword argument of a task (VALUE parsed as JSON when "
                                            "possible); repeatable, e.g. --option bel.predictions_path=preds.jsonl "
                                            "--option sts.include_dev=false", flag="--option", repeat=True,
                                            metavar="TASK.KEY=VALUE")
    packing: str = option("auto", shared="packing")
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress", old_flags={"--progress": True})
    list_data: bool = option(False, help="print the data registry (files, sources, and which sets the data "
                                         "directory holds) and exit")
    trust_remote_code: bool = option(False, shared="trust_remote_code")

    def rules(self) -> None:
        from mirrorbert.evaluation.runner import parse_tasks

        parse_tasks(self.tasks)


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    return command(subparsers, "eval", run_eval, EvalOptions,
                   summary="evaluate an encoder on the paper's benchmarks (STS, word similarity, BEL, QNLI, BLI, "
                           "isotropy)",
                   description="Evaluate a model (a folder this project trained, a plain Hugging Face masked LM, "
                               "any sentence-transformers model, or 'glove' for static GloVe vectors) on the "
                               "Mirror-BERT paper's benchmarks. Scores print x100 with two decimals; sets absent "
                               "from the data directory are skipped.")


def _parse_option(text: str) -> tuple[str, str, Any]:
    key, sep, raw = text.partition("=")
    task, dot, name = key.partition(".")
    if not sep or not dot or not task or not name:
        raise UserError(f"--option {text!r}: expected TASK.KEY=VALUE, e.g. sts.include_dev=false")
    return task.strip(), name.strip().replace("-", "_"), json_or_text(raw)


def run_eval(args: argparse.Namespace) -> int:
    """Run the evaluation described by parsed ``eval`` arguments; 0 if no task failed, 1 otherwise."""
    from mirrorbert.evaluation import datasets
    from mirrorbert.evaluation.runner import check_eval_data, check_task_options, parse_tasks

    if args.list_data:  # with a data directory (--data-dir or MIRRORBERT_DATA): what is there
        root = None
        if args.data_dir or os.environ.get(datasets.ENV_VAR):
            root = datasets.resolve_data_dir(args.data_dir)  # one named but absent: an error
        else:
            logger.warning("no data directory (--data-dir or %s): which sets are present is not shown",
                           datasets.ENV_VAR)
        print(datasets.registry_markdown(root))
        return 0
    opts = options_from_args(EvalOptions, args)  # every value checked once, as `EvalOptions(...)` checks it
    tasks = parse_tasks(opts.tasks)
    from mirrorbert.runtime.device import check_device_and_precision

    check_device_and_precision(opts.device)
    data_dir = datasets.resolve_data_dir(opts.data_dir)
    options: dict[str, dict[str, Any]] = {}
    for text in opts.task_options or []:
        task, key, value = _parse_option(text)
        options.setdefault(task, {})[key] = value
    if opts.sts_sets:
        options.setdefault("sts", {})["sets"] = list(opts.sts_sets)
    if opts.wordsim_languages:
        options.setdefault("wordsim", {})["languages"] = list(opts.wordsim_languages)
    if opts.xling_pairs:
        options.setdefault("wordsim", {})["cross_lingual"] = opts.xling_pairs
    check_task_options(options)  # before any model is loaded
    check_eval_data(data_dir, tasks)
    with _write_plan(opts, data_dir, options).locked():
        return _run_eval(opts, tasks, data_dir, options)


def _write_plan(opts: EvalOptions, data_dir: Path, options: dict[str, dict[str, Any]]):
    """Every path `eval` writes (JSON, report, plot folder, BEL predictions), under the write policy."""
    from mirrorbert.evaluation.baselines import GLOVE
    from mirrorbert.safeguards.writes import WritePlan

    inputs = {"--model": None if opts.model == GLOVE else opts.model.removeprefix(GLOVE + ":"),
              "--data-dir": data_dir, "--reference-model": opts.reference_model}
    plan = WritePlan(inputs, overwrite=opts.overwrite).file("--output", opts.output).file("--report", opts.report)
    plot_dir = plot_folder(opts.report, opts.plot_dir)
    plan.folder("--plot-dir" if opts.plot_dir else "--report (its plot folder)", plot_dir)
    return plan.file("--option bel.predictions_path", options.get("bel", {}).get("predictions_path"))


def plot_folder(report: str | Path | None, plot_dir: str | Path | None) -> Path | None:
    """--plot-dir, or `<report stem>_files` beside the report; None without either."""
    if plot_dir is not None:
        return Path(plot_dir)
    return Path(report).with_name(Path(report).stem + "_files") if report is not None else None


def _run_eval(opts: EvalOptions, tasks: list[str], data_dir: Path, options: dict[str, dict[str, Any]]) -> int:
    from mirrorbert.runtime.distributed import init_from_env, sharded_encoding
    from mirrorbert.evaluation.baselines import load_model
    from mirrorbert.evaluation.runner import evaluate

    dist_ctx = init_from_env(opts.device)  # under torchrun the processes share the encoding work
    # "auto" is the library's None: sentence-transformers then picks the device itself, as it always did
    device = str(dist_ctx.device) if dist_ctx.enabled else (None if opts.device == "auto" else opts.device)
    reference, trust = None, opts.trust_remote_code
    if opts.reference_model:
        if "isotropy" not in tasks:
            logger.warning("--reference-model is only used by the isotropy task, which is not selected")
        else:
            reference = load_model(
                opts.reference_model, opts.reference_pooling, device, opts.max_length, opts.backend,
                option="--reference-model", packing=opts.packing, trust_remote_code=trust,
            )
            options.setdefault("isotropy", {}).setdefault("reference_label", Path(opts.reference_model).name)
    encoder = load_model(opts.model, opts.pooling, device, opts.max_length, opts.backend, packing=opts.packing,
                         trust_remote_code=trust)
    with sharded_encoding(dist_ctx):  # every process runs every task; only rank 0 writes and prints
        result = evaluate(
            encoder,
            tasks=tasks,
            data_dir=data_dir,
            output=opts.output if dist_ctx.is_main else None,
            report=opts.report if dist_ctx.is_main else None,
            plot_dir=plot_folder(opts.report, opts.plot_dir) if dist_ctx.is_main else None,
            overwrite=opts.overwrite,
            batch_size=opts.batch_size,
            task_options=options,
            reference_encoder=reference,
            model_name=opts.model,
            show_progress=opts.show_progress and dist_ctx.is_main,
        )
    status = 1 if any(o.status == "error" for o in result.outcomes.values()) else 0
    if not dist_ctx.is_main:
        return status
    print(result.table())
    for outcome in result.outcomes.values():
        if outcome.status == "skipped":
            print(f"skipped {outcome.task}: {outcome.message}")
    if opts.output:
        print(f"results: {Path(opts.output)}")
    if opts.report:
        print(f"report: {Path(opts.report)}")
    if all(o.status == "skipped" for o in result.outcomes.values()):
        raise UserError(f"nothing was evaluated: the data of every selected task is missing from {data_dir} "
                        "(see `mirrorbert eval --list-data`)")
    return status
