"""The clients people already run, on a folder `mirrorbert train` wrote: the same vectors as `mirrorbert encode`.

LangChain's `HuggingFaceEmbeddings`, LlamaIndex's `HuggingFaceEmbedding` and an OpenAI-compatible embedding
server (Infinity, queried with the `openai` client) each load the folder as a sentence-transformers model;
each is compared with `mirrorbert encode`'s vectors of the same strings (cosine >= 0.9999, docs/guide/serving.md).
A client that is not installed is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from mirrorbert.cli.app import main

TEXTS = ["a man is playing a guitar", "the stock market fell sharply today", "Ein Hund läuft durch den Park",
         "heart attack", "two children are playing football in the garden while their parents watch"]
MIN_COSINE = 0.9999
INFINITY_ENV = "MIRRORBERT_INFINITY_EMB"
SERVER_START_S = 180


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory) -> tuple[Path, np.ndarray]:
    """(a folder written by `mirrorbert train`, `mirrorbert encode`'s vectors of TEXTS from it)."""
    root = tmp_path_factory.mktemp("clients")
    data, texts = root / "train.txt", root / "texts.txt"
    data.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    folder = root / "model"
    assert main(["train", "--model", str(tiny_bert), "--data", str(data), "--preset", "sentence", "--steps", "2",
                 "--batch-size", "4", "--output", str(folder), "--no-progress"]) == 0
    assert main(["encode", "--model", str(folder), "--input", str(texts), "--output", str(root / "v.npy"),
                 "--no-progress"]) == 0
    return folder, np.load(root / "v.npy")


def assert_same_vectors(got, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= MIN_COSINE, cos


def test_langchain_huggingface_embeddings(trained):
    pytest.importorskip("langchain_huggingface", reason='LangChain not installed (pip install "mirrorbert[langchain]")')
    from langchain_huggingface import HuggingFaceEmbeddings

    folder, want = trained
    embeddings = HuggingFaceEmbeddings(model_name=str(folder), model_kwargs={"device": "cpu"})
    assert_same_vectors(embeddings.embed_documents(TEXTS), want)
    assert_same_vectors([embeddings.embed_query(TEXTS[3])], want[3:4])


def test_llamaindex_huggingface_embedding(trained):
    pytest.importorskip("llama_index.embeddings.huggingface",
                        reason='LlamaIndex not installed (pip install "mirrorbert[llamaindex]")')
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    folder, want = trained
    embedding = HuggingFaceEmbedding(model_name=str(folder), device="cpu")
    assert_same_vectors(embedding.get_text_embedding_batch(TEXTS), want)
    assert_same_vectors([embedding.get_query_embedding(TEXTS[3])], want[3:4])


def infinity_executable() -> str | None:
    """`infinity_emb`: $MIRRORBERT_INFINITY_EMB, else beside this Python, else on PATH."""
    named = os.environ.get(INFINITY_ENV)
    if named:  # named (CI names it, .ci/run): a server that is not there fails the test instead of skipping it
        if not os.access(named, os.X_OK):
            pytest.fail(f"{INFINITY_ENV}={named}: not an executable file (scripts/setup_infinity.sh builds one)")
        return named
    return shutil.which("infinity_emb", path=os.path.dirname(sys.executable)) or shutil.which("infinity_emb")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}) before serving:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the server did not answer {url} within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


def test_openai_compatible_server(trained, tmp_path):
    """Infinity serving the folder on 127.0.0.1, asked through the `openai` client, gives `encode`'s vectors."""
    exe = infinity_executable()
    if exe is None:
        pytest.skip(f"no Infinity server (`infinity_emb`): it pins numpy<2, sentence-transformers<4 and "
                    f"huggingface_hub<1, so it lives in its own environment: scripts/setup_infinity.sh builds it "
                    f"(docs/guide/serving.md) and scripts/test.sh then sets {INFINITY_ENV}")
    openai = pytest.importorskip("openai", reason='the openai client is not installed (pip install "mirrorbert[serve]")')
    folder, want = trained
    port, log = free_port(), tmp_path / "infinity.log"
    # no usage statistics sent, no hub asked, its cache (.infinity_cache in the cwd) in tmp_path
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1",
           "INFINITY_CACHE_DIR": str(tmp_path / "cache")}
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([exe, "v2", "--model-id", str(folder), "--served-model-name", "mirror", "--host",
                                 "127.0.0.1", "--port", str(port), "--device", "cpu", "--engine", "torch",
                                 "--no-bettertransformer", "--no-model-warmup"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    try:
        wait_until_serving(proc, f"http://127.0.0.1:{port}/models", log)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}", api_key="unused", timeout=60)
        reply = client.embeddings.create(model="mirror", input=TEXTS, encoding_format="float")
        assert_same_vectors([item.embedding for item in sorted(reply.data, key=lambda d: d.index)], want)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
