"""`mirrorbert pretrain-mlm`: MLM pre-training from the command line (the work is in `mlm/pretrain.py`)."""

from __future__ import annotations

import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.cli.train import stopped
from mirrorbert.mlm.config import PretrainConfig

GROUPS = {"output": "model and output", "data": "data and objective", "optimisation": "optimisation",
          "hardware": "hardware and bookkeeping"}


def add_pretrain_parser(sub) -> None:
    command(sub, "pretrain-mlm", run_pretrain, PretrainConfig, titles=GROUPS,
            summary="masked-LM pre-training, from scratch or continued from an MLM",
            description="Masked-language-model pre-training (15% of tokens; 80% [MASK] / 10% random / 10% kept) on a "
                        "text corpus, one sentence per line, blank lines between documents. From scratch with "
                        "--architecture and --tokenizer, or continued (domain-adaptive) from --model. Writes a Hugging "
                        "Face *ForMaskedLM folder with its tokenizer.")


def run_pretrain(args) -> int:
    cfg = options_from_args(PretrainConfig, args)  # every option checked, the required ones named: nothing read yet
    from mirrorbert.mlm.pretrain import pretrain

    result = pretrain(cfg)
    if result.output is None and result.interrupted:
        return stopped(result)
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
