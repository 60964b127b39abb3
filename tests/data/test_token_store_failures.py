"""The token cache where it cannot be written or opened: a link planted where its own folder goes is refused and
never written through; a full disk, a file too large or a short write is one line and leaves nothing; a store
that cannot be opened (too many open files, no permission) is one line and is never set aside as damaged, while
one whose content fails the check is."""

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
from transformers import AutoTokenizer

from mirrorbert.data import token_cache
from mirrorbert.data.readers import chunked
from mirrorbert.data.strings import fingerprint
from mirrorbert.data.token_store import open_token_store
from mirrorbert.data.token_stream import prepare_corpus
from mirrorbert.errors import UserError


@pytest.fixture
def tok(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def _open(strings, tok, cache=None):
    return open_token_store(chunked(strings, 5), fingerprint(strings), tok, 16, cache)


@pytest.mark.parametrize("kind", ["tokens", "mlm-corpus"])
def test_a_link_planted_at_the_caches_own_folder_is_refused_not_written_through(tok, corpus, tmp_path, monkeypatch,
                                                                                kind):
    monkeypatch.setenv("MIRRORBERT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache" / kind).symlink_to(tmp_path / "elsewhere")
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        if kind == "tokens":
            _open(list(corpus), tok)
        else:
            prepare_corpus(text, tok, eval_fraction=0.0, show_progress=False)
    message = str(info.value)
    assert "\n" not in message and f"cache/{kind}: is a symlink" in message and "never written through" in message
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert (tmp_path / "cache" / kind).is_symlink()  # left as it is


def test_a_cache_root_the_user_named_may_be_a_link(tok, corpus, tmp_path, monkeypatch):
    """A cache moved to another disk: $MIRRORBERT_CACHE (or --cache-dir) itself a link to a folder."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "disk")
    monkeypatch.setenv("MIRRORBERT_CACHE", str(tmp_path / "cache"))
    store = _open(list(corpus), tok)
    assert list(store.strings) == list(corpus) and store.root.parent == tmp_path / "cache" / "tokens"
    assert (tmp_path / "disk" / "tokens" / store.root.name).is_dir()


@pytest.mark.parametrize("error, words", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device"),
    (OSError("98852 requested and 51200 written"), "98852 requested and 51200 written (a short write"),
])
@pytest.mark.parametrize("layout", ["strings", "corpus"])
def test_a_failed_write_is_one_line_and_leaves_nothing(tok, corpus, tmp_path, monkeypatch, error, words, layout):
    def fail(writer, fh, data):
        raise error

    monkeypatch.setattr(token_cache.ArrayWriter, "write", fail)
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        if layout == "strings":
            _open(list(corpus), tok, tmp_path / "cache")
        else:
            prepare_corpus(text, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    message = str(info.value)
    option = "MIRRORBERT_CACHE" if layout == "strings" else "--cache-dir"
    assert "\n" not in message and message.startswith(f"{option} {tmp_path / 'cache'}: cannot write")
    assert words in message
    assert list((tmp_path / "cache").iterdir()) == []


def _run(script: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


OPEN = """
    import resource, sys
    from pathlib import Path
    from transformers import AutoTokenizer
    from mirrorbert.data.readers import chunked
    from mirrorbert.data.strings import fingerprint
    from mirrorbert.data.token_store import open_token_store
    from mirrorbert.errors import UserError

    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    strings = [f"string number {i} of the store, long enough to fill a file" for i in range(3000)]
    args = (chunked(strings, 500), fingerprint(strings), tok, 32, Path(sys.argv[2]))
    {limit}
    try:
        open_token_store(*args)
    except UserError as exc:
        print(exc)
        sys.exit(2)
"""


def test_a_file_too_large_for_the_limit_is_one_line_and_leaves_nothing(tiny_bert, tmp_path):
    """A real RLIMIT_FSIZE (Python ignores SIGXFSZ, so the write fails with EFBIG), in a process of its own."""
    limit = "resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))"
    done = _run(OPEN.replace("{limit}", limit), tiny_bert, tmp_path / "cache")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.count("\n") == 1 and "cannot write it: file too large" in done.stdout
    assert "Traceback" not in done.stderr
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_store_that_cannot_be_opened_for_want_of_descriptors_is_not_damaged(tiny_bert, tok, corpus, tmp_path):
    """`ulimit -n`: a valid store, opened with no descriptor left, is one line naming too many open files; it is
    left as it is, never set aside."""
    strings = [f"string number {i} of the store, long enough to fill a file" for i in range(3000)]
    built = open_token_store(chunked(strings, 500), fingerprint(strings), tok, 32, tmp_path / "cache")
    built.close()
    limit = ("low = __import__('os').open('/dev/null', 0); __import__('os').close(low); "
             "resource.setrlimit(resource.RLIMIT_NOFILE, (low, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))")
    done = _run(OPEN.replace("{limit}", limit), tiny_bert, tmp_path / "cache")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.count("\n") == 1 and "Too many open files" in done.stdout
    assert "manifest.json: cannot open it (Too many open files); the cache was left as it is" in done.stdout
    assert "Traceback" not in done.stderr
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [built.root.name]  # nothing set aside
    again = open_token_store(iter(()), fingerprint(strings), tok, 32, tmp_path / "cache")
    assert again.root == built.root and len(again) == len(strings)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its permissions")
def test_a_store_file_without_read_permission_is_not_damaged(tok, corpus, tmp_path):
    store = _open(list(corpus), tok, tmp_path)
    store.close()
    (store.root / "ids.bin").chmod(0)
    try:
        with pytest.raises(UserError, match="ids.bin: permission denied.*left as it is"):
            _open(list(corpus), tok, tmp_path)
        assert [p.name for p in tmp_path.iterdir()] == [store.root.name]
    finally:
        (store.root / "ids.bin").chmod(0o644)


def test_a_store_whose_content_fails_the_check_is_set_aside(tok, corpus, tmp_path, caplog):
    store = _open(list(corpus), tok, tmp_path)
    store.close()
    manifest = json.loads((store.root / "manifest.json").read_text())
    data = bytearray((store.root / "text.bin").read_bytes())
    data[-1] ^= 0x01  # bit rot in the last string: the file's size and the manifest unchanged
    (store.root / "text.bin").write_bytes(bytes(data))
    again = _open(list(corpus), tok, tmp_path)
    assert list(again.strings) == list(corpus)
    assert json.loads((again.root / "manifest.json").read_text())["files"] == manifest["files"]
    warnings = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warnings) == 1 and "text.bin" in warnings[0], warnings
    assert len(list(tmp_path.glob(f"{store.root.name}.damaged-*"))) == 1
