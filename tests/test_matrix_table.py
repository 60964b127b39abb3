"""scripts/matrix_table.py: the GPU check's one table of the architecture matrix, from pytest's JUnit XML."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "matrix_table.py"

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.encoder.test_architectures" name="test_trains_and_encodes_finite_distinct_vectors[bert-fp32]"/>
<testcase classname="tests.encoder.test_architectures" name="test_trains_and_encodes_finite_distinct_vectors[bert-bf16]">
  <failure message="boom">trace</failure></testcase>
<testcase classname="tests.encoder.test_architectures" name="test_loads_back_in_mirrorbert_with_the_same_vectors[bert-bf16]"/>
<testcase classname="tests.encoder.test_architectures" name="test_trains_and_encodes_finite_distinct_vectors[xlm-roberta-fp16]">
  <skipped message="no"/></testcase>
<testcase classname="tests.encoder.test_architectures" name="test_deberta_v1_runs_bf16_in_fp32_with_one_line"/>
</testsuite></testsuites>"""


def test_one_row_per_type_and_a_failure_names_its_test(tmp_path):
    spec = importlib.util.spec_from_file_location("matrix_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "m.xml").write_text(XML, encoding="utf-8")
    lines = module.table(str(tmp_path / "m.xml")).splitlines()
    assert lines[0] == "| type | fp32 | bf16 | fp16 |"
    assert "| bert | ok | FAIL (test_trains_and_encodes_finite_distinct_vectors) | - |" in lines
    assert "| xlm-roberta | - | - | skip |" in lines
    assert lines[-1] == "tests: 1 FAIL, 2 ok, 1 skip"
