"""Curves of the scale benchmarks, drawn from their JSON (nothing is timed here): train_scale.json and index_scale.json.

Left and middle: `train`'s peak RSS and time to the first step against the number of strings (cold token cache).
Right: the approximate index's recall@10 and its speed-up over exact search against nprobe, per corpus size.

    python benchmarks/plot_scale.py --output docs/benchmarks/scale.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def train_panels(rss_ax, start_ax, report: dict) -> None:
    runs = sorted((r for r in report["runs"] if r["cache"] == "cold"), key=lambda r: r["strings"])
    sizes = [r["strings"] for r in runs]
    for ax, key, label in ((rss_ax, "peak_rss_gb", "peak RSS (GB)"),
                           (start_ax, "first_step_s", "seconds to the first step (cold token cache)")):
        ax.plot(sizes, [r[key] for r in runs], "o-")
        for size, run in zip(sizes, runs):
            ax.annotate(f"{run[key]:g}", (size, run[key]), textcoords="offset points", xytext=(4, -12))
        ax.set_xscale("log")
        ax.set_xlabel("training strings")
        ax.set_ylabel(label)
    rss_ax.set_title("train: peak memory")
    start_ax.set_title("train: start-up")


def index_panel(ax, report: dict) -> None:
    for size in report["sizes"]:
        sweep = size["nprobe_sweep"]
        probes = sorted(map(int, sweep))
        label = f"{size['rows']:,} x {size['dim']}"
        ax.plot([sweep[str(p)]["queries_per_s"] / size["exact_queries_per_s"] for p in probes],
                [sweep[str(p)]["recall_at_10"] for p in probes], "o-", label=label)
    ax.axhline(0.95, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("queries/s, times exact search's (nprobe 8 ... 128)")
    ax.set_ylabel("recall@10 against exact")
    ax.set_title("index --index-type ivf")
    ax.legend(loc="lower left")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default=str(DOCS / "train_scale.json"))
    parser.add_argument("--index", default=str(DOCS / "index_scale.json"))
    parser.add_argument("--output", default=str(DOCS / "scale.png"))
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss, start, index) = plt.subplots(1, 3, figsize=(15, 4.2))
    train_panels(rss, start, json.loads(Path(args.train).read_text(encoding="utf-8")))
    index_panel(index, json.loads(Path(args.index).read_text(encoding="utf-8")))
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
