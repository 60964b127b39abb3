"""Inputs larger than memory and Hub datasets: `encode` writes the vectors chunk by chunk
into a memory-mapped .npy and reads Parquet one record batch (of the one column) at a time; `hf:OWNER/NAME`
reads a Hub dataset through `datasets` in streaming mode (faked here: the tests stay offline)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")

import mirrorbert.encoder.streaming  # noqa: E402
from mirrorbert.cli.app import main  # noqa: E402
from mirrorbert.errors import UserError  # noqa: E402
from mirrorbert.data.hf_datasets import parse_hub_dataset  # noqa: E402


@pytest.fixture
def parquet(tmp_path, corpus):
    texts = corpus * 3  # 42 rows
    datasets.Dataset.from_dict({"id": list(range(len(texts))), "text": texts}).to_parquet(str(tmp_path / "c.parquet"))
    return tmp_path / "c.parquet", texts


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 5 strings, and a record of every chunk's size that reaches the encoder."""
    from mirrorbert.encoder.model import Encoder

    monkeypatch.setattr(mirrorbert.encoder.streaming, "STREAM_ROWS", 5)
    sizes = []
    real = Encoder.encode

    def recording(self, texts, *args, **kwargs):
        sizes.append(1 if isinstance(texts, str) else len(texts))
        return real(self, texts, *args, **kwargs)

    monkeypatch.setattr(Encoder, "encode", recording)
    return sizes


def test_encode_streams_a_parquet_column_in_chunks_into_the_npy(tiny_bert, parquet, tmp_path, small_chunks, monkeypatch):
    import pyarrow.parquet as pq

    from mirrorbert.encoder.model import Encoder

    path, texts = parquet
    reads = []
    real_iter = pq.ParquetFile.iter_batches

    def recording_iter(self, batch_size=65536, columns=None, **kwargs):
        reads.append((batch_size, columns))
        return real_iter(self, batch_size=batch_size, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording_iter)
    out = tmp_path / "v.npy"
    assert main(["encode", "--model", str(tiny_bert), "--input", str(path), "--column", "text", "--output", str(out),
                 "--no-progress", "--device", "cpu"]) == 0
    assert max(small_chunks) <= 5 and sum(small_chunks) == len(texts)  # never the whole input at once
    assert (5, ["text"]) in reads  # one record batch of the one column at a time
    streamed = np.load(out)
    small_chunks.clear()
    whole = Encoder.load(tiny_bert, device="cpu").encode(texts)
    assert streamed.shape == whole.shape and streamed.dtype == np.float32
    np.testing.assert_allclose(streamed, whole, atol=1e-5)


def test_text_files_are_encoded_in_chunks_too_and_rows_files_still_written(tiny_bert, tmp_path, corpus, small_chunks):
    from mirrorbert.encoder.model import Encoder

    path = tmp_path / "c.txt"
    path.write_bytes(("\n".join(corpus[:3]) + "\n").encode() + b"\xff\xfe bad line\n"
                     + ("\n".join(corpus[3:]) + "\n").encode())
    out = tmp_path / "v.npy"
    assert main(["encode", "--model", str(tiny_bert), "--input", str(path), "--output", str(out), "--no-progress",
                 "--device", "cpu", "--skip-bad-lines", "--normalize"]) == 0
    assert max(small_chunks) <= 5
    vectors = np.load(out)
    rows = json.loads((tmp_path / "v.rows.json").read_text(encoding="utf-8"))
    assert rows["skipped_lines"] == [4] and rows["row_ids"] == [0, 1, 2] + list(range(4, len(corpus) + 1))
    np.testing.assert_allclose(vectors, Encoder.load(tiny_bert, device="cpu").encode(corpus, normalize=True), atol=1e-5)


def test_a_table_of_blank_rows_is_refused_and_nothing_written(tiny_bert, tmp_path, capsys):
    datasets.Dataset.from_dict({"text": ["", None, "  "]}).to_parquet(str(tmp_path / "blank.parquet"))
    out = tmp_path / "v.npy"
    assert main(["encode", "--model", str(tiny_bert), "--input", str(tmp_path / "blank.parquet"), "--column", "text",
                 "--output", str(out), "--no-progress", "--device", "cpu"]) == 2
    assert "no text in the data (every row is blank)" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".v*"))


# ------------------------------------------------------------------------------------------ Hub datasets
@pytest.fixture
def fake_hub(monkeypatch, corpus):
    """`datasets.load_dataset` answering one dataset, recording how it was asked (streaming, config, split)."""
    calls = []

    def load_dataset(name, config=None, split=None, streaming=False, **kwargs):
        calls.append({"name": name, "config": config, "split": split, "streaming": streaming})
        if name != "someone/sentences":
            raise FileNotFoundError(f"Dataset '{name}' doesn't exist on the Hub or cannot be accessed.")
        return iter([{"text": t, "label": i} for i, t in enumerate(corpus)])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hub_dataset_spec_is_parsed():
    assert parse_hub_dataset("hf:someone/sentences") == ("someone/sentences", None, "train")
    assert parse_hub_dataset("hf:glue/qnli:validation") == ("glue/qnli", None, "validation")
    assert parse_hub_dataset("hf:someone/sentences/en:test") == ("someone/sentences", "en", "test")
    assert parse_hub_dataset("hf:imdb") == ("imdb", None, "train")
    for bad in ("hf:", "hf:a//b", "hf:a/b/c/d", "hf:a/b:", "hf:a b/c"):
        with pytest.raises(UserError, match="expected hf:OWNER/NAME"):
            parse_hub_dataset(bad)


def test_encode_and_train_read_a_hub_dataset_in_streaming_mode(tiny_bert, tmp_path, corpus, fake_hub):
    from mirrorbert.encoder.model import Encoder

    out = tmp_path / "v.npy"
    assert main(["encode", "--model", str(tiny_bert), "--input", "hf:someone/sentences:train", "--column", "text",
                 "--output", str(out), "--no-progress", "--device", "cpu"]) == 0
    assert fake_hub[-1] == {"name": "someone/sentences", "config": None, "split": "train", "streaming": True}
    np.testing.assert_allclose(np.load(out), Encoder.load(tiny_bert, device="cpu").encode(corpus), atol=1e-5)
    model = tmp_path / "m"
    assert main(["train", "--model", str(tiny_bert), "--data", "hf:someone/sentences", "--column", "text",
                 "--output", str(model), "--steps", "1", "--batch-size", "4", "--max-length", "16", "--no-progress",
                 "--device", "cpu"]) == 0
    meta = json.loads((model / "mirrorbert.json").read_text(encoding="utf-8"))
    assert meta["training"]["data"]["strings"] == len(set(corpus))


@pytest.mark.parametrize("argv, fragment", [
    (["--input", "hf:someone/missing", "--column", "text"], "--input hf:someone/missing: cannot read the dataset from "
                                                             "the Hugging Face Hub (FileNotFoundError"),
    (["--input", "hf:someone/sentences", "--column", "body"], "--column 'body' not in the data (columns: text, label)"),
    (["--input", "hf:someone/sentences"], "needs --column NAME"),
    (["--input", "hf:someone/sentences/x/y", "--column", "text"], "expected hf:OWNER/NAME"),
])
def test_hub_dataset_mistakes_are_one_line_before_the_model_loads(tiny_bert, tmp_path, capsys, fake_hub, monkeypatch,
                                                                  argv, fragment):
    from mirrorbert.encoder.model import Encoder

    monkeypatch.setattr(Encoder, "load", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["encode", "--model", str(tiny_bert), "--output", str(tmp_path / "v.npy"), *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(err) == 1 and fragment in err[0], err


def test_offline_hub_dataset_is_one_line(tiny_bert, tmp_path, capsys, monkeypatch):
    """The real `datasets.load_dataset` with the hub switched off (as in every test here): one line, exit 2."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache: nothing to fall back on
    assert main(["encode", "--model", str(tiny_bert), "--input", "hf:someone/not-downloaded", "--column", "text",
                 "--output", str(tmp_path / "v.npy")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(err) == 1 and "cannot read the dataset from the Hugging Face Hub" in err[0], err


def test_index_refuses_a_hub_corpus_in_one_line(tiny_bert, tmp_path, capsys):
    assert main(["index", "--model", str(tiny_bert), "--corpus", "hf:someone/sentences", "--column", "text",
                 "--output", str(tmp_path / "idx")]) == 2
    assert "an index needs a local corpus" in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()


def test_search_takes_a_hub_corpus(tiny_bert, corpus, fake_hub, capsys):
    assert main(["search", "--model", str(tiny_bert), "--corpus", "hf:someone/sentences", "--column", "text",
                 "--query", corpus[3], "--top-k", "1", "--no-progress", "--device", "cpu"]) == 0
    assert corpus[3] in capsys.readouterr().out
