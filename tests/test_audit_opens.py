"""The run-time guard itself (tests/audit_opens.py): an open on mirrorbert's behalf inside a watched folder is
seen, unless the reader made it or the test's own code did."""

from __future__ import annotations

import audit_opens
from mirrorbert.safeguards.readback import open_checked

AROUND = "def read(path):\n    with open(path, 'rb') as fh:\n        return fh.read()\n"


def _mirrorbert_function():
    """`read(path)` as if it were a module of mirrorbert's (its frames carry a file name under src/mirrorbert)."""
    namespace: dict = {}
    exec(compile(AROUND, audit_opens.SRC + "pretend.py", "exec"), namespace)
    return namespace["read"]


def test_an_open_around_the_reader_is_seen_and_the_readers_own_is_not(tmp_path, audit_hook):
    path = tmp_path / "file.txt"
    path.write_text("x", encoding="utf-8")
    audit_hook.seen = []
    _mirrorbert_function()(path)
    seen, audit_hook.seen = list(audit_hook.seen), []
    assert len(seen) == 1 and str(path) in seen[0] and "pretend.py" in seen[0]
    import os

    os.close(open_checked(path))  # the reader's own open
    path.read_text(encoding="utf-8")  # the test's own read
    assert audit_hook.seen == []


def test_what_this_process_just_wrote_is_not_watched_but_a_look_alike_is(tmp_path, audit_hook):
    """A file inside a temporary this process made (its owner record in the name) is its own output; the same
    name with another process's record is a stranger's folder."""
    from mirrorbert.safeguards.writes.temporaries import make_temporary

    own = make_temporary(tmp_path / "served", folder=True)
    other = tmp_path / own.name.replace(".tmp-", ".tmp-1", 1)
    for folder in (own, other):
        folder.mkdir(exist_ok=True)
        (folder / "model.onnx").write_bytes(b"graph")
    audit_hook.seen = []
    _mirrorbert_function()(own / "model.onnx")
    assert audit_hook.seen == []
    _mirrorbert_function()(other / "model.onnx")
    seen, audit_hook.seen = list(audit_hook.seen), []
    assert len(seen) == 1 and str(other / "model.onnx") in seen[0]
