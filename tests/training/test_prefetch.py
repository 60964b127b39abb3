"""The batch prefetch thread (training/prefetch.py): order kept, errors surfaced, early stop without a hang."""

from __future__ import annotations

import threading

import pytest

from mirrorbert.training.prefetch import prefetch


def test_prefetch_keeps_order_and_raises():
    assert list(prefetch(iter(range(50)), depth=3)) == list(range(50))

    def broken():
        yield 1
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        list(prefetch(broken(), depth=2))
    # stopping early does not hang
    gen = prefetch(iter(range(10_000)), depth=2)
    assert next(gen) == 0
    gen.close()


def test_prefetch_runs_ahead_in_another_thread_and_depth_zero_runs_inline():
    where = []

    def items():
        for i in range(3):
            where.append(threading.current_thread().name)
            yield i

    assert list(prefetch(items(), depth=2, name="ahead")) == [0, 1, 2] and set(where) == {"ahead"}
    where.clear()
    assert list(prefetch(items(), depth=0)) == [0, 1, 2] and set(where) == {threading.current_thread().name}
