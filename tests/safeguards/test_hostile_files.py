"""The hostile-files table (tests/hostile_files/): every crafted file or environment ends in a clean refusal
or correct work; no code runs from a file, nothing of the user's is clobbered, nothing hangs or tracebacks.

The whole table is marked slow (CI runs it); `python tests/hostile_files/harness.py` prints the counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile_files import harness

_PLACEHOLDER = {"root": Path("/nonexistent"), "tiny": Path("/nonexistent/tiny"),
                "data": Path("/nonexistent/strings.txt"), "shared": Path("/nonexistent/shared")}
_IDS = [case.id for case in harness.build_cases(_PLACEHOLDER)]


@pytest.fixture(scope="module")
def environment(tmp_path_factory, shared_data):
    env = harness.make_environment(tmp_path_factory.mktemp("hostile-files-env"), shared_data)
    return env, {case.id: case for case in harness.build_cases(env)}


def test_the_table_has_every_class_and_unique_ids():
    cases = harness.build_cases(_PLACEHOLDER)
    assert len(set(_IDS)) == len(_IDS)
    assert len(cases) >= 860


@pytest.mark.slow
@pytest.mark.parametrize("case_id", _IDS)
def test_hostile_file(environment, tmp_path, case_id):
    env, cases = environment
    outcome = harness.run_case(cases[case_id], env, tmp_path / "case")
    assert outcome.kind == harness.OK, f"{case_id} -> {outcome.kind}: {outcome.detail}\n{outcome.err[-3000:]}"
