"""Every trainer on every representative encoder type, fresh and resumed: a run stopped at a checkpoint and resumed
ends with the weights of the uninterrupted run, bit for bit, and its model was prepared the same way (RoFormer's
sinusoid table frozen, X-MOD's default language and adapter casts in place) whichever path loaded it.

Types: BERT, RoBERTa, DeBERTa-v2, ModernBERT, RoFormer, X-MOD, ALBERT, MPNet; trainers: Mirror-BERT, MLM
pre-training, GR-BERT. The fast suite runs the types with a preparation rule (RoFormer, X-MOD) and BERT; the
rest are slow. Each also runs in bf16 and fp16 (CPU autocast; fp16 with its loss scaler, whose state the
checkpoint carries): a resumed reduced-precision run is exact too (BERT's cells in the fast suite).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import ROWS
from tiny_models import CORPUS, make_tiny_mlm

TYPES = ("bert", "roberta", "deberta-v2", "modernbert", "roformer", "xmod", "albert", "mpnet")
FAST_TYPES = ("bert", "roformer", "xmod")
TRAINERS = ("mirror", "mlm", "gloss")
TOTAL, STOP = 4, 2
# fp16's loss scaler starts at 2**16 and skips the steps whose gradients overflow while it backs off: fp16 runs
# take more steps, so that some of them train.
FP16_TOTAL, FP16_STOP = 12, 6


def _cells():
    for trainer in TRAINERS:
        for model_type in TYPES:
            for precision in ("fp32", "bf16", "fp16"):
                fast = (model_type in FAST_TYPES and precision == "fp32") or model_type == "bert"
                yield pytest.param(trainer, model_type, precision, id=f"{trainer}-{model_type}-{precision}",
                                   marks=() if fast else pytest.mark.slow)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume-matrix")
    made: dict[str, Path] = {}

    def model(model_type: str) -> Path:
        if model_type not in made:
            try:
                made[model_type] = make_tiny_mlm(model_type, root / model_type)
            except (ValueError, KeyError, ImportError) as exc:
                pytest.skip(f"the installed transformers cannot build {model_type!r}: {exc}")
        return made[model_type]

    return model


def _mirror(model: Path, tmp: Path, precision: str, output: Path, resume: str | None, stop: bool):
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mirror.train import MirrorRecipe
    from mirrorbert.training.run import run

    data = tmp / "strings.txt"
    data.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    cfg = TrainConfig(model=str(model), data=str(data), output=str(output), steps=TOTAL, batch_size=4, max_length=16,
                      lr=1e-3, mask_span=1, device="cpu", precision=precision, show_progress=False, seed=0,
                      save_every=1, resume=resume)
    return run(_stopping(MirrorRecipe)(cfg) if stop else MirrorRecipe(cfg))


def _mlm(model: Path, tmp: Path, precision: str, output: Path, resume: str | None, stop: bool):
    from mirrorbert.mlm.pretrain import PretrainConfig, pretrain

    text = tmp / "corpus.txt"
    text.write_text("\n\n".join("\n".join(CORPUS[i % 5] for i in range(j, j + 3)) for j in range(30)) + "\n",
                    encoding="utf-8")
    return pretrain(PretrainConfig(model=str(model), corpus=[str(text)], output=str(output), seq_length=16,
                                   batch_size=4, max_tokens=TOTAL * 4 * 16, eval_fraction=0.0, lr=1e-3, seed=0,
                                   device="cpu", precision=precision, show_progress=False, save_every=1,
                                   cache_dir=str(tmp / "cache"), resume=resume,
                                   stop_after_steps=STOP if stop else None))


def _gloss(model: Path, tmp: Path, precision: str, output: Path, resume: str | None, stop: bool):
    from mirrorbert.gloss.pretrain import GlossPretrainConfig, GlossRecipe
    from mirrorbert.training.run import run

    tsv = tmp / "triplets.tsv"
    tsv.write_text("".join(f"{w}\t{s}\t{g}\n" for w, s, g in ROWS), encoding="utf-8")
    cfg = GlossPretrainConfig(model=str(model), triplets=str(tsv), output=str(output), steps=TOTAL, batch_size=4,
                              holdout=0.0, lr=1e-3, warmup=0.1, seed=3, mlm_prob=0.2, device="cpu",
                              precision=precision, show_progress=False, save_every=1, resume=resume)
    return run(_stopping(GlossRecipe)(cfg) if stop else GlossRecipe(cfg))


def _stopping(recipe_class):
    """The recipe, stopped after STOP steps with a checkpoint, as a preempted run is."""

    class Stopping(recipe_class):
        def stop_at(self, step: int) -> int:
            return step + STOP

    return Stopping


RUNS = {"mirror": _mirror, "mlm": _mlm, "gloss": _gloss}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("trainer, model_type, precision", list(_cells()))
def test_a_resumed_run_equals_the_uninterrupted_one(trainer, model_type, precision, models, tmp_path, monkeypatch):
    model, train = models(model_type), RUNS[trainer]
    if precision == "fp16":
        monkeypatch.setattr(f"{__name__}.TOTAL", FP16_TOTAL)
        monkeypatch.setattr(f"{__name__}.STOP", FP16_STOP)
    full = tmp_path / "full"
    train(model, tmp_path, precision, full, None, False)
    stopped = tmp_path / "stopped"
    result = train(model, tmp_path, precision, stopped, None, True)
    assert result.checkpoint is not None and not stopped.exists()
    train(model, tmp_path, precision, stopped, str(result.checkpoint), False)
    a, b = _weights(full), _weights(stopped)
    assert a.keys() == b.keys()
    changed = [key for key in a if not torch.equal(a[key], b[key])]
    assert changed == [], f"{trainer} {model_type} {precision}: resumed weights differ in {changed[:3]}"
    start = {key.split(".", 1)[-1]: value for key, value in _weights(model).items()}  # without the MLM's prefix
    start.update(_weights(model))
    trained = [key for key in a if key.split(".", 1)[-1] in start or key in start]
    assert trained and any(not torch.equal(start.get(key, start.get(key.split(".", 1)[-1])), a[key])
                           for key in trained), "the run trained nothing"


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_resumed_roformer_keeps_its_sinusoids_frozen(trainer, models, tmp_path):
    """The checkpoint's model passes the same preparation as a fresh start (the table never trains)."""
    model, train = models("roformer"), RUNS[trainer]
    stopped = tmp_path / "stopped"
    result = train(model, tmp_path, "fp32", stopped, None, True)
    train(model, tmp_path, "fp32", stopped, str(result.checkpoint), False)
    before, after = _weights(model), _weights(stopped)
    table = [key for key in after if key.endswith("embed_positions.weight")]
    start = next(key for key in before if key.endswith("embed_positions.weight"))
    assert table and all(torch.equal(after[key], before[start]) for key in table)


def test_the_checkpoint_records_the_precision_that_ran(models, tmp_path):
    model = models("deberta-v2")
    from mirrorbert.training.checkpoints import load_checkpoint

    for precision in ("bf16", "fp16", "fp32"):
        result = _mirror(model, tmp_path, precision, tmp_path / precision, None, True)
        checkpoint = load_checkpoint(str(result.checkpoint))
        assert checkpoint.meta["precision"] == precision
        if precision == "fp16":  # the loss scaler's state travels with the checkpoint
            from mirrorbert.training.checkpoints import read_training_state

            scaler = read_training_state(checkpoint.path)["scaler"]
            assert scaler is not None and float(scaler["scale"]) > 0
        else:
            from mirrorbert.training.checkpoints import read_training_state

            assert read_training_state(checkpoint.path).get("scaler") is None
