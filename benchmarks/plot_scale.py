"""Curves of the scale benchmarks, drawn from their JSON (nothing is timed here): scale.json and index_scale.json.

Top: `train` against the sentence-transformers peer as the number of strings grows: peak RSS, seconds to the
first step, steps/s. Bottom: wall time and peak RSS of `encode`, `index` and `search --index` (and the peer's
`encode`) against the number of strings; the approximate index's recall@10 against its speed-up over exact
search (nprobe 8 ... 128) per corpus size.

    python benchmarks/plot_scale.py --output docs/benchmarks/scale.png
    python benchmarks/plot_scale.py --table          # the rows of scale.json as a Markdown table instead
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
STYLE = {"train": "o-", "peer-train": "s--", "encode": "o-", "index": "^-", "search": "v-", "peer-encode": "s--"}
LABEL = {"train": "mirrorbert train", "peer-train": "sentence-transformers trainer", "encode": "mirrorbert encode",
         "index": "mirrorbert index", "search": "search --index (1,000 queries)", "peer-encode": "sentence-transformers encode"}


TIMES = ("wall_s", "first_step_s", "steps_per_s")


def figure(row: dict, key: str):
    """A row's figure; a time of a run that shared the machine (`time_comparable: false`) is not drawn, or is
    its `quiet_times` entry (a quiet run of the same command) when it has one."""
    if key in TIMES and row.get("time_comparable") is False:
        return (row.get("quiet_times") or {}).get(key)
    return row.get(key)


def curve(ax, rows: list[dict], part: str, key: str, annotate: bool = False) -> None:
    points = sorted((r["strings"], figure(r, key)) for r in rows if r["part"] == part and figure(r, key) is not None)
    if not points:
        return
    ax.plot([n for n, _ in points], [v for _, v in points], STYLE[part], label=LABEL[part])
    if annotate:
        for n, v in points:
            ax.annotate(f"{v:g}", (n, v), textcoords="offset points", xytext=(4, -12), fontsize=8)


def by_size(ax, rows, parts, key, ylabel, title, log_y=False) -> None:
    for part in parts:
        curve(ax, rows, part, key, annotate=len(parts) <= 2)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("strings")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def index_panel(ax, report: dict) -> None:
    for size in report["sizes"]:
        sweep = size["nprobe_sweep"]
        probes = sorted(map(int, sweep))
        ax.plot([sweep[str(p)]["queries_per_s"] / size["exact_queries_per_s"] for p in probes],
                [sweep[str(p)]["recall_at_10"] for p in probes], "o-", label=f"{size['rows']:,} x {size['dim']}")
    ax.axhline(0.95, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("queries/s, times exact search's (nprobe 8 ... 128)")
    ax.set_ylabel("recall@10 against exact")
    ax.set_title("index --index-type ivf")
    ax.legend(loc="lower left", fontsize=8)


COLUMNS = (("wall_s", "wall s"), ("first_step_s", "first step s"), ("steps_per_s", "steps/s"),
           ("peak_rss_gb", "peak RSS GB"), ("peak_anon_gb", "anonymous GB"), ("peak_file_gb", "mapped files GB"))


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, (int, float)):
        return "-"
    return f"({value:g})" if key in TIMES and row.get("time_comparable") is False else f"{value:g}"


def table(rows: list[dict]) -> str:
    """One line per (strings, part); a figure a part does not have is a dash, a time measured while other work
    shared the machine is in parentheses."""
    lines = ["| strings | command | " + " | ".join(label for _, label in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for row in sorted(rows, key=lambda r: (r["strings"], list(LABEL).index(r["part"]) if r["part"] in LABEL else 99)):
        if row["part"] not in LABEL:
            continue
        cells = [_cell(row, key) for key, _ in COLUMNS]
        lines.append(f"| {row['strings']:,} | {LABEL[row['part']]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default=str(DOCS / "scale.json"))
    parser.add_argument("--index", default=str(DOCS / "index_scale.json"))
    parser.add_argument("--output", default=str(DOCS / "scale.png"))
    parser.add_argument("--table", action="store_true", help="print scale.json as a Markdown table, draw nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.scale).read_text(encoding="utf-8"))["rows"]))
        return 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(Path(args.scale).read_text(encoding="utf-8"))["rows"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    train = ("train", "peer-train")
    by_size(axes[0, 0], rows, train, "peak_rss_gb", "peak RSS (GB)", "train: peak memory")
    by_size(axes[0, 1], rows, train, "first_step_s", "seconds", "train: start-up to the first step", log_y=True)
    by_size(axes[0, 2], rows, train, "steps_per_s", "steps/s (batch 200)", "train: speed")
    serve = ("encode", "index", "search", "peer-encode")
    by_size(axes[1, 0], rows, serve, "wall_s", "seconds", "encode, index, search: wall time", log_y=True)
    by_size(axes[1, 1], rows, serve, "peak_rss_gb", "peak RSS (GB)", "encode, index, search: peak memory")
    index_panel(axes[1, 2], json.loads(Path(args.index).read_text(encoding="utf-8")))
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
