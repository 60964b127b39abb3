"""One table of the architecture matrix from pytest's JUnit XML: a row per type, a column per precision, each cell
`ok`, `skip` or `FAIL (test)`; used by scripts/gpu_check.sh.

    python scripts/matrix_table.py matrix.xml
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict

PRECISIONS = ("fp32", "bf16", "fp16")
CELL = re.compile(r"^(?P<test>test_\w+)\[(?P<type>[\w.-]+)-(?P<precision>fp32|bf16|fp16)\]$")


def table(xml_path: str) -> str:
    cells: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for case in ElementTree.parse(xml_path).getroot().iter("testcase"):
        match = CELL.match(case.get("name", ""))
        if match is None:
            continue
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcome = f"FAIL ({match['test']})" if failed else "skip" if skipped else "ok"
        cells[match["type"]][match["precision"]].append(outcome)
    lines = ["| type | " + " | ".join(PRECISIONS) + " |", "|---|" + "---|" * len(PRECISIONS)]
    for kind in sorted(cells):
        row = []
        for precision in PRECISIONS:
            outcomes = cells[kind][precision]
            failures = [o for o in outcomes if o.startswith("FAIL")]
            row.append(", ".join(failures) if failures else ("skip" if outcomes and set(outcomes) == {"skip"}
                                                              else "ok" if outcomes else "-"))
        lines.append(f"| {kind} | " + " | ".join(row) + " |")
    counts = defaultdict(int)
    for kind in cells:
        for precision in PRECISIONS:
            for outcome in cells[kind][precision]:
                counts["FAIL" if outcome.startswith("FAIL") else outcome] += 1
    lines.append("")
    lines.append("tests: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
