"""Options of GR-BERT pre-training (`mirrorbert gloss-pretrain`): one typed dataclass, checked from its fields'
facts when made (settings/validation.py); no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from mirrorbert.settings.fields import option, redeclare
from mirrorbert.settings.option_help import COUNT, MODEL_POSITIONS
from mirrorbert.settings.run_options import RunOptions


@dataclass(kw_only=True)
class GlossPretrainConfig(RunOptions):
    """Options of ``mirrorbert gloss-pretrain`` (the bookkeeping ones from `RunOptions`); `resume_safe` options may
    change on --resume (the triplets are checked by fingerprint)."""

    model: str | None = option(None, shared="model", note="the masked LM to start from", group="output",
                               required=True, resume_safe=True)
    triplets: str = option("wordnet", help="'wordnet' (build from <data-dir>/wordnet) or a TSV file 'word TAB "
                                           "sentence TAB gloss'", group="data", resume_safe=True)
    data_dir: str | None = option(None, shared="data_dir", note="holding wordnet/", group="data", resume_safe=True)
    holdout: float = option(0.05, help="held-out fraction of triplets", range="[0, 1)", group="data")
    limit: int | None = option(None, shared="limit", note="a random sample of the triplets (seeded; for quick runs)",
                               range="[2, inf)", group="data", resume_safe=True)
    export_triplets: str | None = option(None, help="also write the (training) triplets to this TSV file",
                                         group="data", resume_safe=True)
    arch: str = option("mt", help="mt: one encoder, L = MLM + lambda*GR(h_s); sc: separate context encoders, GR on "
                                  "h_s(enc2) - h_c(enc1), only enc2 saved", choices=("mt", "sc"), group="method")
    lam: float = option(2.0, help="weight of the gloss loss", flag="--lambda", range="[0, inf)", group="method")
    tau: float = option(0.05, help="InfoNCE temperature", range="(0, inf)", group="method")
    mlm_prob: float = option(0.0, help="also mask this fraction of the other tokens, BERT-style 80/10/10; 0: the "
                                       "target only", range="[0, 1)", group="method")
    hard_negatives: bool = option(True, help="do not add another gloss of the same word as a negative",
                                  flag="--no-hard-negatives", group="method")
    max_length: int = option(128, shared="max_length", note=MODEL_POSITIONS, group="method")
    max_gloss_length: int = option(64, help="gloss tokens", range=COUNT, group="method")
    lr: float = option(2e-5, shared="lr", group="optimisation")
    weight_decay: float = option(0.01, shared="weight_decay", group="optimisation")
    warmup: float = option(0.1, shared="warmup", group="optimisation")
    batch_size: int = option(48, shared="batch_size", note="triplets per step (paper: 48)", range="[2, inf)",
                             why="the other triplets' glosses are the negatives", group="optimisation")
    epochs: int = option(10, shared="epochs", group="optimisation", resume_safe=True)
    steps: int | None = option(None, shared="steps", group="optimisation", resume_safe=True)
    max_grad_norm: float = option(1.0, shared="max_grad_norm", group="optimisation")
    eval_batch_size: int = option(64, shared="eval_batch_size", group="hardware", resume_safe=True)
    output: str | None = redeclare(RunOptions, "output", note="the trained MLM's folder")
    save_every: int = redeclare(RunOptions, "save_every", note="0: at epoch ends and on interrupt only")
    log_every: int = redeclare(RunOptions, "log_every", default=1)
