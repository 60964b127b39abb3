import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread, for this process and the commands tests start (scripts/test.sh sets the same): the suite's time
# does not depend on the machine's cores or its load. A test may set its own count; it is put back after it.
TEST_THREADS = 1
os.environ.setdefault("OMP_NUM_THREADS", str(TEST_THREADS))
os.environ.setdefault("MKL_NUM_THREADS", str(TEST_THREADS))
if "MIRRORBERT_CACHE" not in os.environ:  # token stores and MLM corpora of the tests: never the user's ~/.cache
    import atexit
    import shutil
    import tempfile

    _CACHE = tempfile.mkdtemp(prefix="mirrorbert-test-cache-")
    os.environ["MIRRORBERT_CACHE"] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

from tiny_models import CORPUS, make_tiny_bert, make_tiny_roberta  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MIRRORBERT_DATA", REPO.parent / "shared" / "data")).resolve()
if os.environ.get("MIRRORBERT_DATA"):  # absolute: tests that run commands in a scratch cwd read it too
    os.environ["MIRRORBERT_DATA"] = str(SHARED_DATA)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """torch at TEST_THREADS threads in every test, whatever the one before set."""
    import torch

    if torch.get_num_threads() != TEST_THREADS:
        torch.set_num_threads(TEST_THREADS)
    yield


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory) -> Path:
    return make_tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"))


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return list(CORPUS)


@pytest.fixture
def strings_file(tmp_path, corpus) -> Path:
    """The corpus as a text file, one string per line."""
    path = tmp_path / "strings.txt"
    path.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "README.md").exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


# Made by the tools themselves, never by a command under test.
_TOOL_ENTRIES = {".pytest_cache", ".hypothesis", "__pycache__", ".venv", ".venv-floors", ".coverage"}


@pytest.fixture(scope="session", autouse=True)
def nothing_written_into_the_repository():
    """A command under test that writes a relative path into the cwd (the repository when pytest starts there)
    fails the run: such stray files were once committed (a fuzzed `--output 2.65e-127` of reproduce)."""
    before = set(os.listdir(REPO))
    yield
    stray = sorted(set(os.listdir(REPO)) - before - _TOOL_ENTRIES)
    assert not stray, f"tests wrote into the repository root: {stray}"
