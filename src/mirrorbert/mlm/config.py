"""Options of MLM pre-training (`mirrorbert pretrain-mlm`): one typed dataclass, checked from its fields' facts
when made (settings/validation.py); no torch import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import option, redeclare
from mirrorbert.settings.option_help import COUNT
from mirrorbert.settings.run_options import RunOptions

# Data-order settings: a checkpoint can only be resumed when all of these are unchanged.
RESUME_KEYS = ("seq_length", "batch_size", "grad_accum", "seed", "mlm_probability", "whole_word_mask", "eval_fraction")


@dataclass(kw_only=True)
class PretrainConfig(RunOptions):
    """Every option of an MLM pre-training run (the bookkeeping ones from `RunOptions`); `resume_safe` options may
    change on --resume (the corpus is checked by its key)."""

    corpus: list[str] = option(shared="corpus", note="UTF-8 text file(s): one sentence per line, blank lines "
                                                     "separate documents", default_factory=list, group="output",
                               required=True, nargs="+", metavar="FILE", resume_safe=True)
    model: str | None = option(None, shared="model", note="continue pre-training this MLM", group="output",
                               resume_safe=True)
    architecture: str | None = option(None, shared="architecture", note="pre-train from scratch (with --tokenizer)",
                                      group="output")
    tokenizer: str | None = option(None, help="tokenizer folder (required with --architecture; default with --model: "
                                              "the model's)", group="output", resume_safe=True)
    seq_length: int = option(128, help="tokens per packed sequence, specials included", range="[8, inf)",
                             group="data")
    mlm_probability: float = option(0.15, help="fraction of tokens to predict", range="(0, 1)", group="data")
    whole_word_mask: bool = option(False, help="select whole words instead of sub-word tokens", group="data")
    eval_fraction: float = option(0.01, help="fraction of documents held out for evaluation", range="[0, 1)",
                                  group="data")
    cache_dir: str | None = option(None, help="where the tokenised corpus is kept",
                                   unset="~/.cache/mirrorbert/mlm-corpus", group="data", resume_safe=True)
    lr: float | None = option(None, shared="lr", note="the peak", unset="5e-4 from scratch, 5e-5 continued",
                              group="optimisation")
    weight_decay: float = option(0.01, shared="weight_decay", group="optimisation")
    warmup_steps: int | None = option(None, shared="warmup_steps", note="then linear decay to 0",
                                      unset="6% of the steps, at most 10,000", group="optimisation")
    max_grad_norm: float | None = option(1.0, shared="max_grad_norm", group="optimisation")
    batch_size: int = option(128, shared="batch_size", note="sequences per forward pass", group="optimisation")
    grad_accum: int = option(1, help="forward passes per optimiser step", range=COUNT, group="optimisation")
    max_tokens: int | None = option(None, help="budget: stop after this many training tokens", range=COUNT,
                                    group="optimisation", excludes=("epochs",), resume_safe=True)
    epochs: float | None = option(None, shared="epochs", note="a budget, fractions allowed",
                                  unset="1 when no budget is given", range="(0, inf)", group="optimisation",
                                  resume_safe=True)
    eval_every: int = option(500, help="held-out evaluation every N steps", range=COUNT, group="hardware",
                             resume_safe=True)
    eval_sequences: int = option(256, help="held-out sequences per evaluation", range=COUNT, group="hardware",
                                 resume_safe=True)
    stop_after_steps: int | None = option(None, help="run only N more steps of the budget now, checkpoint and exit "
                                                     "(resume later)", range=COUNT, group="hardware", resume_safe=True)
    prefetch_batches: int = option(4, help="batches made ahead of the step in a background thread; 0: in the step's "
                                           "own thread", range="[0, inf)", group="hardware", resume_safe=True)
    output: str | None = redeclare(RunOptions, "output", note="the model's folder")
    precision: str = redeclare(RunOptions, "precision", default="fp32")
    save_every: int = redeclare(RunOptions, "save_every", note="0: only on interrupt")
    log_every: int = redeclare(RunOptions, "log_every", default=50)

    def rules(self) -> None:
        if self.model is not None and self.architecture is not None:
            raise UserError(self._one_start())
        if self.architecture is not None and self.tokenizer is None:
            raise UserError(f"pre-training from scratch ({self.say('architecture')}) needs {self.say('tokenizer')}")

    def validate(self) -> None:
        super().validate()
        if self.model is None and self.architecture is None:
            raise UserError(self._one_start())

    def _one_start(self) -> str:
        return (f"give exactly one of {self.say('model')} (continue pre-training an MLM) or "
                f"{self.say('architecture')} (from scratch)")

    def resolved_cache_dir(self) -> Path:
        from mirrorbert.data.token_cache import cache_root

        return Path(self.cache_dir) if self.cache_dir else cache_root() / "mlm-corpus"
