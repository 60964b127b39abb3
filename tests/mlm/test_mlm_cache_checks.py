"""The MLM token cache is used only once checked against the corpus it claims to hold: forged
tokens, line ends, document starts or counts with a rehashed meta.json are set aside and rebuilt with one warning;
its files are read only inside the cache folder; a corpus edited while it is read leaves nothing cached."""

import hashlib
import json
import logging
import os

import numpy as np
import pytest
from transformers import AutoTokenizer

from mirrorbert.data import token_cache, token_stream
from mirrorbert.data.token_cache import CacheDamaged, check_entry
from mirrorbert.data.token_stream import CorpusLayout, prepare_corpus
from mirrorbert.errors import UserError

TEXT = ("the cat sat on the mat\na dog ran in the park\n\nthe quick brown fox jumps over the lazy dog\n\u200b\n\n"
        "a man is playing a guitar\na woman is slicing an onion\n\nthe stock market fell sharply today\n")


@pytest.fixture
def tok(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def _prepare(path, tok, cache, eval_fraction=0.0):
    return prepare_corpus(path, tok, cache, eval_fraction=eval_fraction, show_progress=False)


@pytest.fixture
def primed(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text(TEXT, encoding="utf-8")
    first = _prepare(path, tok, tmp_path / "cache", eval_fraction=0.3)
    return path, first


def check_cache(root, path, tok, eval_fraction):
    return check_entry(CorpusLayout([path], tok, eval_fraction), root)


def _rehash(root, *names, **changes):
    meta = json.loads((root / "manifest.json").read_text())
    for name in names:
        meta["files"][name] = hashlib.sha256((root / name).read_bytes()).hexdigest()
    for split, counts in changes.items():
        meta["splits"][split].update(counts)
    (root / "manifest.json").write_text(json.dumps(meta))


def _forge_tokens(root, tok):
    """A real token of the first sentence replaced by another id of the vocabulary, rehashed."""
    tokens = np.fromfile(root / "train.tokens", dtype=np.uint16)
    tokens[0] = next(t for t in range(5, len(tok)) if t != tokens[0] and t not in tok.all_special_ids)
    tokens.tofile(root / "train.tokens")
    _rehash(root, "train.tokens")


def _forge_ends(root, tok):
    """The first two lines' boundary moved by one token (both still end on a separator? no: the check sees the
    sentences differ from the corpus's), rehashed."""
    tokens = np.fromfile(root / "train.tokens", dtype=np.uint16)
    ends = np.fromfile(root / "train.ends", dtype=np.uint64)
    a, b = int(ends[0]), int(ends[1])
    first, second = tokens[:a - 1].tolist(), tokens[a:b - 1].tolist()
    sep = tok.sep_token_id
    moved = first[:-1] + [sep] + [first[-1]] + second + [sep]  # the last token of line 1 moved to line 2
    tokens[:b] = moved
    ends[0] = a - 1
    tokens.tofile(root / "train.tokens")
    ends.tofile(root / "train.ends")
    _rehash(root, "train.tokens", "train.ends")


def _forge_docs(root, tok):
    docs = np.fromfile(root / "train.docs", dtype=np.uint64)
    docs[1] += 1
    docs.tofile(root / "train.docs")
    _rehash(root, "train.docs")


def _forge_words(root, tok):
    meta = json.loads((root / "manifest.json").read_text())
    _rehash(root, train={"words": meta["splits"]["train"]["words"] + 1})


def _forge_swap_splits(root, tok):
    """The held-out split's files put in place of the training split's (and the other way), every count and
    checksum made consistent: each split's content is a real tokenisation, of the wrong lines."""
    for kind in ("tokens", "docs", "ends"):
        os.rename(root / f"train.{kind}", root / "swap")
        os.rename(root / f"eval.{kind}", root / f"train.{kind}")
        os.rename(root / "swap", root / f"eval.{kind}")
    meta = json.loads((root / "manifest.json").read_text())
    meta["splits"]["train"], meta["splits"]["eval"] = meta["splits"]["eval"], meta["splits"]["train"]
    for kind in ("tokens", "docs", "ends"):
        meta["counts"][f"train.{kind}"], meta["counts"][f"eval.{kind}"] = (meta["counts"][f"eval.{kind}"],
                                                                             meta["counts"][f"train.{kind}"])
    (root / "manifest.json").write_text(json.dumps(meta))
    _rehash(root, *(f"{s}.{k}" for s in ("train", "eval") for k in ("tokens", "docs", "ends")))


FORGED = {"tokens": (_forge_tokens, "not the tokenizer's tokens"), "line ends": (_forge_ends, "train.tokens"),
          "document starts": (_forge_docs, "train.docs"), "word count": (_forge_words, "splits not the data's"),
          "splits swapped": (_forge_swap_splits, "lines")}


@pytest.mark.parametrize("forge", sorted(FORGED))
def test_a_forged_cache_with_a_rehashed_meta_is_set_aside_and_rebuilt(primed, tok, tmp_path, caplog, forge):
    path, first = primed
    expected = {s: np.asarray(first.stream(s)).copy() for s in ("train", "eval")}
    FORGED[forge][0](first.root, tok)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        again = _prepare(path, tok, tmp_path / "cache", eval_fraction=0.3)
    assert all(np.array_equal(np.asarray(again.stream(s)), expected[s]) for s in expected)
    warnings = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warnings) == 1 and FORGED[forge][1] in warnings[0], warnings
    assert len([p for p in (tmp_path / "cache").iterdir() if ".damaged-" in p.name]) == 1


def test_line_ends_place_every_line(primed, tok):
    _, first = primed
    lines = [line.strip() for line in TEXT.splitlines() if line.strip()]
    total = sum(first.meta["splits"][s]["lines"] for s in ("train", "eval"))
    assert total == len(lines)
    ends = {s: np.fromfile(first.root / f"{s}.ends", dtype=np.uint64).tolist() for s in ("train", "eval")}
    assert all(ends[s][-1] == first.meta["splits"][s]["tokens"] for s in ends)
    assert len(ends["eval"]) == 2 and ends["eval"][0] == ends["eval"][1]  # the zero-width line: no tokens


def test_a_big_corpus_is_checked_on_a_fresh_sample(tmp_path, tok, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text("".join(f"sentence number {i} of the corpus\n" for i in range(40)), encoding="utf-8")
    first = _prepare(path, tok, tmp_path / "cache")
    monkeypatch.setattr(token_cache, "FULL_CHECK", 10)
    monkeypatch.setattr(token_cache, "SAMPLE", 3)
    seen = []
    encode = token_stream.encode_chunk

    def recorded(t, texts, *args, **kwargs):
        seen.append(tuple(texts))
        return encode(t, texts, *args, **kwargs)

    monkeypatch.setattr(token_stream, "encode_chunk", recorded)
    for _ in range(20):
        check_cache(first.root, path, tok, 0.0)
    assert all(len(s) == 3 for s in seen) and len(set(seen)) > 1  # three lines, not always the same three
    tokens = np.fromfile(first.root / "train.tokens", dtype=np.uint16)
    sep = tok.sep_token_id
    tokens[tokens != sep] = next(t for t in range(len(tok) - 1, 0, -1) if t not in tok.all_special_ids)
    tokens.tofile(first.root / "train.tokens")
    _rehash(first.root, "train.tokens")
    with pytest.raises(CacheDamaged, match="not the tokenizer's tokens"):
        check_cache(first.root, path, tok, 0.0)


@pytest.mark.parametrize("name", ["manifest.json", "train.tokens", "train.ends", "train.docs"])
@pytest.mark.parametrize("attack", ["link out", "fifo"])
def test_cache_files_are_read_only_inside_the_cache(primed, tok, tmp_path, caplog, name, attack):
    path, first = primed
    root = first.root
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_bytes((root / name).read_bytes())
    (root / name).unlink()
    if attack == "link out":
        (root / name).symlink_to(outside / name)
    else:
        os.mkfifo(root / name)
    with caplog.at_level(logging.WARNING, logger="mirrorbert"):
        _prepare(path, tok, tmp_path / "cache", eval_fraction=0.3)
    warnings = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warnings) == 1 and name in warnings[0], warnings


def test_a_meta_naming_other_files_is_refused(primed, tok):
    path, first = primed
    meta = json.loads((first.root / "manifest.json").read_text())
    meta["files"]["../../../etc/passwd"] = "0" * 64
    (first.root / "manifest.json").write_text(json.dumps(meta))
    with pytest.raises(CacheDamaged, match="names other files"):
        check_cache(first.root, path, tok, 0.3)


def test_a_corpus_edited_while_tokenised_leaves_nothing_cached(tmp_path, tok, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text(TEXT, encoding="utf-8")
    tokenize = CorpusLayout.write

    def edited_first(*args, **kwargs):  # the file changes between its hash (the key) and its tokenisation
        path.write_text(TEXT.replace("cat", "dog"), encoding="utf-8")
        return tokenize(*args, **kwargs)

    monkeypatch.setattr(CorpusLayout, "write", edited_first)
    with pytest.raises(UserError) as info:
        _prepare(path, tok, tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--corpus {path}:") and "changed while it was read" in message
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_corpus_edited_while_its_cache_is_checked_is_an_error_not_damage(primed, tok, tmp_path, monkeypatch):
    path, first = primed
    check = CorpusLayout.replay

    def edited_meanwhile(*args, **kwargs):
        path.write_text(TEXT.replace("cat", "dog"), encoding="utf-8")
        return check(*args, **kwargs)

    monkeypatch.setattr(CorpusLayout, "replay", edited_meanwhile)
    with pytest.raises(UserError, match="changed while it was read"):
        _prepare(path, tok, tmp_path / "cache", eval_fraction=0.3)
    assert first.root.is_dir() and not [p for p in (tmp_path / "cache").iterdir() if ".damaged-" in p.name]
