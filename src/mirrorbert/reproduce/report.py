"""results.json, report.md and PNG plots of a `mirrorbert reproduce` run.

Every cell appears as ours | paper | Δ when the base model is one of the paper's (and the paper has
that cell), ours only otherwise; values x100 as in the project's other reports (the paper prints
fractions: .556 is 55.6 here). Over several seeds a value is mean ± sample standard deviation.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import statistics
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mirrorbert.jsonio as jsonio
from mirrorbert.evaluation.sts import pyplot_figure, save_figure
from mirrorbert.reproduce.cells import EXPERIMENTS
from mirrorbert.reproduce.paper import load_paper_numbers, paper_value

if TYPE_CHECKING:
    from mirrorbert.reproduce.results import CellResult, ReproduceResult

logger = logging.getLogger(__name__)


def aggregate(results: list[CellResult], base_model: str | None) -> OrderedDict[str, dict[str, Any]]:
    """Cell id -> metrics over seeds (mean, std, values) with the paper's value and Δ where it has one."""
    cells: OrderedDict[str, dict[str, Any]] = OrderedDict()
    for r in results:
        entry = cells.setdefault(r.cell, {"experiment": r.experiment, "state": r.state, "x": r.x, "runs": []})
        entry["runs"].append(r)
    for cell_id, entry in cells.items():
        runs: list[CellResult] = entry.pop("runs")
        ok = [r for r in runs if r.status == "ok"]
        metrics: OrderedDict[str, dict[str, Any]] = OrderedDict()
        for name in dict.fromkeys(k for r in ok for k in r.metrics):
            values = [r.metrics[name] for r in ok if name in r.metrics]
            m: dict[str, Any] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
                                 "values": values}
            cell = paper_value(entry["experiment"], base_model, entry["state"], name)
            if cell is not None:
                m.update(paper=cell.value, delta=m["mean"] - cell.value, paper_table=cell.table, paper_id=cell.id)
            metrics[name] = m
        entry.update(
            metrics=metrics,
            status="ok" if ok else runs[0].status,
            message="; ".join(sorted({r.message for r in runs if r.message})),
            seeds=[r.seed for r in runs],
            wall_s=sum(r.wall_s for r in runs if not r.cached) or sum(r.wall_s for r in runs),
            est_s=sum(r.est_s for r in runs if r.est_s is not None and not r.cached) or None,
            cached=all(r.cached for r in runs),
            skipped=dict(kv for r in runs for kv in r.skipped.items()),
            artifacts=dict(kv for r in runs for kv in r.artifacts.items()),
            commands=runs[0].commands, data=runs[0].data, data_note=runs[0].data_note,
        )
    return cells


def _x100(value: float | None, digits: int = 1) -> str:
    """x100 with `digits` decimals; tiny values (isotropy scores of 1e-9) keep 3 significant digits."""
    if value is None:
        return "-"
    scaled = value * 100
    return f"{scaled:.3g}" if 0 < abs(scaled) < 1 else f"{scaled:.{digits}f}"


def _ours(m: dict[str, Any]) -> str:
    s = _x100(m["mean"])
    return s if m["std"] is None else f"{s} ± {_x100(m['std'])}"


def _plot_curves(cells: dict[str, dict[str, Any]], experiment: str, path: Path, xlabel: str) -> Path | None:
    series: dict[str, list[tuple[float, float, float]]] = {}
    for entry in cells.values():
        if entry["experiment"] != experiment or entry["x"] is None:
            continue
        for name, m in entry["metrics"].items():
            series.setdefault(f"{entry['state']}: {name}", []).append((entry["x"], m["mean"] * 100, (m["std"] or 0) * 100))
    if not series:
        return None
    fig, ax = pyplot_figure(figsize=(6, 3.6))
    for label, points in series.items():
        points.sort()
        xs, ys, es = zip(*points)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("score x100")
    if experiment == "datasize":
        ax.set_xscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=110)


def _plot_before_after(cells: dict[str, dict[str, Any]], path: Path) -> Path | None:
    """One bar pair per (experiment, metric) that has both a 'before' and an 'after' cell."""
    pairs: list[tuple[str, float, float]] = []
    last = {(e["experiment"], cid.split("/", 2)[2] if cid.count("/") >= 2 else ""): e for cid, e in cells.items()}
    for cid, entry in cells.items():
        after = last[(entry["experiment"], cid.split("/", 2)[2] if cid.count("/") >= 2 else "")]
        if entry["state"] != "before" or not after["state"].startswith("after"):
            continue
        for name, m in entry["metrics"].items():
            if name in after["metrics"] and name not in ("stsb_dev",):
                pairs.append((f"{entry['experiment']}\n{name}", m["mean"] * 100, after["metrics"][name]["mean"] * 100))
    if not pairs:
        return None
    import numpy as np

    pairs = pairs[:24]
    fig, ax = pyplot_figure(figsize=(max(6, 0.55 * len(pairs) + 2), 3.8))
    idx = np.arange(len(pairs))
    ax.bar(idx - 0.2, [p[1] for p in pairs], 0.4, label="before")
    ax.bar(idx + 0.2, [p[2] for p in pairs], 0.4, label="after Mirror-BERT")
    ax.set_xticks(idx, [p[0] for p in pairs], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("score x100")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, dpi=110)


def _compare_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One row per (cell, metric): ours | paper | Δ."""
    lines = ["| cell | metric | ours | paper | Δ |", "|---|---|---:|---:|---:|"]
    for cid, e in rows:
        if e["status"] != "ok":
            lines.append(f"| {cid} | {e['status']}: {e['message']} | | | |")
            continue
        for name, m in e["metrics"].items():
            delta = "-" if "delta" not in m else f"{m['delta'] * 100:+.1f}"
            lines.append(f"| {cid} | {name} | {_ours(m)} | {_x100(m.get('paper'))} | {delta} |")
    return lines


def _wide_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Ours only: one row per cell, one column per metric."""
    names = list(dict.fromkeys(n for _, e in rows for n in e["metrics"]))
    lines = ["| cell | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for cid, e in rows:
        if e["status"] != "ok":
            lines.append(f"| {cid} | {e['status']}: {e['message']} |" + " |" * (len(names) - 1))
            continue
        lines.append(f"| {cid} | " + " | ".join(_ours(e["metrics"][n]) if n in e["metrics"] else "-" for n in names) + " |")
    return lines


def results_json(run: ReproduceResult, cells: dict[str, dict[str, Any]], versions: dict[str, str],
                 data_dir: Path) -> dict[str, Any]:
    return {
        "model": run.config.model, "base_model": run.base_model, "paper_comparison": run.base_model is not None,
        "command": run.config.command, "config": asdict(run.config), "data_dir": str(data_dir), "versions": versions,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "scale": "fractions (x100 in the report); paper values as printed in the paper",
        "computed_cells": run.computed, "wall_s": run.wall_s,
        "cells": cells, "skipped": [asdict(s) for s in run.skipped],
        "paper_numbers": {"file": "mirrorbert/reproduce/paper_numbers.json",
                          "unverified": load_paper_numbers()["unverified"]},
    }


def markdown(run: ReproduceResult, cells: dict[str, dict[str, Any]], versions: dict[str, str], data_dir: Path,
             plots: dict[str, Path], out: Path) -> str:
    lines = _header(run, versions, data_dir)
    failed = run.failed
    if failed:
        lines += ["## Failed cells", "", "Not cached: rerun the same command to try them again.", ""]
        lines += [f"- **{r.cell}**" + ("" if r.seed is None else f" seed {r.seed}") + f": {r.message}" for r in failed]
        lines.append("")
    if "before_after" in plots:
        lines += [f"![before vs after]({os.path.relpath(plots['before_after'], out)})", ""]
    experiments = list(dict.fromkeys(e["experiment"] for e in cells.values()))
    experiments += [s.experiment for s in run.skipped if s.experiment not in experiments]
    for exp in dict.fromkeys(experiments):
        lines += _experiment(run, exp, [(cid, e) for cid, e in cells.items() if e["experiment"] == exp], plots, out)
    absent = dict(kv for e in cells.values() for kv in e["skipped"].items())
    if absent:
        lines += ["## Skipped data", ""] + [f"- **{k}**: {v}" for k, v in absent.items()] + [""]
    lines += _cell_details(cells)
    lines += ["", "## Paper numbers not recorded", ""]
    lines += [f"- {u['what']}: {u['why']}" for u in load_paper_numbers()["unverified"]]
    lines.append("")
    return "\n".join(lines)


def _header(run: ReproduceResult, versions: dict[str, str], data_dir: Path) -> list[str]:
    return [f"# Reproduction report: `{run.config.model}`", "",
            f"- command: `{run.config.command or 'mirrorbert reproduce'}`",
            f"- papers: {run.config.paper}; seeds: {', '.join(map(str, run.config.seeds))}"
            + ("; **--quick smoke test: not a result**" if run.config.quick else ""),
            "- base model: " + (f"**{run.base_model}**, one of the paper's: cells show ours | paper | Δ"
                                 if run.base_model is not None else "not one of the paper's base models "
                                 "(bert-base-uncased, roberta-base, mBERT, PubMedBERT at base size): ours only"),
            f"- data directory: `{data_dir}`",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
            f"- {run.computed} cell runs computed now, {len(run.results) - run.computed} reused from the cache; "
            f"this run took {run.wall_s:.0f} s",
            "- values x100; the paper's numbers come from `paper_numbers.json` (source and table of each)", ""]


def _experiment(run: ReproduceResult, exp: str, rows: list[tuple[str, dict[str, Any]]], plots: dict[str, Path],
                out: Path) -> list[str]:
    """One experiment's section: its table, the data it tuned on, what was skipped, and its plots."""
    table, title, _ = EXPERIMENTS.get(exp, ("", exp, None))
    lines = [f"## {title} ({table})", ""]
    if rows:
        lines += _compare_table(rows) if run.base_model is not None else _wide_table(rows)
        lines.append("")
        notes = list(dict.fromkeys(f"{cid}: {e['data_note']}" for cid, e in rows if e["data_note"]))
        if notes:
            lines += ["Tuned on:", ""] + [f"- {n}" for n in notes] + [""]
    parts = list(dict.fromkeys(part for _, e in rows for part in e["skipped"]))
    missing = [s for s in run.skipped if s.experiment == exp]
    if parts or missing:
        lines += ["Skipped:", ""]
        if parts:
            lines.append(f"- evaluation sets absent: {', '.join(parts)} (see [Skipped data](#skipped-data))")
        lines += [f"- {s.what}: needs {s.needs}" for s in missing]
        lines.append("")
    for cid, e in rows:
        for label, rel in e["artifacts"].items():
            if (out / rel).is_file():
                lines += [f"![{cid}: {label}]({Path(rel).as_posix()})", ""]
            else:  # a cell cached by another run keeps its plot there: say so rather than embed a broken image
                lines += [f"- {cid}: {label}: `{Path(rel).as_posix()}` is not in this folder (the cell came "
                          f"from a cache written by another run)", ""]
    if exp in plots:
        lines += [f"![{title}]({os.path.relpath(plots[exp], out)})", ""]
    return lines


def _cell_details(cells: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["## Cell details", "", "Estimated s: printed before the cell ran (measured throughput x the cell's work).",
             "", "| cell | seeds | estimated s | wall s | cached | data (sha256) | commands |",
             "|---|---|---:|---:|---|---|---|"]
    for cid, e in cells.items():
        data = "<br>".join(f"{k} `{v[:12]}`" for k, v in e["data"].items())
        cmds = "<br>".join(f"`{c}`" for c in e["commands"])
        seeds = ",".join("-" if s is None else str(s) for s in e["seeds"])
        est = "-" if e["est_s"] is None else f"{e['est_s']:.1f}"
        lines.append(f"| {cid} | {seeds} | {est} | {e['wall_s']:.1f} | {'yes' if e['cached'] else 'no'} | {data} | {cmds} |")
    return lines


def write_report(run: ReproduceResult, data_dir: Path, out: Path, versions: dict[str, str]) -> Path:
    from mirrorbert.safeguards.writes import REPRODUCE_KIND, claim_files, write_text_atomic

    # named in the output's marker before they are written: an interrupted write stays mirrorbert's
    claim_files(out, ["plots/datasize.png", "plots/frequency.png", "plots/before_after.png", "results.json",
                      "report.md"], REPRODUCE_KIND)
    cells = aggregate(run.results, run.base_model)
    plots = {exp: _plot_curves(cells, exp, out / "plots" / f"{exp}.png", xlabel) for exp, xlabel in
             (("datasize", "training strings"), ("frequency", "frequency bucket (1 = most frequent 10k)"))}
    plots["before_after"] = _plot_before_after(cells, out / "plots" / "before_after.png")
    plots = {name: path for name, path in plots.items() if path is not None}
    write_text_atomic(out / "results.json", jsonio.dumps(results_json(run, cells, versions, data_dir), indent=1,
                                                       ensure_ascii=False, default=str) + "\n", overwrite=True)
    report = out / "report.md"
    write_text_atomic(report, markdown(run, cells, versions, data_dir, plots, out) + "\n", overwrite=True)
    logger.info("report written to %s", report)
    return report
