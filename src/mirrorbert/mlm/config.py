"""Options of MLM pre-training (`mirrorbert pretrain-mlm`): one typed dataclass, checked once; no torch import."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.seeds import SEED_RULE, seed_ok

# Data-order settings: a checkpoint can only be resumed when all of these are unchanged.
RESUME_KEYS = ("seq_length", "batch_size", "grad_accum", "seed", "mlm_probability", "whole_word_mask", "eval_fraction")
# Options that may change on --resume without changing the result (the corpus key is checked separately).
RESUME_HARMLESS = ("corpus", "output", "overwrite", "model", "tokenizer", "cache_dir", "epochs", "max_tokens", "device",
                   "threads", "eval_every", "eval_sequences", "save_every", "checkpoint_dir", "keep_checkpoints",
                   "resume", "stop_after_steps", "log_dir", "log_every", "show_progress", "prefetch_batches",
                   "trust_remote_code")


@dataclass
class PretrainConfig:
    """Every knob of an MLM pre-training run; field names match the long CLI options (`_` -> `-`)."""

    corpus: list[str] = field(default_factory=list)
    output: str | None = None
    overwrite: bool = False
    # model: one of model (continued pre-training) or architecture (from scratch, needs tokenizer)
    model: str | None = None
    architecture: str | None = None
    tokenizer: str | None = None
    # data and objective
    seq_length: int = 128
    mlm_probability: float = 0.15
    whole_word_mask: bool = False
    eval_fraction: float = 0.01
    cache_dir: str | None = None
    # optimisation
    lr: float | None = None  # None: 5e-4 from scratch, 5e-5 continued
    weight_decay: float = 0.01
    warmup_steps: int | None = None  # None: 6% of the steps (at most 10,000)
    max_grad_norm: float | None = 1.0
    batch_size: int = 128
    grad_accum: int = 1
    max_tokens: int | None = None
    epochs: float | None = None  # neither budget given: 1 epoch
    seed: int = 42
    # hardware
    device: str = "auto"
    precision: str = "fp32"
    threads: int | None = None  # CPU threads for torch during the run (None: torch's default)
    # bookkeeping
    eval_every: int = 500
    eval_sequences: int = 256
    save_every: int = 0
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 2
    resume: str | None = None
    stop_after_steps: int | None = None
    log_dir: str | None = None
    log_every: int = 50
    show_progress: bool = True
    prefetch_batches: int = 4
    trust_remote_code: bool = False  # --trust-remote-code (safeguards/model_loading.py)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved_checkpoint_dir(self) -> Path:
        """Checkpoints live beside the output so the final model folder can be written atomically."""
        from mirrorbert.safeguards.writes import default_checkpoint_dir

        return default_checkpoint_dir(self.output, self.checkpoint_dir)

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
    from mirrorbert.mlm.masking import MaskingConfig

    MaskingConfig(mlm_probability=cfg.mlm_probability)  # raises UserError on a bad value
