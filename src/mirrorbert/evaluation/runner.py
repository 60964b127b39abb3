"""Run evaluation tasks on one encoder; print a table (x100, two decimals), write JSON and a Markdown report.

A task is a callable ``task(encoder, data_dir, **options) -> dict`` returning a flat dict of floats
(fractions, i.e. 0.8203 for a Spearman of 82.03) with a ``primary`` key. A task module with more options than
a signature holds declares them as a dataclass, ``SETTINGS``: the task then takes them as ``settings=``. A task whose data is absent
raises DatasetMissing and is reported as *skipped* with the message (never as a zero); any other
failure is reported as an *error* and the remaining tasks still run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import DatasetMissing, NonFiniteEmbeddings, UserError
from mirrorbert.reporting.scores import format_value
from mirrorbert.evaluation import datasets

logger = logging.getLogger(__name__)

#: Task name -> "module:function" (imported lazily so unused tasks cost nothing).
TASKS: dict[str, str] = {
    "sts": "mirrorbert.evaluation.sts:evaluate_sts",
    "wordsim": "mirrorbert.evaluation.wordsim:evaluate_wordsim",
    "bel": "mirrorbert.evaluation.bel:evaluate_bel",
    "qnli": "mirrorbert.evaluation.qnli:evaluate_qnli",
    "bli": "mirrorbert.evaluation.bli:evaluate_bli",
    "isotropy": "mirrorbert.evaluation.isotropy:evaluate_isotropy",
}
DEFAULT_TASKS: tuple[str, ...] = tuple(TASKS)
#: Tasks that write plots and accept ``plot_dir``.
PLOTTING_TASKS = frozenset({"qnli", "isotropy"})


def _task_module(name: str) -> Any:
    return importlib.import_module(TASKS[name].split(":")[0])


def get_task(name: str) -> Callable[..., Mapping[str, float]]:
    """The callable of a task name."""
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return getattr(_task_module(name), TASKS[name].split(":")[1])


def task_settings(name: str) -> type | None:
    """The dataclass a task takes its options in (its module's ``SETTINGS``), or None: options as keywords."""
    return getattr(_task_module(name), "SETTINGS", None)


def parse_tasks(tasks: str | Iterable[str] | None) -> list[str]:
    """Comma string or list -> validated task names (order kept, duplicates dropped)."""
    if tasks is None:
        return list(DEFAULT_TASKS)
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names = list(dict.fromkeys(t.strip().lower() for t in items if t.strip()))
    if not names:
        raise UserError("--tasks: no task given")
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise UserError(f"--tasks: unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    return names


def check_task_options(options: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse an option no task takes (rather than ignore it), before any model loads."""
    import inspect

    unknown = [k for k in options if k not in TASKS]
    if unknown:
        raise UserError(f"--option: options given for unknown task(s): {', '.join(unknown)}; tasks: {', '.join(TASKS)}")
    for task, values in options.items():
        params = inspect.signature(get_task(task)).parameters
        accepted = [n for n, p in list(params.items())[2:] if n != "settings"
                    and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        settings = task_settings(task)
        if settings is not None:
            accepted += [f.name for f in dataclasses.fields(settings)]
        for key in values:
            if key not in accepted:
                raise UserError(f"--option {task}.{key}: the {task} task has no option {key!r} "
                                f"(its options: {', '.join(accepted)})")
        check = getattr(_task_module(task), "check_options", None)
        if check is not None:  # the values, where the task module can tell (set names, languages, pairs)
            check(**values)


@dataclass
class TaskOutcome:
    """What happened to one task."""

    task: str
    status: str  # "ok" | "skipped" | "error"
    metrics: dict[str, float] = field(default_factory=dict)
    message: str = ""
    skipped_parts: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class EvaluationResult:
    """All task outcomes of one run, with renderers."""

    model: str
    data_dir: str
    outcomes: dict[str, TaskOutcome]
    created: str = field(default_factory=lambda: _dt.datetime.now().isoformat(timespec="seconds"))

    def __getitem__(self, task: str) -> TaskOutcome:
        return self.outcomes[task]

    def primary(self) -> dict[str, float]:
        """Primary metric of every task that ran."""
        return {t: o.metrics["primary"] for t, o in self.outcomes.items() if o.status == "ok" and "primary" in o.metrics}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "data_dir": self.data_dir,
            "created": self.created,
            "scale": "fractions (multiply by 100 for the paper's tables); *_n and n_* are counts",
            "tasks": {t: asdict(o) for t, o in self.outcomes.items()},
        }

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=str)

    def table(self) -> str:
        """Plain-text table for the screen: task, metric, split, value x100 (counts stay in the JSON)."""
        from mirrorbert.reporting.scores import is_count

        rows = [("task", "metric", "split", "value x100")]
        for t, o in self.outcomes.items():
            if o.status != "ok":
                rows.append((t, o.status, "", _one_line(o.message, 100)))
                continue
            for k, v in _ordered_metrics(o.metrics):
                if is_count(k) or k == "primary":
                    continue
                name, split = _metric_split(k)
                rows.append((t, name, split, format_value(k, v)))
            for part, msg in o.skipped_parts.items():
                name, split = _metric_split(part)
                rows.append((t, name, split if name != part else "", "skipped"))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
        lines.insert(1, "-" * (sum(widths) + 16))
        lines.append(f"model: {self.model}; primary metric per task and counts: the JSON (--output)")
        return "\n".join(lines)

    def markdown(self, base_dir: str | Path | None = None) -> str:
        """Markdown report; plot links are made relative to ``base_dir`` (the report's folder)."""
        out = [f"# Evaluation of `{self.model}`", ""]
        out += [f"- data directory: `{self.data_dir}`", f"- date: {self.created}", "- values x100, two decimals", ""]
        out += ["## Summary", "", "| task | status | primary |", "|---|---|---|"]
        primary = self.primary()
        out += [f"| {t} | {o.status} | {format_value('primary', primary[t]) if t in primary else '-'} |"
                for t, o in self.outcomes.items()]
        out.append("")
        for t, o in self.outcomes.items():
            out += [f"## {t}", ""]
            if o.status != "ok":
                out += [f"**{o.status}**: {o.message}", ""]
                continue
            out += ["| metric | value |", "|---|---|"]
            out += [f"| {k} | {format_value(k, v)} |" for k, v in _ordered_metrics(o.metrics)]
            out.append("")
            if o.skipped_parts:
                out += ["Skipped parts:", ""]
                out += [f"- {part}: {msg}" for part, msg in o.skipped_parts.items()]
                out.append("")
            for label, path in o.artifacts.items():
                link = Path(path) if base_dir is None else Path(os.path.relpath(Path(path).resolve(),
                                                                                Path(base_dir).resolve()))
                out += [f"![{label}]({link.as_posix()})", ""]
            out.append(f"_{o.seconds:.1f} s_")
            out.append("")
        return "\n".join(out)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _metric_split(key: str) -> tuple[str, str]:
    """`stsb_dev` -> ("stsb", "dev"); a metric without a split suffix is the task's test (or only) split."""
    for split in ("dev", "test", "train", "validation"):
        if key.endswith("_" + split):
            return key[: -len(split) - 1], split
    return key, "test"


def _ordered_metrics(metrics: Mapping[str, float]) -> list[tuple[str, float]]:
    items = [(k, v) for k, v in metrics.items() if k != "primary"]
    return [("primary", metrics["primary"])] + items if "primary" in metrics else items


def check_eval_data(root: str | Path, tasks: Iterable[str]) -> None:
    """The selected tasks' files checked before any model loads: UTF-8, and the STS and word-similarity gold scores
    as the tasks read them (a NaN, infinite or out-of-range score is one error naming the file and line)."""
    wanted = set(tasks)
    datasets.check_eval_files(root, wanted)
    for task in sorted(wanted & {"sts", "wordsim"}):
        _task_module(task).check_gold_files(root)


def evaluate(
    encoder: Any,
    tasks: str | Iterable[str] | None = None,
    data_dir: str | Path | None = None,
    *,
    output: str | Path | None = None,
    report: str | Path | None = None,
    plot_dir: str | Path | None = None,
    overwrite: bool = False,
    batch_size: int = 64,
    task_options: Mapping[str, Mapping[str, Any]] | None = None,
    reference_encoder: Any = None,
    model_name: str | None = None,
    show_progress: bool = False,
) -> EvaluationResult:
    """Run ``tasks`` on ``encoder`` with the sets in ``data_dir`` (or ``$MIRRORBERT_DATA``).

    ``encoder`` is any object with the encoder protocol, or a model folder / hub id / ``"glove"``
    (loaded with ``Encoder.load`` or the GloVe baseline).
    ``task_options`` maps a task name to its options (keywords of its callable, or its ``SETTINGS`` fields);
    ``reference_encoder`` is the "before" model for the isotropy plot. Plots go to ``plot_dir``
    (default: ``<report stem>_files`` beside the report; none without a report or plot_dir).
    Every file goes through the write policy (``mirrorbert.safeguards.writes``): an existing ``output``, ``report``
    or plot folder is replaced only with ``overwrite`` (a plot folder only when mirrorbert wrote it).
    """
    names = parse_tasks(tasks)
    root = datasets.resolve_data_dir(data_dir)
    if isinstance(encoder, (str, os.PathLike)):  # a model folder, hub id or "glove"
        from mirrorbert.evaluation.baselines import load_model

        model_name = model_name or str(encoder)
        encoder = load_model(str(encoder))
    options = {k: dict(v) for k, v in (task_options or {}).items()}
    check_task_options(options)
    check_eval_data(root, names)
    if plot_dir is None and report is not None:
        plot_dir = Path(report).with_name(Path(report).stem + "_files")
    from mirrorbert.safeguards.writes import WritePlan, atomic_output_dir

    plan = WritePlan({"data_dir": root, "model": model_name}, overwrite=overwrite)
    plan.file("output", output).file("report", report).folder("plot_dir", plot_dir).check()
    with contextlib.ExitStack() as stack:  # plots are drawn in a temporary folder, renamed into place at the end
        tmp_plots = None if plot_dir is None else stack.enter_context(
            atomic_output_dir(plot_dir, overwrite=overwrite, kind="plots", keep_empty=False))
        run = _TaskRun(root, tmp_plots, batch_size, show_progress, reference_encoder, model_name)
        outcomes = {name: _run_task(encoder, name, options.get(name, {}), run) for name in names}
    if tmp_plots is not None:  # artifacts point into the final folder, named as the caller named it
        final = str(Path(plot_dir))
        for outcome in outcomes.values():
            outcome.artifacts = {k: v.replace(str(tmp_plots), final, 1) for k, v in outcome.artifacts.items()}
    result = EvaluationResult(model=model_name or type(encoder).__name__, data_dir=str(root), outcomes=outcomes)
    _write_result(result, output, report, overwrite)
    return result


def _write_result(result: EvaluationResult, output: str | Path | None, report: str | Path | None,
                  overwrite: bool) -> None:
    """The JSON (``output``) and the Markdown report, each through the write policy."""
    from mirrorbert.safeguards.writes import write_text_atomic

    if output is not None:
        logger.info("results written to %s", write_text_atomic(output, result.to_json() + "\n", overwrite, "output"))
    if report is not None:
        rep_path = Path(report)
        write_text_atomic(rep_path, result.markdown(base_dir=rep_path.parent) + "\n", overwrite, "report")
        logger.info("report written to %s", rep_path)


@dataclass
class _TaskRun:
    """What every task of one `evaluate` call shares."""

    root: Path
    plot_dir: Path | None
    batch_size: int
    show_progress: bool
    reference_encoder: Any
    model_name: str | None

    def task_kwargs(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """One task's keywords: the run's, then the user's options (a task's ``SETTINGS`` fields as ``settings=``)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "show_progress": self.show_progress}
        options = dict(options)
        if name in PLOTTING_TASKS and self.plot_dir is not None:
            kwargs["plot_dir"] = Path(self.plot_dir)
        if name == "isotropy":
            if self.reference_encoder is not None:
                kwargs["reference_encoder"] = self.reference_encoder
            if self.model_name:
                options.setdefault("model_label", Path(self.model_name).name or self.model_name)
        settings = task_settings(name)
        if settings is not None:
            fields = {f.name for f in dataclasses.fields(settings)}
            kwargs["settings"] = settings(**{k: v for k, v in options.items() if k in fields})
            options = {k: v for k, v in options.items() if k not in fields}
        return {**kwargs, **options}


def _run_task(encoder: Any, name: str, options: Mapping[str, Any], run: _TaskRun) -> TaskOutcome:
    """One task's outcome: its scores, or why it was skipped or failed (the other tasks still run)."""
    start = time.perf_counter()
    logger.info("evaluating %s", name)
    try:
        func = get_task(name)
        result = func(encoder, run.root, **run.task_kwargs(name, options))
        outcome = TaskOutcome(
            name,
            "ok",
            metrics={str(k): float(v) for k, v in result.items()},
            skipped_parts=dict(getattr(result, "skipped", {}) or {}),
            artifacts=dict(getattr(result, "artifacts", {}) or {}),
        )
        not_finite = [k for k, v in outcome.metrics.items() if not math.isfinite(v)]
        if not_finite:  # a NaN score is never reported as a result: the task failed (exit 1)
            outcome.status = "error"
            outcome.message = (f"score(s) not finite: {', '.join(not_finite[:5])} (constant similarities or "
                               "constant gold scores, or too few covered pairs)")
            logger.error("%s failed: %s", name, outcome.message)
    except NonFiniteEmbeddings:
        raise  # every task would score NaN: stop with one error line, never print NaN as a result
    except DatasetMissing as exc:
        logger.warning("%s skipped: %s", name, exc)
        outcome = TaskOutcome(name, "skipped", message=str(exc))
    except Exception as exc:  # one broken task must not lose the others' results
        if isinstance(exc, (UserError, ModuleNotFoundError)):
            logger.error("%s failed: %s", name, exc)
        else:
            logger.exception("%s failed", name)
        what = "task module not available" if isinstance(exc, ModuleNotFoundError) else type(exc).__name__
        outcome = TaskOutcome(name, "error", message=f"{what}: {exc}")
    outcome.seconds = time.perf_counter() - start
    return outcome
