"""`mirrorbert pretrain-mlm`: option parsing for MLM pre-training; the work is in `pretrain.py`.

The defaults are written out rather than read from `PretrainConfig` (importing it imports torch, which --help
and a refused option must not wait for); tests/cli/test_settings_resolution.py keeps the two equal."""

from __future__ import annotations

import dataclasses
import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli import options
from mirrorbert.cli.options import use

EXIT_INTERRUPTED = 130


def add_pretrain_parser(sub) -> None:
    p = sub.add_parser(
        "pretrain-mlm",
        help="masked-LM pre-training, from scratch or continued from an MLM",
        description="Masked-language-model pre-training (15% of tokens; 80% [MASK] / 10% random / 10% kept) on a "
                    "text corpus, one sentence per line, blank lines between documents. From scratch with "
                    "--architecture and --tokenizer, or continued (domain-adaptive) from --model. Writes a Hugging "
                    "Face *ForMaskedLM folder with its tokenizer.",
    )
    g = p.add_argument_group("model and output")
    options.add(g, use("corpus", required=True, nargs="+", metavar="FILE",
                       note="UTF-8 text file(s): one sentence per line, blank lines separate documents"),
                use("output", required=True, note="the model's folder"), "overwrite",
                use("model", note="continue pre-training this MLM"),
                use("architecture", note="pre-train from scratch (with --tokenizer)"))
    g.add_argument("--tokenizer", help="tokenizer folder (required with --architecture; default with --model: the model's)")
    d = p.add_argument_group("data and objective")
    d.add_argument("--seq-length", type=int, default=128, help="tokens per packed sequence, specials included (default 128)")
    d.add_argument("--mlm-probability", type=float, default=0.15, help="fraction of tokens to predict (default 0.15)")
    d.add_argument("--whole-word-mask", action="store_true", help="select whole words instead of sub-word tokens")
    d.add_argument("--eval-fraction", type=float, default=0.01,
                   help="fraction of documents held out for evaluation (default 0.01)")
    d.add_argument("--cache-dir", help="where the tokenised corpus is kept (default: ~/.cache/mirrorbert/mlm-corpus)")
    o = p.add_argument_group("optimisation")
    options.add(o, use("lr", note="the peak; default 5e-4 from scratch, 5e-5 continued"), "weight_decay",
                use("warmup_steps", note="default 6%% of the steps, then linear decay to 0"), use("max_grad_norm", default=1.0),
                use("batch_size", default=128, note="sequences per forward pass"))
    o.add_argument("--grad-accum", type=int, default=1, help="forward passes per optimiser step (default 1)")
    o.add_argument("--max-tokens", type=int, help="budget: stop after this many training tokens")
    options.add(o, use("epochs", type=float, note="a budget, fractions allowed; default 1 when no budget is given"),
                "seed")
    h = p.add_argument_group("hardware and bookkeeping")
    options.add(h, "device", "threads", "precision")
    h.add_argument("--eval-every", type=int, default=500, help="held-out evaluation every N steps (default 500)")
    h.add_argument("--eval-sequences", type=int, default=256, help="held-out sequences per evaluation (default 256)")
    options.add(h, use("save_every", note="0: only on interrupt"), "checkpoint_dir", "keep_checkpoints", "resume")
    h.add_argument("--stop-after-steps", type=int,
                   help="run only N more steps of the budget now, checkpoint and exit (resume later)")
    options.add(h, "log_dir", use("log_every", default=50), "no_progress")
    p.set_defaults(func=run_pretrain)


def run_pretrain(args) -> int:
    from mirrorbert.mlm.pretrain import PretrainConfig, pretrain

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
