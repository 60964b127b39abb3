"""`mirrorbert pretrain-mlm`: option parsing for MLM pre-training; the work is in `pretrain.py`."""

from __future__ import annotations

from mirrorbert import jsonio
import dataclasses
import sys

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
    g.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                   help="UTF-8 text file(s): one sentence per line, blank lines separate documents")
    g.add_argument("--output", required=True, help="folder to write the model to (must not exist unless --overwrite)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing --output folder")
    g.add_argument("--model", help="continue pre-training this MLM (local folder or hub id)")
    g.add_argument("--architecture",
                   help="from scratch: bert-tiny (L2/H128) | bert-mini (L4/H256) | bert-small (L4/H512) | "
                        "bert-medium (L8/H512), or a config JSON file")
    g.add_argument("--tokenizer", help="tokenizer folder (required with --architecture; default with --model: the model's)")
    d = p.add_argument_group("data and objective")
    d.add_argument("--seq-length", type=int, default=128, help="tokens per packed sequence, specials included (default 128)")
    d.add_argument("--mlm-probability", type=float, default=0.15, help="fraction of tokens to predict (default 0.15)")
    d.add_argument("--whole-word-mask", action="store_true", help="select whole words instead of sub-word tokens")
    d.add_argument("--eval-fraction", type=float, default=0.01,
                   help="fraction of documents held out for evaluation (default 0.01)")
    d.add_argument("--cache-dir", help="where the tokenised corpus is kept (default: ~/.cache/mirrorbert/mlm-corpus)")
    o = p.add_argument_group("optimisation")
    o.add_argument("--lr", type=float, help="peak AdamW learning rate (default 5e-4 from scratch, 5e-5 continued)")
    o.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    o.add_argument("--warmup-steps", type=int, help="linear warmup steps (default 6%% of the steps), then linear decay to 0")
    o.add_argument("--max-grad-norm", type=float, default=1.0, help="clip gradients to this norm (default 1.0)")
    o.add_argument("--batch-size", type=int, default=128, help="sequences per forward pass (default 128)")
    o.add_argument("--grad-accum", type=int, default=1, help="forward passes per optimiser step (default 1)")
    o.add_argument("--max-tokens", type=int, help="budget: stop after this many training tokens")
    o.add_argument("--epochs", type=float, help="budget: passes over the corpus (default 1 when no budget is given)")
    o.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    h = p.add_argument_group("hardware and bookkeeping")
    h.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:1 | mps")
    h.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice, usually all cores)")
    h.add_argument("--precision", default="fp32", help="fp32 (default) | auto (bf16 where native, else fp32; fp16 on older GPUs) | bf16 (autocast, CPU or GPU) | fp16 (GPU only)")
    h.add_argument("--eval-every", type=int, default=500, help="held-out evaluation every N steps (default 500)")
    h.add_argument("--eval-sequences", type=int, default=256, help="held-out sequences per evaluation (default 256)")
    h.add_argument("--save-every", type=int, default=0, help="write a checkpoint every N steps (0: only on interrupt)")
    h.add_argument("--checkpoint-dir", help="where checkpoints go (default: <output>.checkpoints)")
    h.add_argument("--keep-checkpoints", type=int, default=2, help="how many checkpoints to keep (default 2)")
    h.add_argument("--resume", help="continue from a checkpoint folder (step-N) or a checkpoint root")
    h.add_argument("--stop-after-steps", type=int,
                   help="run only N more steps of the budget now, checkpoint and exit (resume later)")
    h.add_argument("--log-dir", help="write TensorBoard scalars here")
    h.add_argument("--log-every", type=int, default=50, help="record training loss/accuracy every N steps (default 50)")
    h.add_argument("--no-progress", dest="show_progress", action="store_false", help="no progress bar")
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
        "train_loss": result.train_loss, "train_accuracy": result.train_accuracy,
        "eval_loss": result.eval_loss, "eval_accuracy": result.eval_accuracy,
        "tokens_per_s": round(result.tokens_per_s, 1), "wall_time_s": round(result.wall_time_s, 1),
    }
    print(jsonio.dumps(summary, indent=2))
    return 0
