"""`python -m mirrorbert.cli.quickstart_summary BEFORE.json AFTER.json MODEL`: the quickstart's last words.

Compares the user's run with itself only: STS-B dev before and after Mirror-BERT, both from the two
`mirrorbert eval` JSON files of this run, and, where the model is the offline reference MLM pre-trained
here, what that pre-training got on this machine. No score of another run is quoted: a number from
someone else's machine, model or budget reads as a promise this run did not make.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def stsb_dev(path: Path) -> float:
    return float(json.loads(Path(path).read_text(encoding="utf-8"))["tasks"]["sts"]["metrics"]["stsb_dev"])


def summary_lines(before_json: Path, after_json: Path, model: str) -> list[str]:
    before, after = 100 * stsb_dev(before_json), 100 * stsb_dev(after_json)
    lines = ["== Summary",
             f"STS-B dev split (1,500 pairs), Spearman x100 of cosine vs gold, this run: before {before:.2f} -> "
             f"after {after:.2f} ({after - before:+.2f})",
             f"(the scores: {before_json} and {after_json})"]
    record = Path(model) / "quickstart_reference.json"
    if record.is_file():  # the offline reference MLM pre-trained by this quickstart
        from mirrorbert.safeguards.readback import parse_json, read_regular_bytes

        ref = parse_json(read_regular_bytes(record, "--model", 1 << 20), "--model", record)
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
