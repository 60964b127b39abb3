"""Data flows one way: each package imports only packages of lower layers (module-level and lazy imports alike).

The order is the design (docs/development.md): commands, then the methods, the engine and evaluation, the
encoder, search, where work runs, data, reporting, the trust boundary, settings, and the flat leaves.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mirrorbert

PACKAGE = Path(mirrorbert.__file__).resolve().parent

# Highest first. A package may import itself and anything listed after it, nothing listed before it.
LAYERS = [
    "__init__", "__main__",
    "cli",
    "reproduce",
    "integrations",
    "gloss",
    "mlm",
    "mirror",
    "evaluation",
    "training",
    "encoder",
    "publish",
    "search",
    "runtime",
    "data",
    "reporting",
    "safeguards",
    "settings",
    "compat", "jsonio", "errors", "_version",
]
MOST_FLAT_MODULES = 10


def _layer_of(module: str) -> str:
    """`mirrorbert.encoder.model` -> `encoder`; `mirrorbert` itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imported_modules(path: Path, module: str, known: set[str]) -> set[str]:
    """What `module` imports; `from mirrorbert import x` is module `mirrorbert.x` when that is one, else the root."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name == "mirrorbert" or name.startswith("mirrorbert.")}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts).removesuffix(".__init__")] = path
    return modules


def upward_imports(modules: dict[str, Path], layers: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(layers)}
    wrong = []
    for module, path in sorted(modules.items()):
        own = _layer_of(module)
        for target in sorted(_imported_modules(path, module, set(modules))):
            other = _layer_of(target)
            if other == own:
                continue
            if rank[other] < rank[own]:
                wrong.append(f"{module} imports {target} ({other} is above {own})")
    return wrong


def test_every_package_and_flat_module_has_a_layer():
    modules = _modules()
    assert {_layer_of(m) for m in modules} <= set(LAYERS)
    assert len(modules) > 60  # the walk found the package


def test_no_import_runs_up_a_layer():
    assert upward_imports(_modules(), LAYERS) == []


def test_the_checker_sees_an_upward_import(tmp_path):
    low = tmp_path / "mirrorbert" / "data" / "strings.py"
    low.parent.mkdir(parents=True)
    low.write_text("def f():\n    from mirrorbert.mirror.train import train\n    from mirrorbert import __version__\n"
                   "    from mirrorbert import jsonio\n")
    jsonio = tmp_path / "mirrorbert" / "jsonio.py"
    jsonio.write_text("")
    wrong = upward_imports({"mirrorbert.data.strings": low, "mirrorbert.jsonio": jsonio}, LAYERS)
    assert wrong == ["mirrorbert.data.strings imports mirrorbert (__init__ is above data)",
                     "mirrorbert.data.strings imports mirrorbert.mirror.train (mirror is above data)"]


def test_few_modules_stay_flat():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MOST_FLAT_MODULES, flat


def test_every_package_says_what_it_owns():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.splitlines()[0]) > 20, init.parent.name
