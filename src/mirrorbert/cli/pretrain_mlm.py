"""`mirrorbert pretrain-mlm`: option parsing for MLM pre-training; the work is in `mlm/pretrain.py`.

Every option is a `PretrainConfig` field (mlm/config.py, no torch import), its flag and default made from the
field (cli/field_options.py), so --help and a refused option never wait for torch."""

from __future__ import annotations

import dataclasses
import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.field_options import add_config_options
from mirrorbert.mlm.config import PretrainConfig

EXIT_INTERRUPTED = 130
# The --help groups of `pretrain-mlm`, in order, by the `group` key of the fields.
GROUPS = {"output": "model and output", "data": "data and objective", "optimisation": "optimisation",
          "hardware": "hardware and bookkeeping"}


def add_pretrain_parser(sub) -> None:
    p = sub.add_parser(
        "pretrain-mlm",
        help="masked-LM pre-training, from scratch or continued from an MLM",
        description="Masked-language-model pre-training (15% of tokens; 80% [MASK] / 10% random / 10% kept) on a "
                    "text corpus, one sentence per line, blank lines between documents. From scratch with "
                    "--architecture and --tokenizer, or continued (domain-adaptive) from --model. Writes a Hugging "
                    "Face *ForMaskedLM folder with its tokenizer.",
    )
    add_config_options(p, PretrainConfig, GROUPS)
    p.set_defaults(func=run_pretrain)


def run_pretrain(args) -> int:
    from mirrorbert.mlm.pretrain import pretrain

    fields = {f.name for f in dataclasses.fields(PretrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    cfg = PretrainConfig(**values)
    result = pretrain(cfg)
    if result.output is None and result.interrupted:
        from mirrorbert.training.engine import stop_message

        print(stop_message(result.stop_signal, result.steps, result.checkpoint), file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.output is None:
        print(f"stopped (--stop-after-steps) at step {result.steps}; checkpoint: {result.checkpoint}\n"
              f"continue with the same command plus --resume {result.checkpoint}", file=sys.stderr)
        return 0
    summary = {
        "output": str(result.output), "steps": result.steps, "tokens": result.tokens,
        "train_loss": result.train_loss, "train_loss_window_steps": result.train_loss_window_steps,
        "train_accuracy": result.train_accuracy,
        "eval_loss": result.eval_loss, "eval_accuracy": result.eval_accuracy,
        "tokens_per_s": round(result.tokens_per_s, 1), "wall_time_s": round(result.wall_time_s, 1),
    }
    print(jsonio.dumps(summary, indent=2))
    return 0
