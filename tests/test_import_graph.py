"""The package's import graph (module-level and function-level imports alike) has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import mirrorbert

SRC = Path(mirrorbert.__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / "mirrorbert").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every mirrorbert module `name` imports (anywhere in the file), by its longest known prefix."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            # importing a submodule runs its parent package's __init__, which is no edge of ours
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_package_import_graph_has_no_cycle():
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert len(graph) > 30 and any(graph.values())  # the parse found the package and its imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
