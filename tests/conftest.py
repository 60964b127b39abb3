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


# The package's say-it-once memos (module, attribute): put back after each test, so a warning one test
# triggered is still said in the next. A new module-level memo belongs here.
MEMOS = [("mirrorbert.encoder.architectures", "_told"), ("mirrorbert.runtime.device", "_warned_slow"),
         ("mirrorbert.runtime.device", "_warned_slow_bf16")]


def _copy_memo(value):
    if isinstance(value, (set, list)):
        return type(value)(value)
    if hasattr(value, "items"):  # a dict or a WeakKeyDictionary, its values copied too (sets filled in place)
        return {key: _copy_memo(item) for key, item in value.items()}
    return value


def _put_memo_back(module, name, saved) -> None:
    current = getattr(module, name)
    if isinstance(current, list):
        current[:] = saved
    elif isinstance(current, set) or hasattr(current, "items"):  # emptied and refilled: others hold it
        current.clear()
        current.update(saved)
    else:
        setattr(module, name, saved)


@pytest.fixture(autouse=True)
def no_state_left_behind():
    """Each test starts from the same process state, whatever ran before it (the suite runs in a random order):
    the loggers' levels, handlers and switches (a library's logger made during the test stays as the library set
    it up), the root logger's handlers (pytest's own capture handlers are pytest's business), and the package's
    say-it-once memos (`MEMOS`) are put back as they were before the test."""
    import importlib
    import logging

    root, manager = logging.getLogger(), logging.Logger.manager
    loggers = {name: lg for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    saved = {name: (lg.level, lg.propagate, lg.disabled, list(lg.handlers)) for name, lg in loggers.items()}
    root_level, root_handlers, disable = root.level, list(root.handlers), manager.disable
    memos = []
    for module_name, name in MEMOS:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            memos.append((module, name, _copy_memo(getattr(module, name))))
    yield
    for module, name, value in memos:
        _put_memo_back(module, name, value)
    if manager.disable != disable:
        logging.disable(disable)
    if root.level != root_level:
        root.setLevel(root_level)
    ours = [h for h in root_handlers if type(h).__module__ != "_pytest.logging"]
    for handler in [h for h in root.handlers if h not in ours and type(h).__module__ != "_pytest.logging"]:
        root.removeHandler(handler)
    for handler in [h for h in ours if h not in root.handlers]:
        root.addHandler(handler)
    for name, lg in list(manager.loggerDict.items()):
        if not isinstance(lg, logging.Logger) or (name not in saved and not name.startswith("mirrorbert")):
            continue  # a library's logger made during the test is the library's set-up, kept as it made it
        level, propagate, disabled, handlers = saved.get(name, (logging.NOTSET, True, False, []))
        if lg.level != level:
            lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled
        lg.handlers[:] = [h for h in lg.handlers if h in handlers] + [h for h in handlers if h not in lg.handlers]


def pytest_collection_finish(session):
    """The order's seed, on the first line (also under -q): a failure that depends on the order reruns with it."""
    seed = getattr(session.config.option, "randomly_seed", None)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if seed is not None and reporter is not None:
        reporter.write_line(f"tests in a random order: --randomly-seed={seed} reruns this order, -p no:randomly "
                            "runs them in file order")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and exitstatus not in (0, 5):
        terminalreporter.write_line(f"this order: --randomly-seed={seed}")


@pytest.fixture(scope="session", autouse=True)
def audit_hook(tmp_path_factory):
    """The run-time guard of the trust boundary over every test (tests/audit_opens.py)."""
    import audit_opens

    audit_opens.install([tmp_path_factory.getbasetemp(), SHARED_DATA])
    return audit_opens.Audit


@pytest.fixture(autouse=True)
def no_open_around_the_reader(audit_hook):
    """A test fails when mirrorbert read a file of an untrusted folder other than through the reader."""
    audit_hook.seen = []
    audit_hook.active = True
    yield
    audit_hook.active = False
    if audit_hook.seen:
        pytest.fail("opened around the confined reader:\n" + "\n".join(sorted(set(audit_hook.seen))[:10]),
                    pytrace=False)


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
