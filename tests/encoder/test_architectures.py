"""The architecture matrix: a tiny random masked LM of every encoder type transformers builds trains with
Mirror-BERT in each precision (fp32, bf16, fp16: named, never what this machine's `auto` picks), encodes in it,
saves, and loads back in mirrorbert and in sentence-transformers with the same vectors; the slow part exports it
to ONNX and runs GR-BERT pre-training on it. The fast suite runs every type in fp32 and the types with a
precision rule (architectures.REDUCED_PRECISION) plus a packed one in bf16 and fp16; the whole product is slow.
A type the installed transformers cannot build is skipped with the reason.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from mirrorbert.cli.app import main
from mirrorbert.encoder.packing import PACKABLE_MODEL_TYPES, choose_layout
from tiny_models import CORPUS, MLM_TYPES, make_tiny_mlm

TRIPLETS = ("bank\tthe bank raised interest rates again\ta financial institution that accepts deposits\n"
            "cat\tthe cat sat on the mat\ta small domesticated feline animal\n"
            "dog\ta dog ran in the park\ta domesticated carnivorous mammal kept as a pet\n"
            "fox\tthe quick brown fox jumps over the lazy dog\ta wild animal of the dog family\n")
# Types whose export is refused in one line, and why: YOSO's hashed attention traces into a graph whose vectors differ
# from PyTorch's (cosine 0.9995 < 0.9999); Funnel's
# pooling keeps the traced sequence length, which the parity check's second batching shows.
NOT_EXPORTABLE = {"yoso": "differ from PyTorch", "funnel": "other shapes than the traced example"}


def _build(model_type: str, folder):
    try:
        return make_tiny_mlm(model_type, folder)
    except (ValueError, KeyError, ImportError) as exc:  # this transformers does not know the type
        pytest.skip(f"the installed transformers cannot build {model_type!r}: {exc}")


PRECISIONS = ("fp32", "bf16", "fp16")
# Where the matrix runs: the CPU, or the GPU of scripts/gpu_check.sh (MIRRORBERT_MATRIX_DEVICE=cuda).
DEVICE = os.environ.get("MIRRORBERT_MATRIX_DEVICE", "cpu")
# Beside every type in fp32, the fast suite's reduced-precision slice: the types with a precision rule and two
# packed ones (BERT, ModernBERT).
FAST_REDUCED = ("bert", "deberta", "xmod", "modernbert")


def _cells():
    for model_type in MLM_TYPES:
        for precision in PRECISIONS:
            fast = precision == "fp32" or model_type in FAST_REDUCED
            yield pytest.param((model_type, precision), id=f"{model_type}-{precision}",
                               marks=() if fast else pytest.mark.slow)


@pytest.fixture(scope="module", params=list(_cells()))
def trained(request, tmp_path_factory):
    """(type, precision, base model, trained folder, vectors `encode` wrote in that precision, fp32 vectors)."""
    model_type, precision = request.param
    root = tmp_path_factory.mktemp(f"{model_type}-{precision}")
    base = _build(model_type, root / "base")
    data = root / "strings.txt"
    data.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = root / "trained"
    assert main(["train", "--model", str(base), "--data", str(data), "--output", str(out), "--steps", "2",
                 "--batch-size", "4", "--max-length", "16", "--lr", "1e-3", "--no-progress", "--device", DEVICE,
                 "--seed", "0", "--precision", precision]) == 0
    vectors = {}
    for name in dict.fromkeys((precision, "fp32")):
        vectors_file = root / f"vectors-{name}.npy"
        assert main(["encode", "--model", str(out), "--input", str(data), "--output", str(vectors_file),
                     "--no-progress", "--device", DEVICE, "--precision", name]) == 0
        vectors[name] = np.load(vectors_file)
    return model_type, precision, base, out, vectors[precision], vectors["fp32"]


def test_trains_and_encodes_finite_distinct_vectors(trained):
    model_type, precision, _, out, vectors, fp32 = trained
    assert vectors.shape[0] == len(CORPUS) and np.isfinite(vectors).all()
    assert len({row.tobytes() for row in vectors}) == len(CORPUS), f"{model_type}: identical vectors"
    record = json.loads((out / "mirrorbert.json").read_text(encoding="utf-8"))["training"]
    assert record["steps"] == 2
    # the precision that ran is recorded: the one asked, or fp32 where the type's rule says so
    from mirrorbert.encoder.architectures import REDUCED_PRECISION

    need = REDUCED_PRECISION.get(model_type)
    runs_fp32 = need is not None and need.action == "fp32" and DEVICE.split(":")[0] in need.devices
    assert record["precision"] == ("fp32" if runs_fp32 else precision)
    cosine = np.sum(_unit(vectors) * _unit(fp32), axis=1)
    assert cosine.min() > 0.99, f"{model_type} in {precision}: cosine to fp32 {cosine.min():.4f}"


def _unit(v):
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_loads_back_in_mirrorbert_with_the_same_vectors(trained):
    from mirrorbert.encoder.model import Encoder

    _, precision, _, out, vectors, fp32 = trained
    encoder = Encoder.load(out, device=DEVICE)
    np.testing.assert_allclose(encoder.encode(CORPUS, batch_size=64), fp32, atol=1e-5)
    np.testing.assert_allclose(encoder.encode(CORPUS, batch_size=64, precision=precision), vectors, atol=1e-5)


def test_loads_in_sentence_transformers_with_the_same_vectors(trained):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    _, _, _, out, _, fp32 = trained
    model = sentence_transformers.SentenceTransformer(str(out), device=DEVICE)
    np.testing.assert_allclose(model.encode(CORPUS, batch_size=64), fp32, atol=1e-5)


def test_packs_exactly_the_types_it_claims(trained):
    from mirrorbert.encoder.model import Encoder

    model_type, _, _, out, _, _ = trained
    encoder = Encoder.load(out, device="cpu")
    layout = choose_layout(encoder.model, True, encoder.tokenize(CORPUS))
    assert (layout == "packed") == (model_type in PACKABLE_MODEL_TYPES and _packs_here(model_type))


def _packs_here(model_type: str) -> bool:
    from mirrorbert.compat import transformers_takes_4d_mask
    from mirrorbert.encoder.packing import PACKING_RECIPES

    from mirrorbert.compat import installed_version

    recipe = PACKING_RECIPES[model_type]
    return (transformers_takes_4d_mask() or not recipe.needs_4d) and \
        installed_version("transformers") >= recipe.min_transformers


@pytest.mark.slow
def test_exports_to_onnx(trained, tmp_path, caplog, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from mirrorbert.encoder.export import ExportedEncoder

    model_type, precision, _, out, _, vectors = trained
    if precision != "fp32":
        pytest.skip("the export graph is fp32: the fp32 cell covers it")
    served = tmp_path / "served"
    with caplog.at_level(logging.WARNING):
        status = main(["export", "--model", str(out), "--output", str(served), "--format", "onnx"])
    if model_type in NOT_EXPORTABLE:
        assert status == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
        assert len(lines) == 1 and NOT_EXPORTABLE[model_type] in lines[0] and "Traceback" not in err
        return
    assert status == 0
    exported = ExportedEncoder.load(served, "onnx").encode(CORPUS)
    np.testing.assert_allclose(exported, vectors, atol=1e-4)


@pytest.mark.slow
def test_gloss_regularised_pretraining_runs(trained, tmp_path):
    model_type, precision, base, _, _, _ = trained
    if precision != "fp32" and model_type not in FAST_REDUCED:
        pytest.skip("GR-BERT in bf16/fp16: the types with a precision rule here, eight types in the resume matrix")
    triplets = tmp_path / "triplets.tsv"
    triplets.write_text(TRIPLETS, encoding="utf-8")
    out = tmp_path / "gr"
    assert main(["gloss-pretrain", "--model", str(base), "--triplets", str(triplets), "--output", str(out),
                 "--steps", "1", "--batch-size", "2", "--no-progress", "--device", "cpu", "--precision", precision]) == 0
    assert (out / "config.json").is_file()


# ----------------------------------------------------------------------------- each fix of a type, on its own
def test_deberta_v1_runs_bf16_in_fp32_with_one_line(tmp_path, caplog):
    from mirrorbert.encoder.architectures import usable_precision
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(_build("deberta", tmp_path / "deberta"), device="cpu")
    with caplog.at_level(logging.INFO, logger="mirrorbert.encoder.architectures"):
        assert usable_precision(encoder.model, "bf16") == "fp32"
        vectors = encoder.encode(CORPUS[:3], precision="bf16")
    assert np.isfinite(vectors).all()
    assert usable_precision(encoder.model, "fp32") == "fp32"
    assert any("fp32 for deberta" in r.message for r in caplog.records)


def test_rembert_separate_input_embedding_size_passes_preflight(tmp_path):
    from mirrorbert.encoder.source import open_model

    folder = _build("rembert", tmp_path / "rembert")
    with open_model(folder) as handle:
        assert handle.config().input_embedding_size != handle.config().hidden_size


def test_an_edited_embedding_size_is_still_refused(tmp_path):
    from mirrorbert.encoder.source import open_model
    from mirrorbert.errors import UserError

    folder = _build("rembert", tmp_path / "rembert")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["input_embedding_size"] = 24
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(UserError, match="config.json and the weights disagree"), open_model(folder) as handle:
        handle.config()


def test_xmod_without_a_default_language_takes_its_first(tmp_path, caplog):
    from mirrorbert.encoder.model import Encoder

    folder = _build("xmod", tmp_path / "xmod")
    with caplog.at_level(logging.INFO, logger="mirrorbert.encoder.architectures"):
        encoder = Encoder.load(folder, device="cpu")
    assert encoder.model.config.default_language == "en_XX"
    assert np.isfinite(encoder.encode(CORPUS[:2])).all()
    assert any("first language adapter, en_XX" in r.message for r in caplog.records)


def test_squeezebert_encodes_without_its_pooler(tmp_path):
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(_build("squeezebert", tmp_path / "squeezebert"), device="cpu")
    assert encoder.pooler_state  # taken out, written back on save
    assert np.isfinite(encoder.encode(CORPUS[:2])).all()


def test_nystromformer_landmark_attention_is_refused_up_front_on_transformers_5(tmp_path, capsys):
    from mirrorbert.compat import transformers_takes_4d_mask

    if not transformers_takes_4d_mask():
        pytest.skip("transformers 4.x passes Nystromformer a mask that broadcasts over the landmarks")
    folder = _build("nystromformer", tmp_path / "nystromformer")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["num_landmarks"] = 8
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    data = tmp_path / "strings.txt"
    data.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    assert main(["encode", "--model", str(folder), "--input", str(data), "--output", str(tmp_path / "v.npy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "landmark attention" in err[0] and "Traceback" not in err[0]
