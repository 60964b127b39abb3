"""Options of GR-BERT pre-training (`mirrorbert gloss-pretrain`): one typed dataclass, checked once; no torch import."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.typed import check_finite_numbers, check_types

# Options that may change on --resume without changing the result (the triplets' fingerprint is checked).
RESUME_HARMLESS = ("model", "output", "triplets", "data_dir", "overwrite", "limit", "export_triplets", "epochs",
                   "steps", "device", "eval_batch_size", "save_every", "checkpoint_dir", "keep_checkpoints", "resume",
                   "log_dir", "show_progress", "trust_remote_code")


@dataclass
class GlossPretrainConfig:
    """Options of ``mirrorbert gloss-pretrain`` (see its --help for each)."""

    model: str = ""
    output: str = ""
    triplets: str = "wordnet"
    data_dir: str | None = None
    overwrite: bool = False
    holdout: float = 0.05
    limit: int | None = None
    export_triplets: str | None = None
    arch: str = "mt"
    lam: float = 2.0
    tau: float = 0.05
    mlm_prob: float = 0.0
    hard_negatives: bool = True
    max_length: int = 128
    max_gloss_length: int = 64
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup: float = 0.1
    batch_size: int = 48
    epochs: int = 10
    steps: int | None = None
    max_grad_norm: float = 1.0
    seed: int = 42
    device: str = "auto"
    precision: str = "auto"  # bf16 where native (GPUs, AVX512-BF16/AMX CPUs), else fp32/fp16
    eval_batch_size: int = 64
    save_every: int = 0
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 2
    resume: str | None = None
    log_dir: str | None = None
    show_progress: bool = True
    trust_remote_code: bool = False  # --trust-remote-code (safeguards/model_loading.py)

    def validate(self) -> None:
        check_types(self)  # a value of the wrong type is named before any comparison trips over it
        if not self.model:
            raise UserError("--model is required: the masked LM to start from")
        if not self.output:
            raise UserError("--output is required: the folder to write the trained model to")
        if self.arch not in ("mt", "sc"):
            raise UserError(f"--arch must be mt or sc, got {self.arch!r}")
        for name in ("batch_size", "epochs", "max_length", "max_gloss_length", "eval_batch_size", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise UserError("--batch-size must be >= 2: the other triplets' glosses are the negatives")
        if self.steps is not None and self.steps < 1:
            raise UserError(f"--steps must be >= 1, got {self.steps}")
        if self.limit is not None and self.limit < 2:
            raise UserError(f"--limit must be >= 2, got {self.limit}")
        if not 0.0 <= self.mlm_prob < 1.0:
            raise UserError(f"--mlm-prob must be in [0, 1), got {self.mlm_prob}")
        if not 0.0 <= self.warmup < 1.0:
            raise UserError(f"--warmup must be a fraction in [0, 1), got {self.warmup}")
        if self.tau <= 0 or self.lr <= 0 or self.lam < 0:
            raise UserError("--tau and --lr must be > 0 and --lambda >= 0")
        if self.save_every < 0:
            raise UserError(f"--save-every must be >= 0, got {self.save_every}")
        check_finite_numbers(self, {"lam": "--lambda"})
        if self.weight_decay < 0:
            raise UserError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm <= 0:
            raise UserError(f"--max-grad-norm must be > 0, got {self.max_grad_norm}")
        from mirrorbert.settings.seeds import check_seed

        check_seed(self.seed)
        if not 0.0 <= self.holdout < 1.0:
            raise UserError(f"--holdout must be a fraction in [0, 1), got {self.holdout}")
        from mirrorbert.runtime.device import check_device_and_precision  # torch: not at --help time

        check_device_and_precision(self.device, self.precision)

    def resolved_checkpoint_dir(self) -> Path:
        from mirrorbert.safeguards.writes import default_checkpoint_dir

        return default_checkpoint_dir(self.output, self.checkpoint_dir)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
