"""mirrorbert models under MTEB (mirrorbert.integrations.mteb): the encoder protocol, and a real STS task
built from local STS-B files run through `mteb.evaluate`, offline, scored the same as an independent
computation."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mirrorbert import Encoder
from mirrorbert.errors import UserError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mteb") is None,
                                reason='mteb not installed (pip install "mirrorbert[mteb]")')

N_PAIRS = 200


@pytest.fixture
def mteb(tmp_path, monkeypatch):
    """mteb, imported only once MTEB_CACHE points into tmp_path: its import creates the cache folder."""
    monkeypatch.setenv("MTEB_CACHE", str(tmp_path / "mteb-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    import mteb

    return mteb


@pytest.fixture(scope="module")
def saved_model(tiny_bert, tmp_path_factory) -> Path:
    """The tiny BERT saved by mirrorbert: a folder with mirrorbert.json naming its base model."""
    folder = tmp_path_factory.mktemp("models") / "tiny-mirror"
    Encoder.load(tiny_bert).save(folder)
    return folder


@pytest.fixture(scope="module")
def stsb_pairs(shared_data):
    from mirrorbert.evaluation.sts import load_stsb

    path = shared_data / "sts" / "STSBenchmark" / "sts-dev.csv"
    if not path.exists():
        pytest.skip(f"{path} not found")
    pairs = load_stsb(path)
    step = len(pairs) // N_PAIRS  # spread over the genres (the file is ordered by genre)
    keep = range(0, step * N_PAIRS, step)
    return [pairs.s1[i] for i in keep], [pairs.s2[i] for i in keep], pairs.scores[list(keep)]


def local_sts_task(mteb, s1, s2, scores):
    """An MTEB STS task whose data come from memory instead of the Hugging Face hub."""
    from datasets import Dataset
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata

    class LocalSTSB(AbsTaskSTS):
        min_score = 0
        max_score = 5
        metadata = TaskMetadata(
            name="LocalSTSBenchmarkDev",
            dataset={"path": "local/stsbenchmark-dev", "revision": "local"},
            description=f"{len(s1)} STS Benchmark dev pairs read from a local file.",
            reference="https://ixa2.si.ehu.eus/stswiki/index.php/STSbenchmark",
            type="STS",
            category="t2t",
            modalities=["text"],
            eval_splits=["dev"],
            eval_langs=["eng-Latn"],
            main_score="cosine_spearman",
        )

        def load_data(self, num_proc=None, **kwargs):
            if self.data_loaded:
                return
            self.dataset = {"dev": Dataset.from_dict(
                {"sentence1": list(s1), "sentence2": list(s2), "score": [float(x) for x in scores]})}
            self.data_loaded = True

    return LocalSTSB()


def independent_spearman(encoder: Encoder, s1, s2, gold, batch_size: int) -> float:
    """scipy's Spearman of float64 cosines of `Encoder.encode` vectors (batched as mteb's run: same vectors)."""
    from scipy.stats import spearmanr

    a = encoder.encode(list(s1), batch_size=batch_size).astype(np.float64)
    b = encoder.encode(list(s2), batch_size=batch_size).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(spearmanr(cos, gold).correlation)


def test_adapter_satisfies_the_protocol(mteb, saved_model, tiny_bert):
    from mteb._create_dataloaders import create_dataloader
    from datasets import Dataset
    from mteb.models import EncoderProtocol, ModelMeta

    from mirrorbert.integrations.mteb import MirrorBertMTEB

    model = MirrorBertMTEB(saved_model, batch_size=4)
    assert isinstance(model, EncoderProtocol)

    texts = ["the cat sat on the mat", "a dog ran in the park", "heart attack", "x", "the bank raised rates"]
    task = local_sts_task(mteb, texts, texts, [1.0] * len(texts))
    loader = create_dataloader(Dataset.from_dict({"text": texts}), task_metadata=task.metadata, batch_size=2)
    assert isinstance(next(iter(loader)), dict) and "text" in next(iter(loader))
    vectors = model.encode(loader, task_metadata=task.metadata, hf_split="dev", hf_subset="default",
                           prompt_type=None, batch_size=2, show_progress_bar=False)
    direct = Encoder.load(saved_model).encode(texts)
    assert isinstance(vectors, np.ndarray) and vectors.dtype == np.float32
    assert vectors.shape == (len(texts), model.encoder.dim)
    np.testing.assert_allclose(vectors, direct, atol=1e-5)
    # a query/document prompt type changes nothing (Mirror-BERT uses no prompts)
    np.testing.assert_allclose(model.encode(loader, task_metadata=task.metadata, hf_split="dev", hf_subset="default",
                                            prompt_type=mteb.types.PromptType.query), vectors, atol=1e-6)
    empty = model.encode(create_dataloader(Dataset.from_dict({"text": []}), task_metadata=task.metadata),
                         task_metadata=task.metadata, hf_split="dev", hf_subset="default")
    assert empty.shape == (0, model.encoder.dim)

    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = model.similarity(vectors, vectors[:2])
    assert tuple(sims.shape) == (5, 2)
    np.testing.assert_allclose(np.asarray(sims), unit @ unit[:2].T, atol=1e-5)
    np.testing.assert_allclose(np.asarray(model.similarity(torch.from_numpy(vectors[0]), list(vectors[:3]))),
                               unit[:1] @ unit[:3].T, atol=1e-5)  # mteb's rerank path passes a list of rows
    pair = model.similarity_pairwise(vectors, vectors[::-1].copy())
    np.testing.assert_allclose(np.asarray(pair), (unit * unit[::-1]).sum(1), atol=1e-5)
    with pytest.raises(UserError, match="float32"):
        model.encode(loader, task_metadata=task.metadata, hf_split="dev", hf_subset="default", precision="int8")
    with pytest.raises(UserError, match="text"):
        model.encode([{"image": [None]}], task_metadata=task.metadata, hf_split="dev", hf_subset="default")

    meta = model.mteb_model_meta
    assert isinstance(meta, ModelMeta)
    assert meta.name == "mirrorbert/tiny-mirror"
    assert meta.adapted_from == Path(tiny_bert).name  # mirrorbert.json base_model, by folder name only
    assert meta.revision.startswith("weights-") and meta.revision == MirrorBertMTEB(saved_model).mteb_model_meta.revision
    assert meta.embed_dim == model.encoder.dim and meta.max_tokens == model.encoder.max_length
    assert meta.n_parameters == sum(p.numel() for p in model.encoder.model.parameters())
    assert meta.similarity_fn_name.value == "cosine" and meta.languages is None and meta.release_date is None
    assert meta.to_dict()["loader"] == "load_mteb_model"
    reloaded = meta.load_model()  # the metadata's loader reads the folder again
    assert isinstance(reloaded, MirrorBertMTEB) and reloaded.mteb_model_meta.name == meta.name
    np.testing.assert_allclose(reloaded.encode(texts), vectors, atol=1e-5)

    # other weights, other revision: mteb's result cache must not hand a retrained model the old scores
    changed = Encoder.load(saved_model)
    with torch.no_grad():
        next(changed.model.parameters()).add_(0.01)
    assert MirrorBertMTEB(changed).mteb_model_meta.revision != meta.revision
    assert MirrorBertMTEB(changed, "v2", name="me/model").mteb_model_meta.revision == "v2"
    with pytest.raises(UserError, match="organization"):
        MirrorBertMTEB(changed, name="no-slash")
    with pytest.raises(UserError, match="batch_size"):
        MirrorBertMTEB(changed, batch_size=0)


def test_local_sts_task_through_mteb_evaluate(mteb, saved_model, stsb_pairs, tmp_path):
    from mirrorbert.evaluation.sts import PairSet, score_pairs
    from mirrorbert.integrations.mteb import MirrorBertMTEB

    s1, s2, gold = stsb_pairs
    model = MirrorBertMTEB(saved_model)
    cache = mteb.ResultCache(tmp_path / "results")
    result = mteb.evaluate(model, local_sts_task(mteb, s1, s2, gold), cache=cache, show_progress_bar=False,
                           co2_tracker=False, encode_kwargs={"batch_size": 32})
    assert not result.exceptions
    (task_result,) = result.task_results
    (scores,) = task_result.scores["dev"]
    main = scores["main_score"]
    assert np.isfinite(main) and main == scores["cosine_spearman"]
    encoder = Encoder.load(saved_model)
    # mteb's cosines (float32), ours (float64 of vectors batched otherwise), the adapter's own similarity_pairwise
    # (float32 torch) and mirrorbert's STS evaluator agree up to float rounding: one swap of two near-equal
    # cosines moves a Spearman of 200 pairs by 1.5e-6, and where it falls differs between CPUs, so 1e-5.
    assert main == pytest.approx(independent_spearman(encoder, s1, s2, gold, batch_size=32), abs=1e-5)
    assert scores["spearman"] == pytest.approx(main, abs=1e-5)
    assert main == pytest.approx(score_pairs(encoder, PairSet(list(s1), list(s2), np.asarray(gold))), abs=1e-5)

    # results are filed in the cache given, under tmp_path: name / weights revision / task
    written = sorted(p.relative_to(cache.cache_path) for p in cache.cache_path.rglob("*.json"))
    revision = model.mteb_model_meta.revision
    assert Path("results", "mirrorbert__tiny-mirror", revision, "LocalSTSBenchmarkDev.json") in written


def test_mirrorbert_imports_no_mteb():
    code = ("import sys, mirrorbert, mirrorbert.encoder.model, mirrorbert.cli.app, mirrorbert.integrations, "
            "mirrorbert.integrations.mteb; assert 'mteb' not in sys.modules, 'mteb imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
