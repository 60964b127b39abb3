"""`python -m mirrorbert.cli.quickstart_summary BEFORE.json AFTER.json MODEL`: the quickstart's last words, STS-B
dev before and after from this run's two eval reports (and the offline reference MLM's pre-training, where the
model is it); no score of another run is quoted."""

from __future__ import annotations

import sys
from pathlib import Path

from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import parse_json, read_regular_bytes


def stsb_dev(path: Path) -> float:
    """STS-B dev of an eval report this quickstart has just written (read as a regular file, size bounded)."""
    report = parse_json(read_regular_bytes(Path(path), "eval report", 64 << 20), "eval report", Path(path))
    return float(report["tasks"]["sts"]["metrics"]["stsb_dev"])


def summary_lines(before_json: Path, after_json: Path, model: str) -> list[str]:
    before, after = 100 * stsb_dev(before_json), 100 * stsb_dev(after_json)
    lines = ["== Summary",
             f"STS-B dev split (1,500 pairs), Spearman x100 of cosine vs gold, this run: before {before:.2f} -> "
             f"after {after:.2f} ({after - before:+.2f})",
             f"(the scores: {before_json} and {after_json})"]
    folder = ConfinedFolder(model, "--model", "model folder") if Path(model).is_dir() else None
    if folder is not None and folder.exists("quickstart_reference.json"):  # the offline reference MLM pre-trained here
        ref = folder.read_json("quickstart_reference.json", limit=1 << 20)
        arch = ref.get("plan", {}).get("architecture", "reference")
        accuracy = ref.get("eval_accuracy")
        lines.append(f"The model trained from is the offline reference MLM ({arch}) pre-trained here on "
                     f"{ref['max_tokens']:,} tokens in {ref['wall_time_s']:.0f} s"
                     + (f" (held-out masked accuracy {100 * accuracy:.1f}%)" if accuracy is not None else "")
                     + ": its scores follow the tokens this machine fitted in the budget (QUICKSTART_BUDGET_S).")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m mirrorbert.cli.quickstart_summary BEFORE.json AFTER.json MODEL", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(Path(args[0]), Path(args[1]), args[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
