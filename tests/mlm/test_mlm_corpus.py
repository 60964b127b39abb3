"""Corpus preparation and packing: no token lost or duplicated, special tokens, held-out split, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from mirrorbert.errors import UserError
from mirrorbert.data.token_stream import is_eval_document, prepare_corpus, token_dtype
from mirrorbert.mlm.method import PackedSequences, windows

DOCS = [
    ["the cat sat on the mat", "a dog ran in the park"],
    ["the quick brown fox jumps over the lazy dog"],
    ["a man is playing a guitar", "a woman is slicing an onion", "two children are playing football in the garden"],
    ["the stock market fell sharply today"],
    ["scientists discovered a new species of frog", "heart attack and myocardial infarction"],
    ["the bank raised interest rates again", "she read a book about ancient history"],
    ["rain is expected tomorrow in the north"],
]


@pytest.fixture(scope="module", params=["bert", "roberta"])
def tok(request, tiny_bert, tiny_roberta):
    return AutoTokenizer.from_pretrained(tiny_bert if request.param == "bert" else tiny_roberta)


def _write_docs(path, docs):
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path


def _stream_to_sentences(stream: np.ndarray, sep: int) -> list[list[int]]:
    out, cur = [], []
    for t in stream.tolist():
        if t == sep:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    assert cur == [], "stream must end with a separator"
    return out


def test_stream_holds_every_sentence_once(tmp_path, tok):
    corpus = _write_docs(tmp_path / "c.txt", DOCS)
    prepared = prepare_corpus(corpus, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    expected = [tok(s, add_special_tokens=False)["input_ids"] for d in DOCS for s in d]
    sep = prepared.meta["sep_id"]
    assert sep == (tok.sep_token_id)
    assert _stream_to_sentences(np.asarray(prepared.stream("train")), sep) == expected
    # document starts (in stream positions) match the blank-line structure
    starts, pos = [], 0
    for d in DOCS:
        starts.append(pos)
        pos += sum(len(tok(s, add_special_tokens=False)["input_ids"]) + 1 for s in d)
    assert np.fromfile(prepared.root / "train.docs", dtype=np.uint64).tolist() == starts
    assert prepared.n_tokens("train", with_separators=False) == sum(map(len, expected))
    assert prepared.meta["dtype"] == "uint16"


@pytest.mark.parametrize("seq_length", [2, 5, 16, 33, 10_000])
def test_packing_loses_and_duplicates_nothing(tmp_path, tok, seq_length):
    corpus = _write_docs(tmp_path / "c.txt", DOCS * 3)
    prepared = prepare_corpus(corpus, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    stream = np.asarray(prepared.stream("train"))
    packed = windows(prepared, "train", seq_length)
    ids, att = packed.batch(np.arange(len(packed)))
    assert ids.shape == (len(packed), seq_length)
    start = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
    assert (ids[:, 0] == start).all()
    # every sequence but the last is full: no padding waste
    assert (att[:-1] == 1).all()
    body = [ids[r, 1:][att[r, 1:] == 1] for r in range(len(packed))]
    assert torch.equal(torch.cat(body), torch.from_numpy(stream.astype(np.int64)))
    # padding only at the tail of the last sequence
    assert int((att == 0).sum()) == len(packed) * (seq_length - 1) - len(stream)


def test_roberta_and_bert_special_tokens(tmp_path, tiny_bert, tiny_roberta):
    corpus = _write_docs(tmp_path / "c.txt", DOCS)
    for path, start, sep in [(tiny_bert, "[CLS]", "[SEP]"), (tiny_roberta, "<s>", "</s>")]:
        t = AutoTokenizer.from_pretrained(path)
        prepared = prepare_corpus(corpus, t, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
        ids, _ = windows(prepared, "train", 24).batch([0])
        tokens = t.convert_ids_to_tokens(ids[0].tolist())
        assert tokens[0] == start
        assert sep in tokens[1:]
        # the first sentence is followed by the separator, exactly as the tokenizer encodes it
        first = t(DOCS[0][0], add_special_tokens=False)["input_ids"]
        assert ids[0, 1 : 1 + len(first)].tolist() == first
        assert tokens[1 + len(first)] == sep


def test_held_out_split_whole_documents(tmp_path, tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    docs = [[f"the cat sat on the mat {i}", f"a dog ran {i}"] for i in range(40)]
    corpus = _write_docs(tmp_path / "c.txt", docs)
    prepared = prepare_corpus(corpus, tok, tmp_path / "cache", eval_fraction=0.1, show_progress=False)
    sep = tok.sep_token_id
    train = _stream_to_sentences(np.asarray(prepared.stream("train")), sep)
    held = _stream_to_sentences(np.asarray(prepared.stream("eval")), sep)
    enc = [[tok(s, add_special_tokens=False)["input_ids"] for s in d] for d in docs]
    eval_docs = [i for i in range(len(docs)) if is_eval_document(i, 0.1)]
    assert len(eval_docs) == 4
    assert held == [s for i in eval_docs for s in enc[i]]
    assert train == [s for i in range(len(docs)) if i not in eval_docs for s in enc[i]]
    assert prepared.meta["splits"]["eval"]["documents"] == 4


def test_lines_are_documents_without_blank_lines(tmp_path, tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    lines = [f"sentence number {i}" for i in range(30)]
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepared = prepare_corpus(corpus, tok, tmp_path / "cache", eval_fraction=0.1, show_progress=False)
    assert prepared.meta["splits"]["eval"]["sentences"] == 3
    assert prepared.meta["splits"]["train"]["documents"] == 27


def test_several_files_and_cache_reuse(tmp_path, tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    a = _write_docs(tmp_path / "a.txt", DOCS[:3])
    b = _write_docs(tmp_path / "b.txt", DOCS[3:])
    first = prepare_corpus([a, b], tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    whole = prepare_corpus(_write_docs(tmp_path / "all.txt", DOCS), tok, tmp_path / "cache", 0.0, show_progress=False)
    assert np.array_equal(np.asarray(first.stream("train")), np.asarray(whole.stream("train")))
    again = prepare_corpus([a, b], tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    assert again.root == first.root
    _write_docs(a, DOCS[:2])  # changed file -> new preparation
    changed = prepare_corpus([a, b], tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    assert changed.root != first.root
    assert changed.n_tokens("train") < first.n_tokens("train")


def test_missing_and_empty_corpus(tmp_path, tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    with pytest.raises(UserError, match="no such file"):
        prepare_corpus(tmp_path / "nope.txt", tok, tmp_path / "cache", show_progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n", encoding="utf-8")
    with pytest.raises(UserError, match="empty"):
        prepare_corpus(empty, tok, tmp_path / "cache", show_progress=False)
    cache = tmp_path / "cache"  # refused before any cache is written
    assert not cache.exists() or not any(p.name.startswith("empty-") for p in cache.iterdir())


def test_token_dtype_and_epoch_order():
    from mirrorbert.mlm.pretrain import PretrainConfig, _plan

    assert token_dtype(30522) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(250_002) == np.uint32
    plan = _plan(PretrainConfig(corpus=["c.txt"], model="m", batch_size=8, seed=1), 100)
    first = [list(batch) for batch in plan.iter_batches(0)]
    assert sorted(i for batch in first for i in batch) == list(range(100))  # every window once an epoch
    assert first == [list(batch) for batch in plan.iter_batches(0)]  # a function of (seed, epoch) alone
    assert first != [list(batch) for batch in plan.iter_batches(1)]
    assert [len(batch) for batch in first] == [8] * 12 + [4]  # the short last batch is kept


def test_packed_index_errors():
    p = PackedSequences(np.arange(10, dtype=np.uint16), 4, 99, 0)
    assert len(p) == 4
    with pytest.raises(IndexError):
        p.batch([4])


def test_the_cache_follows_the_text_not_size_and_mtime(tmp_path, tiny_bert):
    import os

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    path = tmp_path / "c.txt"
    path.write_text("the first sentence here\nand a second one\n", encoding="utf-8")
    first = prepare_corpus(path, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    st = path.stat()
    path.write_text("the final sentence here\nand a second one\n", encoding="utf-8")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    assert path.stat().st_size == st.st_size
    again = prepare_corpus(path, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    expected = []
    for line in ("the final sentence here", "and a second one"):
        expected += tok(line, add_special_tokens=False)["input_ids"] + [tok.sep_token_id]
    assert [int(t) for t in again.stream("train")] == expected
    assert again.root != first.root


@pytest.mark.parametrize("damage", ["truncated", "edited", "meta-not-json", "meta-dtype"])
def test_a_damaged_cache_is_set_aside_and_rebuilt(tmp_path, tiny_bert, caplog, damage):
    import json

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    path = _write_docs(tmp_path / "c.txt", DOCS[:3])
    first = prepare_corpus(path, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    expected = np.asarray(first.stream("train")).copy()
    tokens, meta = first.root / "train.tokens", first.root / "manifest.json"
    if damage == "truncated":
        tokens.write_bytes(tokens.read_bytes()[:-4])
    elif damage == "edited":
        data = bytearray(tokens.read_bytes())
        data[0] ^= 1
        tokens.write_bytes(bytes(data))
    elif damage == "meta-not-json":
        meta.write_text("{", encoding="utf-8")
    else:
        meta.write_text(json.dumps({**first.meta, "dtype": "float64"}), encoding="utf-8")
    again = prepare_corpus(path, tok, tmp_path / "cache", eval_fraction=0.0, show_progress=False)
    assert again.root == first.root and np.array_equal(np.asarray(again.stream("train")), expected)
    assert [p for p in (tmp_path / "cache").iterdir() if ".damaged-" in p.name]  # set aside, not deleted
    assert "is damaged" in caplog.text
