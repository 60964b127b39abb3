"""Encoder: pooling formulas, sentence-transformers equivalence, save/load, encode contract."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError

TEXTS = ["the cat sat on the mat", "a dog", "heart attack and myocardial infarction in the park today", ""]


def reference_pooling(folder, texts, mode):
    """Pooling computed independently from the raw AutoModel outputs, one text at a time (no padding)."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text, return_tensors="pt")
            hs = model(**enc, output_hidden_states=True).hidden_states
            if mode == "cls":
                out.append(hs[-1][0, 0])
            elif mode == "mean":
                out.append(hs[-1][0].mean(0))
            else:
                out.append(((hs[1][0] + hs[-1][0]) / 2).mean(0))
    return torch.stack(out).numpy()


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("mode", ["cls", "mean", "first-last"])
def test_pooling_matches_formula_and_sentence_transformers(request, tmp_path, which, mode):
    from sentence_transformers import SentenceTransformer

    folder = request.getfixturevalue(which)
    enc = Encoder.load(folder, pooling=mode, device="cpu")
    ours = enc.encode(TEXTS, batch_size=3)
    np.testing.assert_allclose(ours, reference_pooling(folder, TEXTS, mode), atol=1e-5)
    saved = enc.save(tmp_path / "saved")
    st = SentenceTransformer(str(saved), device="cpu").encode(TEXTS, batch_size=3)
    np.testing.assert_allclose(ours, st, atol=1e-5)
    again = Encoder.load(saved)
    assert again.pooling == mode
    np.testing.assert_allclose(again.encode(TEXTS), ours, atol=1e-6)


def test_saved_folder_loads_in_automodel_and_has_metadata(tiny_bert, tmp_path):
    enc = Encoder.load(tiny_bert, pooling="cls")
    out = enc.save(tmp_path / "m", training_info={"config": {"model": "tiny"}, "steps": 3})
    model = AutoModel.from_pretrained(out)
    assert model.config.hidden_size == 32
    meta = json.loads((out / "mirrorbert.json").read_text())
    assert meta["pooling"] == "cls" and meta["training"]["steps"] == 3 and "torch" in meta["versions"]
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
    with pytest.raises(UserError, match="already exists"):
        enc.save(out)
    enc.save(out, overwrite=True)
    assert (out / "model.safetensors").exists()


def test_plain_mlm_defaults_to_mean_pooling(tiny_bert):
    assert Encoder.load(tiny_bert).pooling == "mean"


def test_encode_returns_input_order_regardless_of_batching(tiny_bert):
    enc = Encoder.load(tiny_bert)
    full = enc.encode(TEXTS, batch_size=len(TEXTS))
    one_by_one = np.stack([enc.encode(t) for t in TEXTS])
    np.testing.assert_allclose(full, one_by_one, atol=1e-5)
    assert enc.encode(TEXTS[0]).shape == (32,)
    t = enc.encode(TEXTS, convert_to="torch", normalize=True)
    assert isinstance(t, torch.Tensor) and torch.allclose(t.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    assert enc.encode([]).shape == (0, 32)


def test_encode_bf16_close_to_fp32(tiny_bert):
    enc = Encoder.load(tiny_bert)
    a = enc.encode(TEXTS, normalize=True)
    b = enc.encode(TEXTS, normalize=True, precision="bf16")
    assert np.abs(a - b).max() < 0.05


def test_similarity_is_cosine(tiny_bert):
    enc = Encoder.load(tiny_bert)
    sims = enc.similarity(TEXTS[:2], TEXTS)
    v = enc.encode(TEXTS)
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    np.testing.assert_allclose(sims, v[:2] @ v.T, atol=1e-5)
    assert sims.shape == (2, len(TEXTS))


def test_encode_does_not_leave_training_mode_changed(tiny_bert):
    enc = Encoder.load(tiny_bert)
    enc.train()
    enc.encode(["a"])
    assert enc.training


def test_bad_loads_are_user_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="hub is unreachable"):
        Encoder.load("surely-not-a-model-name-xyz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        Encoder.load(tmp_path / "empty")
    with pytest.raises(UserError, match="^pooling: unknown pooling"):  # Python names the argument
        Encoder.load(tmp_path / "empty", pooling="max")
    with pytest.raises(UserError, match="^--pooling: unknown pooling"):  # the commands name the option
        Encoder.load(tmp_path / "empty", pooling="max", cli=True)


def test_encode_takes_sentence_transformers_keywords(tiny_bert):
    """The keywords users type from sentence-transformers habit mean what they mean there."""
    enc = Encoder.load(tiny_bert, pooling="mean", device="cpu")
    texts = ["a cat", "the bank raised rates", "heart attack"]
    base = enc.encode(texts)
    assert isinstance(base, np.ndarray) and base.shape == (3, enc.dim)
    tensor = enc.encode(texts, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)
    assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (3, enc.dim)
    np.testing.assert_allclose(tensor.numpy(), base / np.linalg.norm(base, axis=1, keepdims=True), atol=1e-6)
    listed = enc.encode(texts, convert_to_numpy=False)
    assert isinstance(listed, list) and len(listed) == 3 and all(isinstance(v, torch.Tensor) for v in listed)
    one = enc.encode("a cat", batch_size=2, device="cpu")
    assert one.shape == (enc.dim,)
    np.testing.assert_allclose(one, base[0], atol=1e-6)
    np.testing.assert_allclose(enc.encode(texts, packing="off"), enc.encode(texts, packing=False), atol=0)


@pytest.mark.parametrize("kwargs, argument", [
    ({"packing": "yes"}, "packing"), ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),
    ({"precision": "fp8"}, "precision"), ({"convert_to": "list"}, "convert_to"),
    ({"normalize": True, "normalize_embeddings": False}, "normalize"),
])
def test_encode_refuses_bad_arguments_at_the_call(tiny_bert, kwargs, argument):
    enc = Encoder.load(tiny_bert, pooling="mean", device="cpu")
    with pytest.raises(ValueError, match=argument):
        enc.encode(["a cat"], **kwargs)
    with pytest.raises(ValueError, match="texts"):
        enc.encode([1, 2])


def test_python_errors_name_python_arguments(tmp_path):
    with pytest.raises(ValueError) as info:
        Encoder.load(tmp_path / "typo")
    assert "name_or_path" in str(info.value) and "--model" not in str(info.value)
    with pytest.raises(ValueError, match="pooling") as info:
        Encoder.load(tmp_path, pooling="max")
    assert "--pooling" not in str(info.value)


def test_loading_an_mlm_in_python_prints_no_load_report(tiny_bert, capfd, caplog):
    """tiny_bert is a BertForMaskedLM: its head weights are unused by the encoder; transformers' report is noise."""
    import logging

    with caplog.at_level(logging.WARNING):
        Encoder.load(tiny_bert, pooling="mean", device="cpu")
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "were not used" not in out + err
    assert not [r for r in caplog.records if r.name.startswith("transformers")]


def test_a_normalising_model_is_saved_with_its_normalize_module(tiny_bert, tmp_path):
    """A model loaded with a Normalize module (all-MiniLM-L6-v2 has one) keeps it when saved again: the saved
    folder still gives unit vectors in sentence-transformers and in mirrorbert (it used to drop it)."""
    import json

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from mirrorbert.encoder.model import Encoder

    first = Encoder.load(tiny_bert, device="cpu")
    first.normalize_default = True
    first.save(tmp_path / "a")
    modules = json.loads((tmp_path / "a" / "modules.json").read_text(encoding="utf-8"))
    assert modules[-1]["type"].endswith("Normalize")
    again = Encoder.load(tmp_path / "a", device="cpu")
    assert again.normalize_default is True
    again.save(tmp_path / "b")  # and once more: still there
    texts = ["the cat sat on the mat", "a dog"]
    st = SentenceTransformer(str(tmp_path / "b"), device="cpu").encode(texts)
    np.testing.assert_allclose(np.linalg.norm(st, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(Encoder.load(tmp_path / "b", device="cpu").encode(texts), st, atol=1e-5)
    plain = Encoder.load(tiny_bert, device="cpu")
    plain.save(tmp_path / "c")
    assert not any(m["type"].endswith("Normalize")
                   for m in json.loads((tmp_path / "c" / "modules.json").read_text(encoding="utf-8")))


def test_similarity_and_search_inputs_are_checked_by_name(tiny_bert):
    from mirrorbert.errors import UserError

    enc = Encoder.load(str(tiny_bert))
    assert enc.similarity(["a", "b"], "c").shape == (2, 1)
    vectors = enc.encode(["a", "b"], normalize=True)
    np.testing.assert_allclose(enc.similarity(vectors, ["a", "b"]), enc.similarity(["a", "b"], ["a", "b"]),
                               atol=1e-5)
    for a, b, fragment in (([], ["x"], "a: an empty list"), (["x", 3], ["y"], "a: a list mixing"),
                           (["x"], [1, 2], "b: vectors of dimension 2"),
                           (["x"], np.full((1, enc.dim), np.nan), "b: vector 0 is not finite"),
                           ({"x": 1}, ["y"], "a:")):
        with pytest.raises(UserError, match=fragment):
            enc.similarity(a, b)
    from mirrorbert.search import search

    with pytest.raises(UserError, match="corpus: item 0 is int"):
        search(enc, ["x"], [1, 2])
    with pytest.raises(UserError, match="queries: item 0 is bytes"):
        search(enc, [b"x"], ["a", "b"])


def test_search_is_a_function_that_takes_the_encoder(tiny_bert):
    """Searching lives in search/, uploading in publish/: functions that take the encoder."""
    from mirrorbert.search import search

    encoder = Encoder.load(tiny_bert, pooling="cls")
    hits = search(encoder, "a dog", ["a dog", "stock markets fell"], top_k=1)
    assert [h.corpus_id for h in hits] == [0]


def test_model_max_length_is_the_usable_positions_or_the_tokenizers_limit():
    """One rule for the encoder, GR-BERT and lexical substitution: RoBERTa-style positions lose the padding
    index and those before it; a smaller tokenizer limit wins; an unset one (a huge number) does not count."""
    from types import SimpleNamespace

    from mirrorbert.encoder.masked_lm import model_max_length

    def model(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    roberta = model(model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    assert model_max_length(roberta) == 512
    assert model_max_length(roberta, SimpleNamespace(model_max_length=128)) == 128
    assert model_max_length(roberta, SimpleNamespace(model_max_length=int(1e30))) == 512
    assert model_max_length(model(model_type="bert", max_position_embeddings=64)) == 64
    assert model_max_length(model(model_type="bert"), SimpleNamespace(model_max_length=1024)) == 1024
    assert model_max_length(model(model_type="bert")) == 512
