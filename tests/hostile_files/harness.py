"""The harness of the hostile-files table: crafted files and environments thrown at mirrorbert.

The options table (`tests/hostile_inputs.py`) asks whether a bad *option value* is refused in one line. This
table asks what happens when a *file* mirrorbert did not just write is hostile: a model folder, a checkpoint,
an index, a cache, a data file, a path someone else planted. Each case ends in exactly one of:

* ``ok``: the expected clean refusal (one ``mirrorbert: error:`` line naming the file or option, exit 2; for
  a Python call, a ``UserError`` naming it), or the expected correct work (the case's own check passes);
* ``code executed``: the case's canary file appeared (a crafted pickle, remote code, ...);
* ``clobbered``: a file the case registered as the user's (a "victim") changed, vanished or changed kind,
  or a temporary of mirrorbert's was left behind;
* ``hang``: the case did not finish within its time limit (a SIGALRM ends it);
* ``traceback``: an exception other than the clean refusal escaped;
* ``silent wrong``: the command succeeded where it should have refused, or its result failed the check;
* ``unnamed``: refused, but the line names neither the file nor the option.

Case modules are ``tests/hostile_files/cases_*.py``; each defines ``cases(env) -> list[FileCase]``.
``tests/safeguards/test_hostile_files.py`` runs every case; ``python tests/hostile_files/harness.py`` prints the counts:

    .venv/bin/python tests/hostile_files/harness.py [--json counts.json] [-k SUBSTRING]
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import logging
import os
import signal
import stat
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

OK, CODE, CLOBBERED, HANG, TRACEBACK, SILENT, UNNAMED = (
    "ok", "code executed", "clobbered", "hang", "traceback", "silent wrong", "unnamed")
KINDS = (OK, CODE, CLOBBERED, HANG, TRACEBACK, SILENT, UNNAMED)
REFUSED, WORKS = "refused", "works"


class Hang(BaseException):
    """Raised by the alarm: a BaseException so that no `except Exception` inside mirrorbert swallows it."""


@dataclass
class Context:
    """One case's scratch folder, the shared fixtures, and what the case declares about itself."""

    folder: Path
    env: dict[str, Path]
    victims: list[Path] = field(default_factory=list)

    @property
    def canary(self) -> Path:
        """A crafted payload writes here; its existence after the case means code from a file ran."""
        return self.folder / "CODE-EXECUTED"

    def victim(self, path: Path, content: bytes | None = b"precious\n") -> Path:
        """Register a file (created with `content` unless None) that the case must leave exactly as it was."""
        path = Path(path)
        if content is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        self.victims.append(path)
        return path

    def copy_model(self, name: str = "model") -> Path:
        """A fresh copy of the tiny model to damage."""
        import shutil

        dest = self.folder / name
        shutil.copytree(self.env["tiny"], dest)
        return dest

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        return path


@dataclass
class Result:
    """What the action did: exit code and stderr of a command, or a Python call's return value."""

    rc: int | None = None
    err: str = ""
    value: Any = None
    error_line: str = ""


@dataclass
class FileCase:
    """One crafted file or environment.

    `action(ctx)` either returns a command line (a list of strings, run through `mirrorbert.cli.app.main`) or
    performs a Python call itself and returns its value. `expect` is REFUSED (one clean error naming one of
    `names`) or WORKS (then `check(ctx, result)` returns a problem description, or None when the result is
    right). `setup(ctx)` crafts the files before the snapshot of the victims is taken.
    """

    id: str
    what: str  # the class of hostile file, as the threat model names it
    setup: Callable[[Context], None] | None
    action: Callable[[Context], Any]
    expect: str = REFUSED
    names: tuple[str, ...] = ()
    check: Callable[[Context, Result], str | None] | None = None
    timeout: float = 60.0
    ignore_leftovers: tuple[str, ...] = ()  # names a case itself leaves in its folder on purpose


@dataclass
class Outcome:
    kind: str
    detail: str = ""
    err: str = field(default="", repr=False)


# ----------------------------------------------------------------------------- shared fixtures
def make_environment(root: Path, data_dir: Path | None = None) -> dict[str, Path]:
    """The tiny model and a small data file, made once for the whole table."""
    from tiny_models import CORPUS, make_tiny_bert

    root.mkdir(parents=True, exist_ok=True)
    os.environ["MIRRORBERT_CACHE"] = str(root / "cache")  # token stores of the cases stay in the table's scratch
    env = {"root": root, "tiny": make_tiny_bert(root / "tiny")}
    env["data"] = root / "strings.txt"
    env["data"].write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    if data_dir is not None:
        env["shared"] = Path(data_dir)
    return env


def case_modules() -> list[str]:
    return sorted(f"hostile_files.{p.stem}" for p in Path(__file__).parent.glob("cases_*.py"))


def build_cases(env: dict[str, Path]) -> list[FileCase]:
    found: list[FileCase] = []
    for name in case_modules():
        found.extend(importlib.import_module(name).cases(env))
    ids = [c.id for c in found]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise AssertionError(f"duplicate hostile-file case ids: {duplicated}")
    return found


# ----------------------------------------------------------------------------- running one case
def _fingerprint(path: Path) -> tuple | None:
    """Kind, mode and content digest of a path, without following a final link (None: absent)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return kind, st.st_mode, hashlib.sha256(path.read_bytes()).hexdigest()
    if stat.S_ISLNK(st.st_mode):
        return kind, os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return kind, tuple(sorted(os.listdir(path)))
    return kind, st.st_rdev, st.st_ino


def _own_leftovers(folder: Path, before: set[str], ignore: tuple[str, ...]) -> list[str]:
    """Temporaries of mirrorbert's (`.NAME.tmp*`, `.NAME.lock`, `.NAME.old-*`) that appeared and stayed."""
    import re

    pattern = re.compile(r"^\..+\.(tmp|lock|old-)|^\.mirrorbert-write-test-|\.tmp-")
    left = []
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel not in before and pattern.search(name) and not any(rel.startswith(i) for i in ignore):
                left.append(rel)
    return sorted(left)


@contextlib.contextmanager
def _alarm(seconds: float):
    def ring(signum, frame):
        raise Hang(f"no answer after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_command(argv: list[str], err: io.StringIO) -> int | None:
    from mirrorbert.cli.app import main

    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own errors
        return exc.code if isinstance(exc.code, int) else 2


def run_case(case: FileCase, env: dict[str, Path], folder: Path) -> Outcome:
    from mirrorbert.errors import UserError

    folder.mkdir(parents=True, exist_ok=True)
    ctx = Context(folder=folder, env=env)
    if case.setup is not None:
        case.setup(ctx)
    snapshot = {victim: _fingerprint(victim) for victim in ctx.victims}
    before = {os.path.relpath(os.path.join(r, n), folder) for r, d, f in os.walk(folder) for n in f + d}
    err = io.StringIO()
    root_logger = logging.getLogger()
    handlers = root_logger.handlers[:]
    previous_cwd = os.getcwd()
    result, escaped, refused_api = Result(), None, None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            tempfile.TemporaryDirectory(prefix="hostile-file-cwd-") as scratch:
        root_logger.handlers = []
        os.chdir(scratch)
        try:
            with _alarm(case.timeout):
                value = case.action(ctx)
                if isinstance(value, list):
                    result.rc = _run_command(value, err)
                else:
                    result.value = value
        except Hang as exc:
            escaped = exc
        except UserError as exc:  # a Python call's clean refusal
            refused_api = exc
        except BaseException as exc:  # noqa: BLE001  what the table exists to find
            escaped = exc
            traceback.print_exc(file=err)
        finally:
            root_logger.handlers = handlers
            os.chdir(previous_cwd)
    text = err.getvalue()
    result.err = text
    errors = [line for line in text.splitlines() if line.startswith("mirrorbert") and ": error: " in line]
    result.error_line = errors[0] if errors else (str(refused_api).splitlines()[0] if refused_api else "")

    if ctx.canary.exists():
        return Outcome(CODE, f"canary written: {ctx.canary.read_text(errors='replace')[:200]}", text)
    changed = [str(v) for v, fp in snapshot.items() if _fingerprint(v) != fp]
    if changed:
        return Outcome(CLOBBERED, f"changed: {changed}", text)
    if isinstance(escaped, Hang):
        return Outcome(HANG, str(escaped), text)
    leftovers = _own_leftovers(folder, before, case.ignore_leftovers)
    if leftovers:
        return Outcome(CLOBBERED, f"temporaries left behind: {leftovers}", text)
    if escaped is not None or "Traceback (most recent call last)" in text:
        last = text.strip().splitlines()[-1] if text.strip() else type(escaped).__name__
        return Outcome(TRACEBACK, last, text)
    if case.expect == REFUSED:
        if refused_api is not None:
            message = str(refused_api)
            if "\n" in message.strip():
                return Outcome(UNNAMED, f"error of several lines: {message!r}", text)
            if case.names and not any(n in message for n in case.names):
                return Outcome(UNNAMED, f"{message!r} names none of {case.names}", text)
            return Outcome(OK, message, text)
        if result.rc is None:
            return Outcome(SILENT, f"the call returned {result.value!r:.200} instead of refusing", text)
        if result.rc != 2 or len(errors) != 1:
            return Outcome(SILENT, f"rc {result.rc}, {len(errors)} error lines", text)
        if case.names and not any(n in errors[0] for n in case.names):
            return Outcome(UNNAMED, f"{errors[0]!r} names none of {case.names}", text)
        return Outcome(OK, errors[0], text)
    if refused_api is not None:
        return Outcome(SILENT, f"refused work that should succeed: {refused_api}", text)
    if result.rc not in (None, 0):
        return Outcome(SILENT, f"rc {result.rc}: {result.error_line}", text)
    problem = case.check(ctx, result) if case.check is not None else None
    if problem:
        return Outcome(SILENT, problem, text)
    return Outcome(OK, "worked", text)


# ----------------------------------------------------------------------------- the whole table
def run_table(data_dir: Path | None, keyword: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hostile-files-") as tmp:
        env = make_environment(Path(tmp) / "env", data_dir)
        cases = [c for c in build_cases(env) if not keyword or keyword in c.id]
        counts = {kind: 0 for kind in KINDS}
        by_class: dict[str, int] = {}
        bad = []
        for i, case in enumerate(cases):
            outcome = run_case(case, env, Path(tmp) / "cases" / f"{i:04d}")
            counts[outcome.kind] += 1
            by_class[case.what] = by_class.get(case.what, 0) + 1
            if outcome.kind != OK:
                bad.append({"case": case.id, "kind": outcome.kind, "detail": outcome.detail})
                print(f"{outcome.kind:>14}  {case.id}: {outcome.detail}", file=sys.stderr)
    return {"tried": len(cases), **counts, "by_class": by_class, "not_ok": bad}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA",
                                                            str(TESTS.parents[1] / "shared" / "data")))
    parser.add_argument("--json", help="write the counts and every case that was not ok here")
    parser.add_argument("-k", help="only cases whose id contains this text")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    data_dir = Path(args.data_dir).resolve()
    report = run_table(data_dir if data_dir.is_dir() else None, args.k)
    print(json.dumps({k: v for k, v in report.items() if k != "not_ok"}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0 if report[OK] == report["tried"] else 1


if __name__ == "__main__":
    sys.exit(main())
