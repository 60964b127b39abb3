"""Run the cells of ``cells.py``: train (once per training configuration and seed), evaluate, cache.

Each (cell, seed) result goes to ``<output>/cells/<cell>--s<seed>.json`` with a hash of all it depends on (cell,
base model, seed, data fingerprints, mirrorbert version): a rerun computes only what is missing or stale. Trained
models live in ``<output>/models/`` until their last cell is done (``keep_models`` keeps them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import open_regular, parse_json, read_regular_bytes, set_aside
from mirrorbert.reproduce.cells import Cell, QuickLimits, build_cells, quick_data_dir
from mirrorbert.reproduce.results import CellResult, ReproduceConfig, ReproduceResult
from mirrorbert.reproduce.paper import detect_base_model, read_config
from mirrorbert.safeguards.writes import REPRODUCE_KIND, remove_tree

logger = logging.getLogger(__name__)

#: Task name -> data folders whose content the cell's result depends on (fingerprinted).
TASK_DATA = {
    "sts": ("sts",), "wordsim": ("wordsim",), "qnli": ("qnli",), "bel": ("bel",), "bli": ("bli",),
    "isotropy": ("sts/STSBenchmark",), "lexsub": ("lexsub", "wordnet"), "finetune-sts": ("sts/STSBenchmark",),
}

_FINGERPRINTS: dict[str, str] = {}


def fingerprint(path: Path) -> str:
    """SHA-256 of a file, or of a folder's relative paths and file contents (memoised per run)."""
    key = str(path.resolve())
    if key in _FINGERPRINTS:
        return _FINGERPRINTS[key]
    h = hashlib.sha256()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        return "absent"
    for f in files:
        h.update(str(f.relative_to(path)).encode() if f != path else b"")
        with os.fdopen(open_regular(f, "--data-dir"), "rb") as fh:  # a FIFO among the data is an error, not a hang
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


def model_identity(model: str) -> str:
    """The base model's identity: its config and weight file sizes for a folder, its name otherwise."""
    if not Path(model).is_dir():
        return model
    folder = ConfinedFolder(model, "--model", "model folder")
    h = hashlib.sha256()
    for name, st in sorted(folder.entries()):
        if stat.S_ISREG(st.st_mode):
            h.update(name.encode())
            h.update(folder.read_bytes(name) if name.endswith(".json") else str(st.st_size).encode())
    return h.hexdigest()


def _hash(obj: Any, output: Path | None = None) -> str:
    """Short SHA-256 of `obj` as sorted JSON; paths inside `output` count relative to it, so a moved or
    copied output folder keeps its keys (what the runner derives there is fingerprinted by content)."""
    text = json.dumps(obj, sort_keys=True, default=str)  # key, not output
    if output is not None:
        text = text.replace(json.dumps(str(output))[1:-1], "<output>")  # key, not output
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Context:
    """What a cell computation needs: the configuration, folders, base encoder cache."""

    def __init__(self, cfg: ReproduceConfig, data_dir: Path, out: Path, quick: QuickLimits | None):
        self.cfg, self.data_dir, self.out, self.quick = cfg, data_dir, out, quick
        self.identity = model_identity(cfg.model)
        self.models_dir = out / "models"
        self._base_encoders: dict[str, Any] = {}

    def base_encoder(self, pooling: str):
        from mirrorbert.encoder.model import Encoder

        if pooling not in self._base_encoders:
            self._base_encoders[pooling] = Encoder.load(self.cfg.model, pooling=pooling, device=self.cfg.device,
                                                        trust_remote_code=self.cfg.trust_remote_code)
        return self._base_encoders[pooling]

    def train_overrides(self, cell: Cell, seed: int) -> dict[str, Any]:
        overrides = {**cell.train, **self.cfg.train_options, "model": self.cfg.model, "seed": seed,
                     "device": self.cfg.device, "show_progress": False}
        if self.cfg.trust_remote_code:
            overrides["trust_remote_code"] = True
        if self.quick:
            overrides["steps"] = self.quick.steps
            overrides["batch_size"] = self.quick.batch_size
            overrides["limit"] = min(overrides.get("limit") or self.quick.strings, self.quick.strings)
            for key in ("random_strings", "words_top"):
                if overrides.get(key):
                    overrides[key] = min(overrides[key], self.quick.strings)
        return overrides

    def trained_model_dir(self, cell: Cell, seed: int) -> Path:
        return self.models_dir / f"mirror-{_hash([self.identity, self.train_overrides(cell, seed)])}"

    def gr_options(self, arch: str, seed: int) -> dict[str, Any]:
        import torch

        opts: dict[str, Any] = {"arch": arch, "seed": seed, "triplets": "wordnet",
                                "precision": "bf16" if torch.cuda.is_available() else "fp32"}
        if self.quick:
            opts.update(limit=self.quick.gr_triplets, epochs=1, steps=self.quick.steps, batch_size=self.quick.batch_size)
        opts.update(self.cfg.gr_options)
        return opts


def cell_hash(ctx: _Context, cell: Cell, seed: int | None) -> str:
    from mirrorbert._version import __version__

    data = {d: fingerprint(ctx.data_dir / d) for d in TASK_DATA.get(cell.evaluation.task, ())}
    train = ctx.train_overrides(cell, seed) if cell.train is not None else None
    if train and train.get("data"):
        data["train"] = fingerprint(Path(train["data"]))
    return _hash({"cell": asdict(cell), "model": ctx.identity, "seed": seed, "train": train,
                  "gr": ctx.gr_options(cell.gr_arch, seed or 0) if cell.gr_arch else None, "data": data,
                  "quick": asdict(ctx.quick) if ctx.quick else None, "eval_batch_size": ctx.cfg.eval_batch_size,
                  "mirrorbert": __version__}, output=ctx.out)


def _command(head: str, options: dict[str, Any]) -> str:
    """``head`` followed by each option as ``--key value`` (``--key`` for True; None and False left out)."""
    flags = [f"--{key.replace('_', '-')}" + ("" if value is True else f" {value}") for key, value in options.items()
             if value is not None and value is not False]
    return " ".join([head, *flags])


def _eval_command(model: str, cell: Cell, data_dir: Path) -> str:
    ev = cell.evaluation
    if ev.task == "lexsub":
        post = "".join(f" --post {p}" for p in ev.options.get("post", []))
        limit = f" --limit {ev.options['limit']}" if ev.options.get("limit") else ""
        return f"mirrorbert lexsub --model {model} --dataset {ev.options['dataset']} --data-dir {data_dir}{post}{limit}"
    if ev.task == "finetune-sts":
        fr = ",".join(str(f) for f in ev.options["fractions"])
        return f"mirrorbert finetune-sts --model {model} --data-dir {data_dir} --fractions {fr}"
    parts = [f"mirrorbert eval --model {model} --tasks {ev.task} --data-dir {data_dir}"]
    if ev.pooling:
        parts.append(f"--pooling {ev.pooling}")
    for key, value in ev.options.items():
        if isinstance(value, list):
            value = ",".join(map(str, value))
        parts.append(f"--option {ev.task}.{key}={value}")
    return " ".join(parts)


def _prepare_model(ctx: _Context, cell: Cell, seed: int | None) -> tuple[str, list[str], dict[str, str]]:
    """The model folder (or name) the cell evaluates, training it first when needed."""
    if cell.train is not None:
        from mirrorbert.mirror.config import resolve_config
        from mirrorbert.mirror.train import train

        overrides = ctx.train_overrides(cell, seed)
        folder = ctx.trained_model_dir(cell, seed)
        command = _command(f"mirrorbert train --model {ctx.cfg.model}", {
            **{k: v for k, v in overrides.items() if k not in ("show_progress", "model")}, "output": folder})
        data = {"train": fingerprint(Path(overrides["data"]))} if overrides.get("data") else {}
        if not (folder / "mirrorbert.json").is_file():
            # show_progress is left out of `overrides`: it names the model folder and the cell's cache key
            result = train(resolve_config({**overrides, "output": str(folder), "overwrite": True,
                                           "show_progress": ctx.cfg.show_progress}))
            if result.interrupted:
                raise KeyboardInterrupt
        return str(folder), [command], data
    if cell.gr_arch is not None:
        from mirrorbert.gloss.pretrain import GlossPretrainConfig, pretrain

        opts = ctx.gr_options(cell.gr_arch, seed or 0)
        folder = ctx.models_dir / f"gr-{cell.gr_arch}-{_hash([ctx.identity, opts])}"
        command = _command(f"mirrorbert gloss-pretrain --model {ctx.cfg.model} --data-dir {ctx.data_dir} "
                           f"--output {folder}", opts)
        if not (folder / "config.json").is_file():
            result = pretrain(GlossPretrainConfig(
                model=ctx.cfg.model, output=str(folder), data_dir=str(ctx.data_dir), overwrite=True,
                device=ctx.cfg.device, show_progress=ctx.cfg.show_progress, trust_remote_code=ctx.cfg.trust_remote_code,
                **opts))
            if result.interrupted:
                raise KeyboardInterrupt
        return str(folder), [command], {"wordnet": fingerprint(ctx.data_dir / "wordnet")}
    return ctx.cfg.model, [], {}


def preflight(ctx: _Context, jobs: list[tuple[Cell, int | None]], config: Any) -> None:
    """Every input of every cell checked before the first one runs (one UserError): training options through
    `mirrorbert train`'s config (data file, max length against the model's `config`), evaluation options as `eval`'s."""
    from mirrorbert.mirror.config import resolve_config
    from mirrorbert.evaluation.runner import TASKS, check_task_options
    from mirrorbert.safeguards.preflight import check_max_length, check_readable

    for cell, seed in jobs:
        try:
            if cell.train is not None:
                overrides = ctx.train_overrides(cell, seed)
                tcfg = resolve_config({**overrides, "output": str(ctx.trained_model_dir(cell, seed)), "overwrite": True})
                check_max_length(tcfg.max_length, config, "--max-length", ctx.cfg.model)
                if tcfg.data:
                    check_readable(tcfg.data, "--data")
            if cell.evaluation.task in TASKS:
                check_task_options({cell.evaluation.task: cell.evaluation.options})
        except (UserError, TypeError) as exc:
            raise UserError(f"cell {cell.id}: {exc}") from None


def compute_cell(ctx: _Context, cell: Cell, seed: int | None) -> CellResult:
    """Train (if needed) and evaluate one cell for one seed."""
    from mirrorbert.evaluation.runner import evaluate

    start = time.perf_counter()
    model, commands, data = _prepare_model(ctx, cell, seed)
    train_s = time.perf_counter() - start
    ev = cell.evaluation
    commands.append(_eval_command(model, cell, ctx.data_dir))
    for d in TASK_DATA.get(ev.task, ()):
        data[d] = fingerprint(ctx.data_dir / d)
    result = CellResult(cell.id, cell.experiment, cell.state, seed, "", {}, commands=commands, data=data,
                        data_note=cell.data_note, x=cell.x)
    if ev.task == "lexsub":
        from mirrorbert.evaluation.lexsub import GenerationConfig, evaluate_lexsub

        scores = evaluate_lexsub(model, ev.options["dataset"], ctx.data_dir, device=ctx.cfg.device,
                                 config=GenerationConfig(post=tuple(ev.options.get("post", ()))),
                                 limit=ev.options.get("limit"))
        keys = ("best_p", "best_mode_p", "oot_p", "oot_mode_p", "p_at_1", "p_at_3")
        result.metrics = {k: getattr(scores, k) / 100.0 for k in keys}
    elif ev.task == "finetune-sts":
        from mirrorbert.gloss.finetune_sts import FinetuneStsConfig, finetune_sts

        fcfg = FinetuneStsConfig(model=model, data_dir=str(ctx.data_dir), fractions=tuple(ev.options["fractions"]),
                                 seeds=(seed or 0,), epochs=ev.options.get("epochs", 4), device=ctx.cfg.device,
                                 show_progress=ctx.cfg.show_progress, trust_remote_code=ctx.cfg.trust_remote_code)
        summary = finetune_sts(fcfg).summary()
        result.metrics = {f"stsb_{float(k) * 100:g}%": v["mean"] / 100.0 for k, v in summary.items()}
    else:
        if cell.train is None and cell.gr_arch is None:
            encoder = ctx.base_encoder(ev.pooling or "mean")
        else:
            from mirrorbert.encoder.model import Encoder

            encoder = Encoder.load(model, pooling=ev.pooling, device=ctx.cfg.device,
                                   trust_remote_code=ctx.cfg.trust_remote_code)
        plot_dir = ctx.out / "plots" / cell.file_stem / f"s{seed}"
        reference = ctx.base_encoder("mean") if ev.reference_base else None
        outcome = evaluate(encoder, tasks=[ev.task], data_dir=ctx.data_dir, plot_dir=plot_dir, overwrite=True,
                           batch_size=ctx.cfg.eval_batch_size, task_options={ev.task: dict(ev.options)},
                           reference_encoder=reference, model_name=model)[ev.task]
        result.status, result.message = outcome.status, outcome.message
        kept = {k: v for k, v in outcome.metrics.items() if ev.keep is None or k in ev.keep or k in ev.rename}
        result.metrics = {ev.rename.get(k, k): v for k, v in kept.items()}
        result.skipped = dict(outcome.skipped_parts)
        result.artifacts = {k: os.path.relpath(v, ctx.out) for k, v in outcome.artifacts.items()}
    result.wall_s, result.train_s = time.perf_counter() - start, train_s
    return result


def _damage(data: Any) -> str | None:
    """Why a cell file's content is not a cell result (None when it is one)."""
    if not isinstance(data, dict):
        return f"holds {type(data).__name__}, not a cell record"
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        return f"its metrics are {type(metrics).__name__}, not a mapping"
    bad = [k for k, v in metrics.items() if not isinstance(v, (int, float)) or isinstance(v, bool)]
    if bad:
        return f"metric(s) {', '.join(map(str, bad))} are not numbers"
    names = {f.name for f in fields(CellResult)}
    missing = [f.name for f in fields(CellResult) if f.default is MISSING and f.default_factory is MISSING
               and f.name not in data]
    if missing or set(data) - names:
        return f"fields missing ({', '.join(missing)}) or unknown ({', '.join(sorted(set(data) - names))})"
    return None


def _load_cached(path: Path, key: str) -> CellResult | None:
    """A cell's cached result, or None (absent, stale, a failure, or damaged: set aside with one warning)."""
    if not path.exists() and not path.is_symlink():
        return None
    data, why = None, "not a file"
    if path.is_file():
        try:
            data = parse_json(read_regular_bytes(path, "cell cache", 64 << 20), "cell cache", path)
        except (OSError, ValueError) as exc:  # a UserError is a ValueError: damaged, so set aside
            why = f"not readable JSON: {exc}"
        else:
            why = _damage(data)
    if why is not None:
        aside = set_aside(path, "--output")
        logger.warning("reproduce: damaged cache %s (%s); set aside as %s and recomputed", path, why, aside.name)
        return None
    if data.get("config_hash") != key or data.get("status") == "error":  # stale, or a failure: computed again
        return None
    data["cached"] = True
    return CellResult(**data)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _run_cell(ctx: _Context, cell: Cell, seed: int | None, key: str) -> CellResult:
    """compute_cell, with any failure (out of memory, a training set too small...) as an error result."""
    start = time.perf_counter()
    try:
        result = compute_cell(ctx, cell, seed)
    except Exception as exc:  # noqa: BLE001  (recorded; the grid goes on)
        logger.debug("cell %s failed", cell.id, exc_info=True)
        message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {first_line(exc)}"
        result = CellResult(cell.id, cell.experiment, cell.state, seed, key, {}, status="error", message=message,
                            wall_s=time.perf_counter() - start)
    result.config_hash = key
    return result


class _JobPlan:
    """Per-cell time estimates (see estimate.py); cells whose work cannot be counted (GR-BERT pre-training,
    lexical substitution, STS-B fine-tuning) take the mean time of the computed cells of their experiment."""

    def __init__(self, jobs: list[tuple[Cell, int | None]], estimator: Any, predictions: dict[int, tuple]) -> None:
        self.jobs, self.estimator, self.predictions = jobs, estimator, predictions
        self.pending = set(predictions)
        self.by_experiment: dict[str, list[float]] = {}

    def estimate(self, i: int) -> float | None:
        parts = self.predictions.get(i)
        est = self.estimator.estimate(parts) if self.estimator is not None and parts else None
        if est is None:
            seen = self.by_experiment.get(self.jobs[i][0].experiment)
            est = statistics.fmean(seen) if seen else None
        return est

    def left_after(self, i: int) -> float | None:
        rest = [self.estimate(j) for j in sorted(self.pending) if j > i]
        return None if any(e is None for e in rest) else sum(rest)

    def done(self, i: int, result: CellResult) -> None:
        self.pending.discard(i)
        self.by_experiment.setdefault(self.jobs[i][0].experiment, []).append(result.wall_s)
        if self.estimator is not None and result.status == "ok":
            measured = {"train": result.train_s, "eval": result.wall_s - result.train_s}
            self.estimator.record([(kind, p, measured[kind.split(":")[0]]) for kind, p in self.predictions.get(i, [])])


def _plan(ctx: _Context, jobs: list[tuple[Cell, int | None]], todo: list[int], progress: Callable[[str], None]) -> _JobPlan:
    """Count each pending cell's work and measure this machine's throughput on it (a few seconds)."""
    if not todo:
        return _JobPlan(jobs, None, {})
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.mirror.config import resolve_config
    from mirrorbert.reproduce.estimate import Estimator, warm_up

    start = time.perf_counter()
    warm_up()
    encoder = ctx.base_encoder("mean")
    load_start = time.perf_counter()  # a second load: the first one pays for imports and caches
    Encoder.load(ctx.cfg.model, pooling="mean", device=ctx.cfg.device, trust_remote_code=ctx.cfg.trust_remote_code)
    estimator = Estimator(encoder, ctx.cfg.eval_batch_size, load_s=time.perf_counter() - load_start)
    predictions: dict[int, list[tuple[str, float]]] = {}
    trained: set[Path] = set()
    for i in todo:
        cell, seed = jobs[i]
        parts: list[tuple[str, float]] = []
        if cell.train is not None:
            folder = ctx.trained_model_dir(cell, seed)
            if folder not in trained and not (folder / "mirrorbert.json").is_file():
                trained.add(folder)
                tcfg = resolve_config(ctx.train_overrides(cell, seed))
                try:
                    parts.append((f"train:{tcfg.preset}", estimator.train_prediction(tcfg)))
                except Exception:  # noqa: BLE001  (e.g. too few strings: the cell fails and is reported)
                    logger.debug("no training estimate for %s", cell.id, exc_info=True)
                    continue
        elif cell.gr_arch is not None:
            continue  # gloss pre-training: counted from the cells already run
        ev = cell.evaluation
        eval_pred = estimator.eval_prediction(ev.task, ev.options, ctx.data_dir, ev.reference_base,
                                              loads=cell.train is not None)
        if eval_pred is None:
            continue
        predictions[i] = parts + [(f"eval:{ev.task}", eval_pred)]
    total = sum(estimator.estimate(parts) for parts in predictions.values())  # each has its evaluation part
    progress(f"estimated {_fmt_s(total)} for {len(predictions)} cell runs "
             f"(throughput measured here in {time.perf_counter() - start:.0f} s)")
    return _JobPlan(jobs, estimator, predictions)


def reproduce(cfg: ReproduceConfig, progress: Callable[[str], None] | None = None) -> ReproduceResult:
    """Run every cell the data allows (resuming from the cache) and write results.json + report.md."""
    from mirrorbert.evaluation.datasets import resolve_data_dir

    experiments = cfg.validate()
    progress = progress or logger.info
    data_dir = resolve_data_dir(cfg.data_dir)
    _output_plan(cfg, data_dir).check()  # the output's path rules first, before anything is opened
    model_config = None
    if not cfg.report_only:  # the model folder (config, tokenizer, weights), before anything is written
        from mirrorbert.encoder.source import open_model

        with open_model(cfg.model, trust_remote_code=cfg.trust_remote_code) as handle:
            model_config = handle.config()
            handle.tokenizer()
    with output_folder(cfg, data_dir) as out:
        return _reproduce(cfg, experiments, data_dir, out, progress, model_config)


def _output_plan(cfg: ReproduceConfig, data_dir: Path):
    from mirrorbert.safeguards.writes import WritePlan

    plan = WritePlan({"--model": cfg.model, "--data-dir": data_dir}, overwrite=cfg.overwrite)
    return plan.folder("--output", cfg.output, resume_kind=REPRODUCE_KIND)


@contextlib.contextmanager
def output_folder(cfg: ReproduceConfig, data_dir: Path) -> Iterator[Path]:
    """The output folder under the write policy, locked for this run: a new or empty folder is claimed (marker
    "reproduce"); a reproduce output holding nothing mirrorbert did not write is continued (its cells are the cache);
    anything else needs --overwrite, which replaces only a folder mirrorbert wrote. The marker lists the files."""
    from mirrorbert.safeguards.writes import discard_folder, mark_folder, read_marker, record_files

    with _output_plan(cfg, data_dir).locked() as paths:
        out = Path(cfg.output)
        marker = read_marker(paths["--output"]) if paths["--output"].is_dir() else None
        if cfg.overwrite and paths["--output"].exists():
            discard_folder(paths["--output"])  # all of it mirrorbert's (checked above)
            marker = None
        out.mkdir(parents=True, exist_ok=True)
        if marker is None:
            mark_folder(out, REPRODUCE_KIND)
        try:
            yield out
        finally:
            record_files(out, REPRODUCE_KIND)


def _estimate_note(est: float | None, left: float | None) -> str:
    """` (est. 2 min; about 1 h left after it)` for a cell's progress line, or nothing without an estimate."""
    parts = ([f"est. {_fmt_s(est)}"] if est is not None else []) + \
        ([f"about {_fmt_s(left)} left after it"] if left is not None else [])
    return f" ({'; '.join(parts)})" if parts else ""


def _cache_result(out: Path, path: Path, result: CellResult) -> None:
    """A computed cell's result written into the output's cache, claimed in its marker before it is written."""
    from mirrorbert.safeguards.writes import claim_files, record_files, replace_file

    claim_files(out, [path.relative_to(out).as_posix()], REPRODUCE_KIND)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, jsonio.dumps(asdict(result), indent=1, ensure_ascii=False, default=str) + "\n")
    record_files(out, REPRODUCE_KIND)


def _reproduce(cfg: ReproduceConfig, experiments: list[str], data_dir: Path, out: Path,
               progress: Callable[[str], None], model_config: Any = None) -> ReproduceResult:
    from mirrorbert.reproduce.report import write_report
    from mirrorbert.reporting.metrics import library_versions
    from mirrorbert.safeguards.writes import record_files

    quick = QuickLimits() if cfg.quick else None
    if quick:  # every evaluation set cut to its first lines: a smoke test, not the paper's numbers
        data_dir = quick_data_dir(data_dir, out / "data" / "quick", quick)
    ctx = _Context(cfg, data_dir, out, quick)
    if not Path(cfg.model).exists():
        from mirrorbert.safeguards.preflight import check_model_reachable

        check_model_reachable(cfg.model)
    model_type = read_config(cfg.model).get("model_type")
    if not isinstance(model_type, str):
        model_type = "roberta" if "roberta" in cfg.model.lower() else "bert"
    cells, skipped = build_cells(experiments, data_dir, out, model_type, quick)
    record_files(out, REPRODUCE_KIND)  # the files build_cells derived into OUTPUT
    versions = library_versions()
    jobs = [(c, s) for c in cells for s in (cfg.seeds if c.seeded else (None,))]
    if not cfg.report_only:
        preflight(ctx, jobs, model_config)
    users = Counter(ctx.trained_model_dir(c, s) for c, s in jobs if c.train is not None)  # jobs per trained model
    start = time.perf_counter()
    keys = [cell_hash(ctx, c, s) for c, s in jobs]
    paths = [out / "cells" / f"{c.file_stem}--s{'x' if s is None else s}.json" for c, s in jobs]
    cache = [_load_cached(p, k) for p, k in zip(paths, keys)]
    todo = [] if cfg.report_only else [i for i, c in enumerate(cache) if c is None]
    plan = _plan(ctx, jobs, todo, progress)
    results: list[CellResult] = []
    computed = 0
    for i, (cell, seed) in enumerate(jobs):
        key, path, cached = keys[i], paths[i], cache[i]
        label = f"[{i + 1}/{len(jobs)}] {cell.id}" + ("" if seed is None else f" seed {seed}")
        if cached is not None:
            progress(f"{label}: cached")
            result = cached
        elif cfg.report_only:
            result = CellResult(cell.id, cell.experiment, cell.state, seed, key, {}, status="not run",
                                message="no cached result (--report-only)")
        else:
            est = plan.estimate(i)
            progress(f"{label}: running" + _estimate_note(est, plan.left_after(i)))
            result = _run_cell(ctx, cell, seed, key)
            result.versions, result.est_s = versions, est
            plan.done(i, result)
            computed += 1
            if result.status != "error":  # a failure is reported, never cached: the next run tries it again
                _cache_result(out, path, result)
            progress(f"{label}: done in {_fmt_s(result.wall_s)}" + (f" ({result.status}: {result.message})" if result.status != "ok" else ""))
        results.append(result)
        if cell.train is not None and not cfg.keep_models and not cfg.report_only:
            folder = ctx.trained_model_dir(cell, seed)
            users[folder] -= 1
            if users[folder] == 0 and folder.exists():
                remove_tree(folder)
    run = ReproduceResult(cfg, detect_base_model(cfg.model), results, skipped, computed, time.perf_counter() - start)
    run.report = write_report(run, data_dir, out, versions)
    return run
