"""Run the cells of ``cells.py``: train (once per training configuration and seed), evaluate, cache.

Each (cell, seed) result is written to ``<output>/cells/<cell>--s<seed>.json`` with a hash of
everything it depends on (cell spec, base model, seed, data fingerprints, library versions of
mirrorbert); a rerun reuses every file whose hash matches, so an interrupted run resumes and a
rerun computes only what is missing. Trained models live in ``<output>/models/`` until the last
cell that needs them is done (``keep_models`` keeps them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.reproduce.cells import Cell, QuickLimits, build_cells
from mirrorbert.reproduce.results import CellResult, ReproduceConfig, ReproduceResult
from mirrorbert.reproduce.paper import detect_base_model

logger = logging.getLogger(__name__)

#: Task name -> data folders whose content the cell's result depends on (fingerprinted).
TASK_DATA = {
    "sts": ("sts",), "wordsim": ("wordsim",), "qnli": ("qnli",), "bel": ("bel",), "bli": ("bli",),
    "isotropy": ("sts/STSBenchmark",), "lexsub": ("lexsub", "wordnet"), "finetune-sts": ("sts/STSBenchmark",),
}

# ----------------------------------------------------------------------------- fingerprints
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
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


def model_identity(model: str) -> str:
    """The base model's identity: its config and weight file sizes for a folder, its name otherwise."""
    folder = Path(model)
    if not folder.is_dir():
        return model
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes() if f.suffix == ".json" else str(f.stat().st_size).encode())
    return h.hexdigest()


def _hash(obj: Any, output: Path | None = None) -> str:
    """Short SHA-256 of `obj` as sorted JSON; paths inside `output` count relative to it, so a moved or
    copied output folder keeps its keys (what the runner derives there is fingerprinted by content)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    if output is not None:
        text = text.replace(json.dumps(str(output))[1:-1], "<output>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _model_type(model: str) -> str:
    try:
        return json.loads((Path(model) / "config.json").read_text(encoding="utf-8")).get("model_type", "")
    except (OSError, ValueError):
        return "roberta" if "roberta" in model.lower() else "bert"


# ----------------------------------------------------------------------------- the run
class _Context:
    """What a cell computation needs: the configuration, folders, base encoder cache."""

    def __init__(self, cfg: ReproduceConfig, data_dir: Path, out: Path, quick: QuickLimits | None):
        self.cfg, self.data_dir, self.out, self.quick = cfg, data_dir, out, quick
        self.models_dir = out / "models"
        self.plots_dir = out / "plots"
        self._base_encoders: dict[str, Any] = {}

    def base_encoder(self, pooling: str):
        from mirrorbert.encoder import Encoder

        if pooling not in self._base_encoders:
            self._base_encoders[pooling] = Encoder.load(self.cfg.model, pooling=pooling, device=self.cfg.device)
        return self._base_encoders[pooling]

    # -- training configurations
    def train_overrides(self, cell: Cell, seed: int) -> dict[str, Any]:
        assert cell.train is not None
        overrides = {**cell.train, **self.cfg.train_options, "model": self.cfg.model, "seed": seed,
                     "device": self.cfg.device, "show_progress": False}
        if self.quick:
            overrides["steps"] = self.quick.steps
            overrides["batch_size"] = self.quick.batch_size
            if overrides.get("limit") is None or overrides["limit"] > self.quick.strings:
                overrides["limit"] = self.quick.strings
            if overrides.get("random_strings"):
                overrides["random_strings"] = min(overrides["random_strings"], self.quick.strings)
            if overrides.get("words_top"):
                overrides["words_top"] = min(overrides["words_top"], self.quick.strings)
        return overrides

    def trained_model_dir(self, cell: Cell, seed: int) -> Path:
        return self.models_dir / f"mirror-{_hash([model_identity(self.cfg.model), self.train_overrides(cell, seed)])}"

    def gr_model_dir(self, arch: str, seed: int) -> Path:
        return self.models_dir / f"gr-{arch}-{_hash([model_identity(self.cfg.model), self.gr_options(arch, seed)])}"

    def gr_options(self, arch: str, seed: int) -> dict[str, Any]:
        import torch

        opts: dict[str, Any] = {"arch": arch, "seed": seed, "triplets": "wordnet",
                                "precision": "bf16" if torch.cuda.is_available() else "fp32"}
        if self.quick:
            opts.update(limit=self.quick.gr_triplets, epochs=1, steps=self.quick.steps, batch_size=self.quick.batch_size)
        opts.update(self.cfg.gr_options)
        return opts


def cell_hash(ctx: _Context, cell: Cell, seed: int | None) -> str:
    from mirrorbert import __version__

    data = {d: fingerprint(ctx.data_dir / d) for d in TASK_DATA.get(cell.evaluation.task, ())}
    train = ctx.train_overrides(cell, seed) if cell.train is not None else None
    if train and train.get("data"):
        data["train"] = fingerprint(Path(train["data"]))
    return _hash({"cell": cell.spec(), "model": model_identity(ctx.cfg.model), "seed": seed, "train": train,
                  "gr": ctx.gr_options(cell.gr_arch, seed or 0) if cell.gr_arch else None, "data": data,
                  "quick": asdict(ctx.quick) if ctx.quick else None, "eval_batch_size": ctx.cfg.eval_batch_size,
                  "mirrorbert": __version__}, output=ctx.out)


def _train_command(overrides: dict[str, Any], output: Path) -> str:
    skip = {"show_progress", "model"}
    args = [f"mirrorbert train --model {overrides['model']}"]
    for key, value in overrides.items():
        if key in skip or value is None or value is False:
            continue
        opt = "--" + key.replace("_", "-")
        args.append(opt if value is True else f"{opt} {value}")
    args.append(f"--output {output}")
    return " ".join(args)


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
        from mirrorbert.config import resolve_config
        from mirrorbert.trainer import train

        overrides = ctx.train_overrides(cell, seed)
        folder = ctx.trained_model_dir(cell, seed)
        command = _train_command(overrides, folder)
        data = {"train": fingerprint(Path(overrides["data"]))} if overrides.get("data") else {}
        if not (folder / "mirrorbert.json").is_file():
            result = train(resolve_config({**overrides, "output": str(folder), "overwrite": True}))
            if result.interrupted:
                raise KeyboardInterrupt
        return str(folder), [command], data
    if cell.gr_arch is not None:
        from mirrorbert.gloss.pretrain import GlossPretrainConfig, pretrain

        opts = ctx.gr_options(cell.gr_arch, seed or 0)
        folder = ctx.gr_model_dir(cell.gr_arch, seed or 0)
        command = (f"mirrorbert gloss-pretrain --model {ctx.cfg.model} --data-dir {ctx.data_dir} --output {folder} "
                   + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in opts.items()))
        if not (folder / "config.json").is_file():
            gcfg = GlossPretrainConfig(model=ctx.cfg.model, output=str(folder), data_dir=str(ctx.data_dir), overwrite=True,
                                       device=ctx.cfg.device, show_progress=False, **opts)
            gcfg.validate()
            result = pretrain(gcfg)
            if result.interrupted:
                raise KeyboardInterrupt
        return str(folder), [command], {"wordnet": fingerprint(ctx.data_dir / "wordnet")}
    return ctx.cfg.model, [], {}


def compute_cell(ctx: _Context, cell: Cell, seed: int | None) -> CellResult:
    """Train (if needed) and evaluate one cell for one seed."""
    from mirrorbert.evaluation.runner import evaluate

    start = time.perf_counter()
    model, commands, data = _prepare_model(ctx, cell, seed)
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
                                 show_progress=False)
        summary = finetune_sts(fcfg).summary()
        result.metrics = {f"stsb_{float(k) * 100:g}%": v["mean"] / 100.0 for k, v in summary.items()}
    else:
        if cell.train is None and cell.gr_arch is None:
            encoder = ctx.base_encoder(ev.pooling or "mean")
        else:
            from mirrorbert.encoder import Encoder

            encoder = Encoder.load(model, pooling=ev.pooling, device=ctx.cfg.device)
        plot_dir = ctx.plots_dir / cell.file_stem / f"s{seed}"
        reference = ctx.base_encoder("mean") if ev.reference_base else None
        outcome = evaluate(encoder, tasks=[ev.task], data_dir=ctx.data_dir, plot_dir=plot_dir,
                           batch_size=ctx.cfg.eval_batch_size, task_options={ev.task: dict(ev.options)},
                           reference_encoder=reference, model_name=model)[ev.task]
        result.status, result.message = outcome.status, outcome.message
        kept = {k: v for k, v in outcome.metrics.items() if ev.keep is None or k in ev.keep or k in ev.rename}
        result.metrics = {ev.rename.get(k, k): v for k, v in kept.items()}
        result.skipped = dict(outcome.skipped_parts)
        result.artifacts = {k: os.path.relpath(v, ctx.out) for k, v in outcome.artifacts.items()}
    result.wall_s = time.perf_counter() - start
    return result


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _load_cached(path: Path, key: str) -> CellResult | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("config_hash") != key:
        return None
    data["cached"] = True
    return CellResult(**data)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def reproduce(cfg: ReproduceConfig, progress: Callable[[str], None] | None = None) -> ReproduceResult:
    """Run every cell the data allows (resuming from the cache) and write results.json + report.md."""
    from mirrorbert.evaluation.datasets import resolve_data_dir
    from mirrorbert.reproduce.report import write_report
    from mirrorbert.training.metrics import library_versions

    experiments = cfg.validate()
    progress = progress or logger.info
    data_dir = resolve_data_dir(cfg.data_dir)
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    quick = QuickLimits() if cfg.quick else None
    ctx = _Context(cfg, data_dir, out, quick)
    if not Path(cfg.model).exists():
        from mirrorbert.encoder import check_model_reachable

        check_model_reachable(cfg.model)
    cells, skipped = build_cells(experiments, data_dir, out, _model_type(cfg.model), quick)
    versions = library_versions()
    jobs = [(c, s) for c in cells for s in (cfg.seeds if c.seeded else (None,))]
    users: dict[Path, int] = {}
    for c, s in jobs:
        if c.train is not None:
            users[ctx.trained_model_dir(c, s)] = users.get(ctx.trained_model_dir(c, s), 0) + 1
    start = time.perf_counter()
    durations: dict[bool, list[float]] = {True: [], False: []}  # trains? -> wall times of computed cells
    results: list[CellResult] = []
    computed = 0
    for i, (cell, seed) in enumerate(jobs, 1):
        key = cell_hash(ctx, cell, seed)
        path = out / "cells" / f"{cell.file_stem}--s{'x' if seed is None else seed}.json"
        cached = _load_cached(path, key)
        label = f"[{i}/{len(jobs)}] {cell.id}" + ("" if seed is None else f" seed {seed}")
        if cached is not None:
            progress(f"{label}: cached")
            result = cached
        elif cfg.report_only:
            result = CellResult(cell.id, cell.experiment, cell.state, seed, key, {}, status="not run",
                                message="no cached result (--report-only)")
        else:
            trains = cell.train is not None or cell.gr_arch is not None
            known = durations[trains] or durations[not trains]
            est = statistics.fmean(known) if known else None
            left = sum(statistics.fmean(durations[c.train is not None or c.gr_arch is not None] or known)
                       for c, _ in jobs[i:]) if known else None
            progress(f"{label}: running" + (f" (est. {_fmt_s(est)}; about {_fmt_s(left)} left after it)" if est else ""))
            try:
                result = compute_cell(ctx, cell, seed)
            except UserError as exc:  # e.g. a training set too small: recorded, the grid goes on
                result = CellResult(cell.id, cell.experiment, cell.state, seed, key, {}, status="error", message=str(exc))
            result.config_hash, result.versions = key, versions
            durations[trains].append(result.wall_s)
            computed += 1
            _write_json(path, asdict(result))
            progress(f"{label}: done in {_fmt_s(result.wall_s)}" + (f" ({result.status}: {result.message})" if result.status != "ok" else ""))
        results.append(result)
        if cell.train is not None and not cfg.keep_models and not cfg.report_only:
            folder = ctx.trained_model_dir(cell, seed)
            users[folder] -= 1
            if users[folder] == 0 and folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
    run = ReproduceResult(cfg, detect_base_model(cfg.model), results, skipped, computed, time.perf_counter() - start)
    run.report = write_report(run, data_dir, out, versions)
    return run
