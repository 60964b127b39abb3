"""Options of MLM pre-training (`mirrorbert pretrain-mlm`): one typed dataclass, checked once; no torch import."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import option, redeclare
from mirrorbert.settings.run_options import RunOptions
from mirrorbert.settings.seeds import SEED_RULE, seed_ok

# Data-order settings: a checkpoint can only be resumed when all of these are unchanged.
RESUME_KEYS = ("seq_length", "batch_size", "grad_accum", "seed", "mlm_probability", "whole_word_mask", "eval_fraction")


@dataclass(kw_only=True)
class PretrainConfig(RunOptions):
    """Every knob of an MLM pre-training run; each field is the long CLI option of the same name (`_` -> `-`),
    declared once with its help and facts (settings/fields.py); the bookkeeping ones come from `RunOptions`.
    `resume_safe` options may change on --resume (the corpus is checked by its key)."""

    corpus: list[str] = option(shared="corpus", note="UTF-8 text file(s): one sentence per line, blank lines "
                                                     "separate documents", default_factory=list, group="output",
                               required=True, nargs="+", metavar="FILE", resume_safe=True)
    # model: one of model (continued pre-training) or architecture (from scratch, needs tokenizer)
    model: str | None = option(None, shared="model", note="continue pre-training this MLM", group="output",
                               resume_safe=True)
    architecture: str | None = option(None, shared="architecture", note="pre-train from scratch (with --tokenizer)",
                                      group="output")
    tokenizer: str | None = option(None, help="tokenizer folder (required with --architecture; default with --model: "
                                              "the model's)", group="output", resume_safe=True)
    # data and objective
    seq_length: int = option(128, help="tokens per packed sequence, specials included", group="data")
    mlm_probability: float = option(0.15, help="fraction of tokens to predict", group="data")
    whole_word_mask: bool = option(False, help="select whole words instead of sub-word tokens", group="data")
    eval_fraction: float = option(0.01, help="fraction of documents held out for evaluation", group="data")
    cache_dir: str | None = option(None, help="where the tokenised corpus is kept",
                                   unset="~/.cache/mirrorbert/mlm-corpus", group="data", resume_safe=True)
    # optimisation
    lr: float | None = option(None, shared="lr", note="the peak", unset="5e-4 from scratch, 5e-5 continued",
                              group="optimisation")
    weight_decay: float = option(0.01, shared="weight_decay", group="optimisation")
    warmup_steps: int | None = option(None, shared="warmup_steps", note="then linear decay to 0",
                                      unset="6% of the steps, at most 10,000", group="optimisation")
    max_grad_norm: float | None = option(1.0, shared="max_grad_norm", group="optimisation")
    batch_size: int = option(128, shared="batch_size", note="sequences per forward pass", group="optimisation")
    grad_accum: int = option(1, help="forward passes per optimiser step", group="optimisation")
    max_tokens: int | None = option(None, help="budget: stop after this many training tokens", group="optimisation",
                                    resume_safe=True)
    epochs: float | None = option(None, shared="epochs", note="a budget, fractions allowed",
                                  unset="1 when no budget is given", group="optimisation", resume_safe=True)
    # hardware and bookkeeping
    eval_every: int = option(500, help="held-out evaluation every N steps", group="hardware", resume_safe=True)
    eval_sequences: int = option(256, help="held-out sequences per evaluation", group="hardware", resume_safe=True)
    stop_after_steps: int | None = option(None, help="run only N more steps of the budget now, checkpoint and exit "
                                                     "(resume later)", group="hardware", resume_safe=True)
    prefetch_batches: int = option(4, help="batches made ahead of the step in a background thread; 0: in the step's "
                                           "own thread", group="hardware", resume_safe=True)
    output: str | None = redeclare(RunOptions, "output", note="the model's folder", required=True)
    precision: str = redeclare(RunOptions, "precision", default="fp32")
    save_every: int = redeclare(RunOptions, "save_every", note="0: only on interrupt")
    log_every: int = redeclare(RunOptions, "log_every", default=50)

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir)
        base = os.environ.get("MIRRORBERT_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mirrorbert"
        )
        return Path(base) / "mlm-corpus"


def validate(cfg: PretrainConfig) -> None:
    from mirrorbert.settings.typed import check_types

    check_types(cfg)
    def check(ok: bool, option: str, message: str) -> None:
        if not ok:
            raise UserError(f"--{option}: {message}")

    check(bool(cfg.corpus), "corpus", "give at least one corpus file (UTF-8 text, one sentence per line)")
    check(bool(cfg.output), "output", "required: the folder to write the pre-trained model to")
    check(seed_ok(cfg.seed), "seed", f"{SEED_RULE}, not {cfg.seed!r}")
    check((cfg.model is None) != (cfg.architecture is None), "model",
          "give exactly one of --model (continue pre-training an MLM) or --architecture (from scratch)")
    check(cfg.architecture is None or cfg.tokenizer is not None, "tokenizer",
          "pre-training from scratch (--architecture) needs --tokenizer DIR")
    check(cfg.max_tokens is None or cfg.epochs is None, "max-tokens", "give --max-tokens or --epochs, not both")
    check(cfg.max_tokens is None or cfg.max_tokens >= 1, "max-tokens", "must be >= 1")
    check(cfg.epochs is None or cfg.epochs > 0, "epochs", "must be > 0")
    check(cfg.seq_length >= 8, "seq-length", "must be at least 8")
    check(cfg.lr is None or cfg.lr > 0, "lr", "must be a positive number")
    check(cfg.weight_decay >= 0, "weight-decay", "must be >= 0")
    check(cfg.warmup_steps is None or cfg.warmup_steps >= 0, "warmup-steps", "must be >= 0")
    check(cfg.max_grad_norm is None or cfg.max_grad_norm > 0, "max-grad-norm", "must be positive")
    for key in ("batch_size", "grad_accum", "eval_every", "eval_sequences", "keep_checkpoints", "log_every"):
        check(getattr(cfg, key) >= 1, key.replace("_", "-"), "must be an integer >= 1")
    check(cfg.save_every >= 0, "save-every", "must be >= 0")
    check(cfg.stop_after_steps is None or cfg.stop_after_steps >= 1, "stop-after-steps", "must be >= 1")
    check(0 <= cfg.eval_fraction < 1, "eval-fraction", "must be in [0, 1)")
    check(cfg.threads is None or cfg.threads >= 1, "threads", "must be >= 1")
    check(cfg.prefetch_batches >= 0, "prefetch-batches", "must be >= 0")
    from mirrorbert.mlm.masking import MaskingConfig

    MaskingConfig(mlm_probability=cfg.mlm_probability)  # raises UserError on a bad value
