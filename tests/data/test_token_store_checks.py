"""The token store is used only once checked against the data it claims to hold: a store whose
manifest was rehashed after its ids, strings or dropped strings were forged is set aside and rebuilt with one
warning; its files are read only inside the store folder; strings that change while they are tokenised leave
nothing in the cache."""

import hashlib
import json
import logging
import os

import numpy as np
import pytest
from transformers import AutoTokenizer

from mirrorbert.data import token_cache, token_store
from mirrorbert.data.readers import chunked
from mirrorbert.data.strings import fingerprint
from mirrorbert.data.token_cache import CacheDamaged, check_entry
from mirrorbert.data.token_store import StringsLayout, open_token_store, store_key
from mirrorbert.errors import UserError
from mirrorbert.mirror.views import tokenize_once

TOKENLESS = ["\u200b\u200b", "\x01\x02"]  # BERT's normaliser leaves no token of these


@pytest.fixture
def tok(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def _open(strings, tok, cache, max_length=16):
    return open_token_store(chunked(strings, 5), fingerprint(strings), tok, max_length, cache)


def check_store(root, data_sha256, tok, max_length):
    return check_entry(StringsLayout(None, data_sha256, tok, max_length), root)


def _manifest(root):
    return json.loads((root / "manifest.json").read_text())


def _save(root, manifest, *names):
    """Rehash the named files into the manifest: the forger's last step, which a checksum alone cannot catch."""
    for name in names:
        manifest["files"][name] = hashlib.sha256((root / name).read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(manifest))


def _forge_ids(root, tok):
    """Row 0's first real id replaced by another real id (inside the vocabulary, same length), rehashed."""
    ids = np.fromfile(root / "ids.bin", dtype=np.int32)
    special = set(tok.all_special_ids)
    first = next(i for i, t in enumerate(ids.tolist()) if t not in special)
    ids[first] = next(t for t in range(5, len(tok)) if t not in special and t != ids[first])
    ids.tofile(root / "ids.bin")
    _save(root, _manifest(root), "ids.bin")


def _forge_text(root, tok):
    """A letter of the first string changed (same length, same ids file): the strings are no longer the data's."""
    text = bytearray((root / "text.bin").read_bytes())
    text[0] = ord("x") if text[0] != ord("x") else ord("y")
    (root / "text.bin").write_bytes(bytes(text))
    _save(root, _manifest(root), "text.bin")


def _forge_dropped(root, tok):
    """The last string listed among those left out, every count and checksum made consistent: the data's hash
    still holds (the strings are all there), but a string with tokens would leave the run."""
    m = _manifest(root)
    at = np.fromfile(root / "dropped_at.bin", dtype=np.int64)
    np.append(at, m["read"] - 1).astype(np.int64).tofile(root / "dropped_at.bin")
    m["counts"]["dropped_at.bin"] += 1
    m.update(strings=m["strings"] - 1, dropped=m["dropped"] + 1)
    _save(root, m, "dropped_at.bin")


def _forge_kept(root, tok):
    """A string without tokens no longer listed among those left out: the run would train on it."""
    m = _manifest(root)
    np.fromfile(root / "dropped_at.bin", dtype=np.int64)[1:].tofile(root / "dropped_at.bin")
    m["counts"]["dropped_at.bin"] -= 1
    m.update(strings=m["strings"] + 1, dropped=m["dropped"] - 1)
    _save(root, m, "dropped_at.bin")


def _forge_counts(root, tok):
    m = _manifest(root)
    m["max_real_tokens"] += 1
    _save(root, m)


FORGED = {"ids": (_forge_ids, "not the tokenizer's ids"), "text": (_forge_text, "not the data's"),
          "a string with tokens left out": (_forge_dropped, "dropped_at.bin is not what the data"),
          "a string without tokens kept": (_forge_kept, "dropped_at.bin is not what the data"),
          "max_real_tokens": (_forge_counts, "max_real_tokens not the data's")}


@pytest.mark.parametrize("forge", sorted(FORGED))
def test_a_forged_store_with_a_rehashed_manifest_is_set_aside_and_rebuilt(tok, corpus, tmp_path, caplog, forge):
    strings = TOKENLESS + list(corpus)  # the last string is the last read: the dropped forgery appends it
    good = _open(strings, tok, tmp_path)
    expected, root = good.token_ids(range(len(good))), good.root
    good.close()
    FORGED[forge][0](root, tok)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        again = _open(strings, tok, tmp_path)
    assert again.token_ids(range(len(again))) == expected and list(again.strings) == list(corpus)
    warnings = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warnings) == 1 and "tokenising the strings again" in warnings[0], warnings
    assert FORGED[forge][1] in warnings[0]
    assert len(list(tmp_path.glob(f"{root.name}.damaged-*"))) == 1


def test_the_dropped_strings_are_kept_with_their_places(tok, corpus, tmp_path):
    strings = [corpus[0], TOKENLESS[0], *corpus[1:4], TOKENLESS[1]]
    store = _open(strings, tok, tmp_path)
    assert store.dropped_texts() == TOKENLESS and store.dropped == 2 and store.meta["read"] == len(strings)
    assert np.fromfile(store.root / "dropped_at.bin", dtype=np.int64).tolist() == [1, 5]
    assert store.meta["dropped_example"] == TOKENLESS[0]


def test_a_big_store_is_checked_on_a_fresh_sample(tok, corpus, tmp_path, monkeypatch):
    """Above FULL_CHECK strings only SAMPLE strings are tokenised again, drawn from the system's randomness:
    every string forged is always found; the sample differs from run to run."""
    strings = [f"{s} number {i}" for i in range(6) for s in corpus]
    good = _open(strings, tok, tmp_path)
    root = good.root
    good.close()
    monkeypatch.setattr(token_cache, "FULL_CHECK", 10)
    monkeypatch.setattr(token_cache, "SAMPLE", 4)
    drawn = []
    encode = token_store.encode_chunk

    def recorded(t, texts, n):
        drawn.append(tuple(texts))
        return encode(t, texts, n)

    monkeypatch.setattr(token_store, "encode_chunk", recorded)
    for _ in range(2):
        check_store(root, fingerprint(strings), tok, 16).close()
    assert len(drawn) == 2 and all(len(d) == 4 for d in drawn)
    samples = set()
    for _ in range(20):
        drawn.clear()
        check_store(root, fingerprint(strings), tok, 16).close()
        samples.add(drawn[0])
    assert len(samples) > 1  # not a fixed set of rows a forger could leave alone
    ids = np.fromfile(root / "ids.bin", dtype=np.int32)
    special = np.asarray(sorted(tok.all_special_ids))
    ids[~np.isin(ids, special)] = next(t for t in range(len(tok) - 1, 0, -1) if t not in special)  # all forged
    ids.tofile(root / "ids.bin")
    m = _manifest(root)
    _save(root, m, "ids.bin")
    with pytest.raises(CacheDamaged, match="not the tokenizer's ids"):
        check_store(root, fingerprint(strings), tok, 16)


def test_a_store_of_other_strings_is_never_used_even_under_the_right_key(tok, corpus, tmp_path):
    """The key is the data's hash, but the store is checked against it too: another data set's store copied
    under this data's key (its manifest edited to match) is refused."""
    other = _open(list(corpus[:5]), tok, tmp_path / "other")
    other.close()
    key = store_key(fingerprint(corpus), tok, 16)
    target = tmp_path / "cache" / key
    target.parent.mkdir()
    os.rename(other.root, target)
    m = _manifest(target)
    m.update(key=key, data_sha256=fingerprint(corpus))
    _save(target, m)
    with pytest.raises(CacheDamaged, match="data's strings"):
        check_store(target, fingerprint(corpus), tok, 16)
    store = _open(corpus, tok, tmp_path / "cache")
    assert list(store.strings) == list(corpus)


@pytest.mark.parametrize("name", ["manifest.json", "ids.bin", "text_offsets.bin", "dropped_at.bin"])
@pytest.mark.parametrize("attack", ["link out", "fifo", "link to a folder"])
def test_store_files_are_read_only_inside_the_store(tok, corpus, tmp_path, caplog, name, attack):
    corpus = list(corpus) + TOKENLESS
    """A file of the store that is a link out of it (to an exact copy: the content would pass), a FIFO or a
    link to a folder: the store is set aside with one warning naming the file, never read there, never a hang."""
    good = _open(corpus, tok, tmp_path / "cache")
    root = good.root
    good.close()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_bytes((root / name).read_bytes())
    (root / name).unlink()
    if attack == "link out":
        (root / name).symlink_to(outside / name)
    elif attack == "fifo":
        os.mkfifo(root / name)
    else:
        (root / name).symlink_to(outside)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        again = _open(corpus, tok, tmp_path / "cache")
    assert list(again.strings) == corpus[:-2]
    warnings = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warnings) == 1 and name in warnings[0], warnings
    assert (outside / name).read_bytes()  # untouched


def test_a_manifest_naming_other_files_is_refused(tok, corpus, tmp_path):
    good = _open(corpus, tok, tmp_path)
    root = good.root
    good.close()
    m = _manifest(root)
    m["files"]["../../etc/passwd"] = "0" * 64
    _save(root, m)
    with pytest.raises(CacheDamaged, match="names other files"):
        check_store(root, fingerprint(corpus), tok, 16)


def test_strings_that_change_while_tokenised_leave_nothing_in_the_cache(tok, corpus, tmp_path):
    """The data's hash was taken from one version of the file, the strings streamed come from another (the file
    was edited mid-run): one error naming the data, no store and no temporary left."""
    edited = list(corpus)
    edited[3] = "a string edited while the run read the file"
    with pytest.raises(UserError) as info:
        open_token_store(chunked(edited, 5), fingerprint(corpus), tok, 16, tmp_path / "cache",
                         source="--data strings.txt")
    message = str(info.value)
    assert "\n" not in message and message.startswith("--data strings.txt:") and "changed while" in message
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_store_reads_the_descriptors_it_checked(tok, corpus, tmp_path):
    """A file swapped after the check is not what the run reads: the run keeps the checked descriptor."""
    store = _open(corpus, tok, tmp_path)
    store.close()
    store = _open(corpus, tok, tmp_path)
    expected = store.texts(range(len(store)))
    os.rename(store.root / "text.bin", tmp_path / "kept")
    (store.root / "text.bin").write_bytes(b"x" * (tmp_path / "kept").stat().st_size)
    assert store.texts(range(len(store))) == expected
    assert tokenize_once(tok, expected, 16) == store.token_ids(range(len(store)))
