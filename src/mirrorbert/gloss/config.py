"""Options of GR-BERT pre-training (`mirrorbert gloss-pretrain`): one typed dataclass, checked once; no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import option, redeclare
from mirrorbert.settings.run_options import RunOptions
from mirrorbert.settings.typed import check_finite_numbers, check_types

# The --max-length note of the commands that run a masked LM over sentences (gloss-pretrain, lexsub, finetune-sts).
MODEL_POSITIONS = "at most the model's positions"


@dataclass(kw_only=True)
class GlossPretrainConfig(RunOptions):
    """Options of ``mirrorbert gloss-pretrain``; each field is the long CLI option of the same name (`lam`:
    `--lambda`), declared once with its help and facts (settings/fields.py); the bookkeeping ones come from
    `RunOptions`. `resume_safe` options may change on --resume (the triplets are checked by fingerprint)."""

    model: str = option("", shared="model", note="the masked LM to start from", group="output", required=True,
                        resume_safe=True)
    triplets: str = option("wordnet", help="'wordnet' (build from <data-dir>/wordnet) or a TSV file 'word TAB "
                                           "sentence TAB gloss'", group="data", resume_safe=True)
    data_dir: str | None = option(None, shared="data_dir", note="holding wordnet/", group="data", resume_safe=True)
    holdout: float = option(0.05, help="held-out fraction of triplets", group="data")
    limit: int | None = option(None, shared="limit", note="a random sample of the triplets (seeded; for quick runs)",
                               group="data", resume_safe=True)
    export_triplets: str | None = option(None, help="also write the (training) triplets to this TSV file",
                                         group="data", resume_safe=True)
    # the method
    arch: str = option("mt", help="mt: one encoder, L = MLM + lambda*GR(h_s); sc: separate context encoders, GR on "
                                  "h_s(enc2) - h_c(enc1), only enc2 saved", choices=("mt", "sc"), group="method")
    lam: float = option(2.0, help="weight of the gloss loss", flag="--lambda", group="method")
    tau: float = option(0.05, help="InfoNCE temperature", group="method")
    mlm_prob: float = option(0.0, help="also mask this fraction of the other tokens, BERT-style 80/10/10; 0: the "
                                       "target only", group="method")
    hard_negatives: bool = option(True, help="do not add another gloss of the same word as a negative",
                                  flag="--no-hard-negatives", group="method")
    max_length: int = option(128, shared="max_length", note=MODEL_POSITIONS, group="method")
    max_gloss_length: int = option(64, help="gloss tokens", group="method")
    # optimisation
    lr: float = option(2e-5, shared="lr", group="optimisation")
    weight_decay: float = option(0.01, shared="weight_decay", group="optimisation")
    warmup: float = option(0.1, shared="warmup", group="optimisation")
    batch_size: int = option(48, shared="batch_size", note="triplets per step (paper: 48)", group="optimisation")
    epochs: int = option(10, shared="epochs", group="optimisation", resume_safe=True)
    steps: int | None = option(None, shared="steps", group="optimisation", resume_safe=True)
    max_grad_norm: float = option(1.0, shared="max_grad_norm", group="optimisation")
    # hardware and bookkeeping
    eval_batch_size: int = option(64, shared="eval_batch_size", group="hardware", resume_safe=True)
    output: str = redeclare(RunOptions, "output", default="", note="the trained MLM's folder", required=True)
    save_every: int = redeclare(RunOptions, "save_every", note="0: at epoch ends and on interrupt only")
    log_every: int = redeclare(RunOptions, "log_every", default=1)

    def validate(self) -> None:
        check_types(self)  # a value of the wrong type is named before any comparison trips over it
        if not self.model:
            raise UserError("--model is required: the masked LM to start from")
        if not self.output:
            raise UserError("--output is required: the folder to write the trained model to")
        if self.arch not in ("mt", "sc"):
            raise UserError(f"--arch must be mt or sc, got {self.arch!r}")
        for name in ("batch_size", "epochs", "max_length", "max_gloss_length", "eval_batch_size", "keep_checkpoints",
                     "log_every"):
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
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be >= 1, got {self.threads}")
        check_finite_numbers(self)
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

