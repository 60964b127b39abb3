"""Masked-language-model pre-training, from scratch or continued from any HF masked LM, through the one run
lifecycle (`training/run.py`). Exact resume: the data position and every mask are functions of (seed, step), so N
steps and a resume of N more equal 2N steps.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorbert.data.token_stream import check_corpus_files, prepare_corpus
from mirrorbert.encoder.architectures import usable_precision
from mirrorbert.errors import UserError
from mirrorbert.mlm.config import RESUME_KEYS, PretrainConfig
from mirrorbert.mlm.masking import MlmMasker
from mirrorbert.mlm.method import STREAM_ORDER, MlmData, MlmMethod, mlm_loss, windows
from mirrorbert.mlm.models import ARCHITECTURES, build_model
from mirrorbert.reporting.metrics import library_versions
from mirrorbert.safeguards.writes import write_json_atomic
from mirrorbert.training.plan import BatchPlan
from mirrorbert.training.run import GuardedPaths, Recipe, RunContext, run

logger = logging.getLogger(__name__)

INFO_FILE = "mlm_pretraining.json"


@dataclass
class PretrainResult:
    output: Path | None
    steps: int
    tokens: int
    train_loss: float | None  # mean per masked token over the last logging window (train_loss_window_steps)
    train_accuracy: float | None
    eval_loss: float | None
    eval_accuracy: float | None
    tokens_per_s: float
    wall_time_s: float
    interrupted: bool = False
    checkpoint: Path | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    stop_signal: str | None = None  # "SIGTERM" (preempted) or "SIGINT" when interrupted
    train_loss_window_steps: int | None = None


def pretrain(cfg: PretrainConfig) -> PretrainResult:
    """Run MLM pre-training as configured and write an HF `*ForMaskedLM` folder to `cfg.output`."""
    cfg.validate()
    return run(MlmRecipe(cfg))


class MlmRecipe(Recipe):
    """MLM pre-training's part of a run: the corpus, the model to start from, the budget, the saved MLM."""

    label = "pretrain-mlm"

    def guarded_paths(self) -> GuardedPaths:
        cfg = self.cfg
        return GuardedPaths(inputs={"--corpus": list(cfg.corpus), "--model": cfg.model, "--tokenizer": cfg.tokenizer,
                                    "--resume": cfg.resume},
                            extra_outputs=[("--log-dir", cfg.log_dir), ("--cache-dir", cfg.resolved_cache_dir())],
                            model=cfg.model)

    def read_data(self, run_ctx: RunContext) -> None:
        check_corpus_files(self.cfg.corpus)  # a missing or binary corpus fails before the model loads

    def saved_config(self, resume) -> dict[str, Any]:
        saved = resume.meta.get("pretrain", {}).get("config", {})
        return {k: v for k, v in saved.items() if k not in RESUME_KEYS}  # RESUME_KEYS have their own message

    def build(self, run_ctx: RunContext) -> MlmMethod:
        cfg, resume = self.cfg, run_ctx.resume
        model, self.source, self.corpus, data = _model_and_data(cfg, resume)
        run_ctx.precision = usable_precision(model, run_ctx.precision, run_ctx.device)
        plan = _plan(cfg, len(data.packed))
        if resume is not None:
            _check_resume(resume, cfg, data.corpus_key, plan.total_steps)
        model.to(run_ctx.device)
        model.train()
        return MlmMethod(cfg, model, plan, data, run_ctx)

    def restore(self, method: MlmMethod, extra: dict[str, Any], resume) -> None:
        method.restore(extra)

    def stop_at(self, step: int) -> int | None:
        return None if self.cfg.stop_after_steps is None else step + self.cfg.stop_after_steps

    def before_run(self, method: MlmMethod, engine) -> None:
        cfg, plan = self.cfg, method.plan
        logger.info("MLM pre-training %s: %d train sequences of %d tokens, %d steps of %d sequences (%d tokens), "
                    "lr %g, warmup %d, device %s, %s", self.source, plan.n, cfg.seq_length, plan.total_steps,
                    cfg.batch_size * cfg.grad_accum, _tokens_per_step(cfg), method.lr, method.warmup, method.device,
                    method.precision)

    def close(self, method: MlmMethod) -> None:
        method.close()

    def stopped(self, method: MlmMethod, outcome, run_ctx: RunContext) -> PretrainResult:
        """Interrupted or --stop-after-steps: the engine left a checkpoint to resume from."""
        result = _result(method, outcome.steps, run_ctx.wall())
        result.interrupted, result.checkpoint, result.stop_signal = outcome.interrupted, outcome.checkpoint, outcome.signal
        logger.warning("stopped at step %d of %d; resume with --resume %s", outcome.steps, method.total_steps,
                       outcome.checkpoint)
        return result

    def finish(self, method: MlmMethod, outcome, engine, run_ctx: RunContext) -> PretrainResult:
        cfg = self.cfg
        result = _result(method, outcome.steps, run_ctx.wall())
        result.checkpoint = outcome.checkpoint
        result.info = info = _run_info(self, method, result)
        method.model.eval()

        def write_into(folder: Path) -> None:
            method.save_model(folder)
            write_json_atomic(folder / INFO_FILE, info)

        result.output = engine.save_final(cfg.output, write_into, overwrite=cfg.overwrite)
        logger.info("model written to %s (%d steps, %d tokens)", cfg.output, outcome.steps, result.tokens)
        return result


def _model_and_data(cfg: PretrainConfig, resume=None):
    """The model (the checkpoint's when resuming) and tokenizer, the masker, and the corpus packed into train and
    held-out windows."""
    model, tokenizer, source = build_model(cfg, resume.model_dir if resume is not None else None,
                                           f"--resume {resume.path}:" if resume is not None else "--resume")
    masker = MlmMasker.from_tokenizer(tokenizer, probability=cfg.mlm_probability, whole_word=cfg.whole_word_mask,
                                      vocab_size=model.get_input_embeddings().weight.shape[0])
    corpus = prepare_corpus(cfg.corpus, tokenizer, cfg.cache_dir, cfg.eval_fraction,
                            show_progress=cfg.show_progress)
    packed = windows(corpus, "train", cfg.seq_length)
    if len(packed) == 0:
        raise UserError("--corpus: every document went to the held-out slice; lower --eval-fraction")
    eval_packed = windows(corpus, "eval", cfg.seq_length) if corpus.n_tokens("eval") else None
    if eval_packed is None:
        logger.warning("the held-out slice is empty (corpus too small for --eval-fraction %s): no evaluation",
                       cfg.eval_fraction)
    return model, source, corpus, MlmData(tokenizer, packed, eval_packed, masker, corpus.meta["corpus_key"])


def _run_info(recipe: MlmRecipe, method: MlmMethod, result: PretrainResult) -> dict[str, Any]:
    """What `mlm_pretraining.json` records about the run."""
    cfg, corpus, plan, packed, eval_packed = recipe.cfg, recipe.corpus, method.plan, method.data.packed, method.data.eval_packed
    return {
        "method": "mlm-pretraining",
        "source": recipe.source,
        "config": {**cfg.to_dict(), "lr": method.lr, "warmup_steps": method.warmup},
        "corpus": {"files": corpus.meta["sources"], "train_tokens": corpus.n_tokens("train"),
                   "eval_tokens": corpus.n_tokens("eval"), "train_sequences": len(packed),
                   "eval_sequences": len(eval_packed) if eval_packed is not None else 0},
        "steps": result.steps,
        "total_steps": plan.total_steps,
        "tokens_seen": result.tokens,
        "epochs": round(result.steps * cfg.grad_accum / plan.batches_per_epoch, 4),
        "train_loss": result.train_loss,
        "train_loss_window_steps": result.train_loss_window_steps,
        "train_accuracy": result.train_accuracy,
        "eval_loss": result.eval_loss,
        "eval_accuracy": result.eval_accuracy,
        "tokens_per_s_last_session": round(result.tokens_per_s, 1),
        "wall_time_s_last_session": round(result.wall_time_s, 1),
        "device": str(method.device),
        "precision": method.precision,
        "versions": library_versions(),
        "history": result.history,
    }


def _check_resume(resume, cfg: PretrainConfig, corpus_key: str, total_steps: int) -> None:
    """The checkpoint's corpus and data-order settings must be this run's."""
    saved = resume.meta.get("pretrain", {})
    if saved.get("corpus_key") != corpus_key:
        raise UserError(f"--resume {resume.path}: the corpus or tokenizer differ from the run that wrote it")
    changed = [k for k in RESUME_KEYS if saved.get("config", {}).get(k) != getattr(cfg, k)]
    if changed:
        raise UserError(f"--resume {resume.path}: cannot resume with different "
                        + ", ".join("--" + k.replace("_", "-") for k in changed))
    if saved.get("total_steps") != total_steps:
        logger.warning("the budget changed since the checkpoint (%s -> %d steps): the learning-rate schedule "
                       "is stretched from here on", saved.get("total_steps"), total_steps)


def _tokens_per_step(cfg: PretrainConfig) -> int:
    return cfg.batch_size * cfg.grad_accum * cfg.seq_length


def _plan(cfg: PretrainConfig, n_sequences: int) -> BatchPlan:
    """The plan with its total steps: from --max-tokens, else from --epochs (1 when no budget is given)."""
    plan = BatchPlan(n_sequences, cfg.batch_size, cfg.seed, STREAM_ORDER, keep_short_last=True)
    if cfg.max_tokens is not None:
        plan.total_steps = max(1, math.ceil(cfg.max_tokens / _tokens_per_step(cfg)))
    else:
        epochs = cfg.epochs if cfg.epochs is not None else 1.0
        plan.total_steps = max(1, math.ceil(math.ceil(epochs * plan.batches_per_epoch) / cfg.grad_accum))
    return plan


def _result(method: MlmMethod, step: int, wall: float) -> PretrainResult:
    last_train, last_eval, history = method.last_train, method.last_eval, method.history
    if not last_train and history:
        last_train = next((h for h in reversed(history) if "loss" in h), {})
    return PretrainResult(
        output=None, steps=step, tokens=method.tokens_seen, train_loss=last_train.get("loss"),
        train_accuracy=last_train.get("accuracy"),
        eval_loss=(last_eval or {}).get("eval_loss"), eval_accuracy=(last_eval or {}).get("eval_accuracy"),
        tokens_per_s=method.run_tokens / max(time.time() - method.loop_start, 1e-9), wall_time_s=wall,
        history=history, train_loss_window_steps=last_train.get("window_steps"),
    )


__all__ = ["ARCHITECTURES", "INFO_FILE", "PretrainConfig", "PretrainResult", "pretrain", "mlm_loss"]
