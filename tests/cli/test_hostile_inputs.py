"""The table of bad inputs (tests/hostile_inputs.py): every case is refused with one `mirrorbert...: error:`
line naming its option or file, exit 2, no traceback, before weights load or the engine starts.

The whole table (over 600 cases, a few minutes) is marked slow; `python tests/hostile_inputs.py` prints the
counts. The cases of the issue's list have their own fast tests in test_refuse_early.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hostile_inputs as table

_PLACEHOLDER = Path("/nonexistent-placeholder")
_IDS = [case.id for case in table.build_cases({
    key: _PLACEHOLDER / key.replace(":", "_") for key in
    ["root", "shared", "tiny", "data", "triplets", "foreign", "foreign-file", "a-file"]
    + [f"model:{d}" for d in [*table.MODEL_DAMAGES, "a-file"]] + [f"data:{d}" for d in table.DATA_DAMAGES]
})]


@pytest.fixture(scope="module")
def cases(tmp_path_factory, shared_data):
    env = table.make_environment(tmp_path_factory.mktemp("hostile"), shared_data)
    return {case.id: case for case in table.build_cases(env)}


def test_the_table_is_large_and_every_id_is_unique():
    assert len(_IDS) >= 300 and len(set(_IDS)) == len(_IDS)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", _IDS)
def test_bad_input_is_refused_before_work(cases, case_id):
    case = cases[case_id]
    outcome = table.run_case(case)
    assert outcome.kind == table.REFUSED, (
        f"{case.argv}\n-> {outcome.kind} (rc {outcome.rc}): {outcome.detail}\n{outcome.err[-3000:]}")
