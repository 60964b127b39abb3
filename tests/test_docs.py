"""The documentation: the MkDocs site builds with every warning an error, and the README stays a short entry point.

The site needs the `docs` packages (mkdocs, mkdocs-material, mkdocstrings[python]), which are in the `test`
extra, so CI runs these tests. The build reads only local files (`theme.font: false`: no Google Fonts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 320


def test_site_builds_strict_and_renders_the_api_docstrings(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # Encoder.encode's docstring, rendered by mkdocstrings (its first line, then the anchor of the method).
    assert "Vectors in input order" in api
    assert 'id="mirrorbert.encoder.model.Encoder.encode"' in api
    for page in ("guide/quickstart", "guide/serving", "reference/cli", "guide/training", "guide/saved-model", "guide/search", "guide/evaluation", "guide/pretraining",
                 "guide/reproduce", "guide/export", "guide/mteb", "guide/hub", "benchmarks", "development",
                 "results"):
        assert (site / page / "index.html").is_file(), page


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the details belong in docs/"


def _relative_links(markdown: str) -> list[str]:
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)  # code blocks hold no links
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, flags=re.M)  # reference-style definitions
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I) and not t.startswith("#")]


def test_readme_relative_links_point_to_existing_files():
    links = _relative_links(README.read_text(encoding="utf-8"))
    assert links, "the README links into the docs"
    missing = [link for link in links if not (ROOT / link.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_python_snippet_runs_offline_and_does_not_collapse(tiny_bert, tmp_path, monkeypatch, shared_data):
    """The README's Python block, run as written but for two paths: the quickstart's reference MLM (built by
    ./scripts/quickstart.sh within a 10-minute budget) becomes a tiny local BERT, the 10k STS-B sentences
    their first 400."""
    import json

    from mirrorbert.mlm.reference import ReferencePlan, model_dir
    from mirrorbert.mirror.collapse import SMALL_MODEL_LR

    block = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S).group(1)
    reference = model_dir(Path("runs/quickstart-reference-mlm"), ReferencePlan()).as_posix()
    data = "../shared/data/corpora/stsbenchmark_train_10k_sents_random_sampled.txt"
    assert f'model="{reference}"' in block and f'data="{data}"' in block
    assert float(re.search(r"\blr=([0-9.e+-]+)", block).group(1)) == SMALL_MODEL_LR  # the collapse advice's lr
    sentences = (shared_data / data.removeprefix("../shared/data/")).read_text(encoding="utf-8").splitlines()[:400]
    (tmp_path / "s.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    code = block.replace(reference, str(tiny_bert)).replace(data, str(tmp_path / "s.txt"))
    code = code.replace("mirrorbert.TrainConfig(", "mirrorbert.TrainConfig(show_progress=False, ", 1)
    monkeypatch.chdir(tmp_path)  # out/ is written here
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    collapse = json.loads((tmp_path / "out" / "mirrorbert.json").read_text())["training"]["collapse"]
    assert collapse["collapsed"] is False and collapse["mean_pairwise_cosine"] < collapse["threshold"]
    assert namespace["vecs"].shape[0] == 2 and len(namespace["hits"]) == 2


def _commands_in_docs() -> dict[str, str]:
    """Where the README's and the guide's commands write (--output and the like), each with its page."""
    found: dict[str, str] = {}
    for page in [README, *sorted((ROOT / "docs" / "guide").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        code = "\n".join(re.findall(r"```.*?```", text, flags=re.S) + re.findall(r"^ {4}.*$", text, flags=re.M))
        for target in re.findall(r"--(?:output|checkpoint-dir|log-dir|work|report) ([^\s`\"')\\]+)", code):
            if not target.isupper():  # DIR, a placeholder
                found.setdefault(target, page.name)
    return found


def test_every_output_the_docs_suggest_is_ignored_by_git():
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    outputs = _commands_in_docs()
    assert {"out/", "served/", "names.index"} <= set(outputs)  # the parse finds the commands

    def ignored(path: str) -> bool:
        return any(subprocess.run(["git", "check-ignore", "--no-index", "-q", candidate], cwd=ROOT).returncode == 0
                   for candidate in (path, path.rstrip("/") + "/"))

    missing = {path: page for path, page in outputs.items() if not ignored(path)}
    assert not missing, f".gitignore lacks what these pages' commands write: {missing}"


def test_generated_pages_are_up_to_date():
    """docs/reference/cli.md (from the parser) and docs/index.md (from the README): scripts/gen_docs.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    stale = [str(page.relative_to(ROOT)) for page in gen_docs.stale_pages()]
    assert not stale, f"out of date: {stale}; run python scripts/gen_docs.py"
    cli = gen_docs.CLI_PAGE.read_text(encoding="utf-8")
    for command in ("train", "encode", "search", "index", "eval", "pretrain-mlm", "reproduce"):
        assert f"## mirrorbert {command}\n" in cli
    assert "| `--batch-size BATCH_SIZE` | batch size; strings per forward pass (default: 64) |" in cli


def test_the_cli_reference_check_fails_on_a_changed_option(monkeypatch):
    """The staleness check compares with the parser as it is now: an option's new default shows."""
    import importlib.util

    from mirrorbert.reproduce.results import ReproduceConfig
    from mirrorbert.settings.fields import field_of

    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    monkeypatch.setattr(field_of(ReproduceConfig, "seeds"), "default", (43,))  # the field --seeds is made from
    assert gen_docs.CLI_PAGE in gen_docs.stale_pages()
