"""Inputs that mean one thing (class 5 of the fault suite): lines end at `\\n` only, so row i of every output is line
i+1 of its input however many CRs a line holds; vectors that are not finite or have no direction are refused.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mirrorbert.cli.app import main
from mirrorbert.errors import UserError

LINES = ["a lone\rcarriage return", "plain", "two\r\rreturns\r", "crlf ends this one"]


@pytest.fixture
def cr_file(tmp_path):
    path = tmp_path / "cr.txt"
    path.write_bytes(b"a lone\rcarriage return\nplain\ntwo\r\rreturns\r\ncrlf ends this one\r\n")
    return path


def test_encode_gives_one_row_per_line_whatever_cr_a_line_holds(cr_file, tmp_path, tiny_bert, capsys):
    out = tmp_path / "v.npy"
    assert main(["encode", "--model", str(tiny_bert), "--input", str(cr_file), "--output", str(out),
                 "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 4 == len(cr_file.read_bytes().split(b"\n")) - 1
    assert np.load(out).shape[0] == 4


def test_search_ids_are_the_lines_of_the_corpus(cr_file, tiny_bert, capsys):
    assert main(["search", "--model", str(tiny_bert), "--corpus", str(cr_file), "--query", "plain", "--top-k", "4",
                 "--no-progress"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert sorted(h["id"] for h in hits) == [0, 1, 2, 3]
    assert {h["id"]: h["text"] for h in hits} == {0: LINES[0], 1: LINES[1], 2: "two\r\rreturns", 3: LINES[3]}


def test_readers_count_lines_as_wc_does(cr_file):
    from mirrorbert.data.readers import TextRows
    from mirrorbert.search.fingerprints import corpus_digest

    rows = TextRows(cr_file, option="--input")
    assert rows.count == corpus_digest(cr_file)[1] == 4
    assert [text for chunk in rows.chunks() for text in chunk] == ["a lone\rcarriage return", "plain",
                                                                    "two\r\rreturns", "crlf ends this one"]


@pytest.mark.parametrize("bad, words", [
    (np.array([[1.0, 0.0], [np.nan, 1.0]]), "vector 1 is not finite"),
    (np.array([[1.0, 0.0], [np.inf, 1.0]]), "vector 1 is not finite"),
    (np.array([[1.0, 0.0], [0.0, 0.0]]), "vector 1 is all zeros"),
])
def test_search_index_refuses_vectors_without_a_direction(bad, words):
    from mirrorbert.search.exact import SearchIndex

    with pytest.raises(UserError, match=f"^vectors: {words}"):
        SearchIndex.from_vectors(bad, use_faiss=False)
    with pytest.raises(UserError, match=f"^vectors: {words}"):
        SearchIndex.from_vectors(bad, use_faiss=False, normalize=False)


def test_a_zero_query_is_refused_not_answered_with_zeros():
    from mirrorbert.search.exact import SearchIndex

    index = SearchIndex.from_vectors(np.eye(3, dtype=np.float32), ["a", "b", "c"], use_faiss=False)
    assert index.search_vectors(np.array([[0.0, 1.0, 0.0]]), 1)[0][0].text == "b"
    with pytest.raises(UserError, match="^queries: vector 1 is all zeros"):
        index.search_vectors(np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 1)
