"""The token store: the same strings and ids as a whole read, cached by content, a damaged cache set aside."""

import errno
import hashlib
import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from mirrorbert.data import token_cache, token_store
from mirrorbert.data.readers import chunked
from mirrorbert.data.token_store import ListStore, open_token_store, store_key
from mirrorbert.data.strings import fingerprint
from mirrorbert.errors import UserError
from mirrorbert.mirror.views import tokenize_once

ODD = ["naïve café au lait", "東京の天気は晴れ", "emoji 🙂 in the middle", "\u200b\u200b", "\x01\x02",
       "a " * 40, "tabs\tand  spaces"]


@pytest.fixture(params=["tiny_bert", "tiny_roberta"])
def tok(request):
    return AutoTokenizer.from_pretrained(request.getfixturevalue(request.param))


def _strings(corpus):
    return list(corpus) + ODD


def _open(strings, tok, cache, max_length=16, chunk=5):
    return open_token_store(chunked(strings, chunk), fingerprint(strings), tok, max_length, cache)


def test_same_strings_and_ids_as_tokenising_the_whole_list(tok, corpus, tmp_path):
    strings = _strings(corpus)
    store = _open(strings, tok, tmp_path, chunk=5)  # chunks of 5: every chunk boundary crossed
    whole = tokenize_once(tok, strings, 16)
    special = {int(i) for i in tok.all_special_ids}
    kept = [i for i, ids in enumerate(whole) if any(t not in special for t in ids)]
    if "Bert" in type(tok).__name__:  # BERT's normaliser drops zero-width and control characters (byte BPE keeps them)
        assert len(kept) < len(strings)
    assert len(store) == len(kept) and store.dropped == len(strings) - len(kept)
    assert store.token_ids(range(len(store))) == [whole[i] for i in kept]
    assert list(store.strings) == [strings[i] for i in kept] == store.texts(range(len(store)))
    assert store.strings[-1] == strings[kept[-1]] and store.strings[1:3] == [strings[kept[1]], strings[kept[2]]]
    assert store.token_ids([3, 0, 3]) == [whole[kept[3]], whole[kept[0]], whole[kept[3]]]
    assert store.max_chars == max(len(strings[i]) for i in kept)
    assert store.max_real_tokens == max(sum(t not in special for t in whole[i]) for i in kept)
    listed = ListStore([strings[i] for i in kept], [whole[i] for i in kept], special)
    assert (listed.max_chars, listed.max_real_tokens) == (store.max_chars, store.max_real_tokens)


def test_a_second_open_reads_the_cache_not_the_strings(tiny_bert, corpus, tmp_path, caplog):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    first = _open(corpus, tok, tmp_path)

    def never():
        raise AssertionError("the strings were read again")
        yield

    caplog.set_level("INFO", logger="mirrorbert")
    again = open_token_store(never(), fingerprint(corpus), tok, 16, tmp_path)
    assert again.root == first.root and again.token_ids(range(len(again))) == first.token_ids(range(len(first)))
    assert "using the token store" in caplog.text
    # another length limit or other strings: another key
    assert store_key(fingerprint(corpus), tok, 8) != store_key(fingerprint(corpus), tok, 16)
    assert store_key(fingerprint(corpus[1:]), tok, 16) != store_key(fingerprint(corpus), tok, 16)


def _rewrite(root, name, data: bytes, fix_checksum: bool):
    (root / name).write_bytes(data)
    if fix_checksum:  # a consistent edit: only the content checks can catch it
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["files"][name] = hashlib.sha256((root / name).read_bytes()).hexdigest()
        (root / "manifest.json").write_text(json.dumps(manifest))


DAMAGE = {
    "flipped byte": lambda root: _rewrite(root, "ids.bin", b"\xff" + (root / "ids.bin").read_bytes()[1:], False),
    "truncated": lambda root: _rewrite(root, "text.bin", (root / "text.bin").read_bytes()[:-3], False),
    "manifest garbage": lambda root: (root / "manifest.json").write_text("{not json"),
    "manifest nested": lambda root: (root / "manifest.json").write_text("[" * 100000),
    "manifest of another key": lambda root: (root / "manifest.json").write_text(json.dumps({"complete": True})),
    "id outside the vocabulary": lambda root: _rewrite(
        root, "ids.bin", np.full(len((root / "ids.bin").read_bytes()) // 4, 10**6, dtype=np.int32).tobytes(), True),
    "offsets out of order": lambda root: _rewrite(
        root, "ids_offsets.bin", np.frombuffer((root / "ids_offsets.bin").read_bytes(), np.int64)[::-1].tobytes(),
        True),
    "missing file": lambda root: (root / "text_offsets.bin").unlink(),
    "a file where the folder was": lambda root: None,
}


DAMAGE["offsets decreasing across blocks only"] = lambda root: _rewrite(  # each block of 2 in order, not the whole
    root, "ids_offsets.bin", np.concatenate([[0, 5, 6, 4], np.frombuffer((root / "ids_offsets.bin").read_bytes(),
                                                                         np.int64)[4:]]).astype(np.int64).tobytes(),
    True)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cache_is_set_aside_and_rebuilt(tiny_bert, corpus, tmp_path, caplog, damage, monkeypatch):
    monkeypatch.setattr(token_store, "ROWS", 2)  # the checks span blocks of strings
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    good = _open(corpus, tok, tmp_path)
    expected = good.token_ids(range(len(good)))
    root = good.root
    del good
    if damage == "a file where the folder was":
        import shutil

        shutil.rmtree(root)
        root.write_text("not a store")
    else:
        DAMAGE[damage](root)
    again = _open(corpus, tok, tmp_path)
    assert again.token_ids(range(len(again))) == expected and list(again.strings) == corpus
    assert "is damaged" in caplog.text and "tokenising the strings again" in caplog.text
    assert len([r for r in caplog.records if "is damaged" in r.getMessage()]) == 1
    assert len(list(tmp_path.glob(f"{root.name}.damaged-*"))) == 1  # set aside, never deleted


def test_a_full_disk_is_one_line_naming_the_cache_and_leaves_nothing(tiny_bert, corpus, tmp_path, monkeypatch):
    tok = AutoTokenizer.from_pretrained(tiny_bert)

    def full(writer, fh, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(token_cache.ArrayWriter, "write", full)
    with pytest.raises(UserError, match="MIRRORBERT_CACHE .*cannot write it: no space left") as info:
        _open(corpus, tok, tmp_path)
    assert "\n" not in str(info.value) and list(tmp_path.iterdir()) == []


def test_the_cache_lives_under_mirrorbert_cache(tiny_bert, corpus, monkeypatch, tmp_path):
    monkeypatch.setenv("MIRRORBERT_CACHE", str(tmp_path / "c"))
    store = open_token_store([list(corpus)], fingerprint(corpus), AutoTokenizer.from_pretrained(tiny_bert), 16)
    assert store.root.parent == tmp_path / "c" / "tokens"
    monkeypatch.delenv("MIRRORBERT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert token_cache.cache_root() == tmp_path / "xdg" / "mirrorbert"


def test_a_slow_tokenizer_and_a_backend_that_disagrees_give_the_tokenizers_own_ids(tiny_bert, corpus, tmp_path):
    fast = AutoTokenizer.from_pretrained(tiny_bert)
    slow = AutoTokenizer.from_pretrained(tiny_bert, use_fast=False)
    expected = tokenize_once(fast, corpus, 8)
    assert _open(corpus, slow, tmp_path / "slow", max_length=8).token_ids(range(len(corpus))) == expected

    class Skewed:  # a backend whose fast batch call gives other ids: the check against the tokenizer's call
        def __init__(self, backend):
            self.backend = backend

        def __getattr__(self, name):
            return getattr(self.backend, name)

        def encode_batch_fast(self, texts, add_special_tokens=True):
            return [type("E", (), {"ids": e.ids[:1]})() for e in self.backend.encode_batch(texts)]

    class Proxy:
        def __init__(self, tok):
            self.tok = tok

        def __getattr__(self, name):
            return Skewed(self.tok.backend_tokenizer) if name == "backend_tokenizer" else getattr(self.tok, name)

        def __call__(self, *args, **kwargs):
            return self.tok(*args, **kwargs)

        def __len__(self):
            return len(self.tok)

    assert token_cache.encode_chunk(Proxy(fast), list(corpus), 8) == expected


def test_batches_are_read_without_mapping_the_store_into_the_process(tok, corpus, tmp_path):
    """Positioned reads: a random batch, a run of strings, negative and out-of-range places, and no page of
    the store left resident in the process (a map's fault-around pulls in most of the file)."""
    strings = list(corpus) * 40  # duplicates are fine here: the store keeps the order it is given
    store = _open(strings, tok, tmp_path)
    whole = tokenize_once(tok, strings, 16)
    order = list(np.random.default_rng(0).permutation(len(store)))
    assert store.token_ids(order) == [whole[i] for i in order]
    assert store.texts(order) == [strings[i] for i in order]
    assert store.token_ids(range(5, 9)) == whole[5:9] and store.texts(range(5, 9)) == strings[5:9]
    assert store.texts([-1]) == [strings[-1]] and store.token_ids(range(len(store) - 1, len(store))) == [whole[-1]]
    for bad in ([len(store)], range(len(store) - 1, len(store) + 1)):
        with pytest.raises(IndexError):
            store.token_ids(bad)
    try:
        smaps = open("/proc/self/smaps", encoding="ascii").read().split("\n")
    except OSError:
        pytest.skip("no /proc/self/smaps here")
    resident, mapped = 0, None
    for line in smaps:
        if line[:1].isalnum() and "-" in line.split(" ")[0] and len(line.split()) >= 5:
            mapped = line.split()[-1] if len(line.split()) > 5 else None
        elif line.startswith("Rss:") and mapped and mapped.startswith(str(store.root)):
            resident += int(line.split()[1])
    assert resident == 0
