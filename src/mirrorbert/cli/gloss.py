"""CLI subcommands ``gloss-pretrain`` (GR-BERT) and ``lexsub`` (lexical substitution evaluation).

Register with ``add_gloss_parser(subparsers)`` and ``add_lexsub_parser(subparsers)``; each sets
``func`` to its ``run_*`` function, which returns an exit code and lets ``UserError`` propagate
to the CLI's one-line error handler.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.cli import options
from mirrorbert.cli.field_options import add_config_options
from mirrorbert.cli.options import config_defaults, use
from mirrorbert.errors import UserError
from mirrorbert.gloss.config import MODEL_POSITIONS, GlossPretrainConfig
from mirrorbert.settings.choices import POOLINGS


# --------------------------------------------------------------------------- gloss-pretrain
# The --help groups of `gloss-pretrain`, in order, by the `group` key of GlossPretrainConfig's fields.
GLOSS_GROUPS = {"output": "model, data and output", "data": "model, data and output", "method": "method",
                "optimisation": "optimisation", "hardware": "hardware and bookkeeping"}


def add_gloss_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`gloss-pretrain`: one flag per GlossPretrainConfig field (gloss/config.py, no torch import)."""
    p = subparsers.add_parser(
        "gloss-pretrain",
        help="GR-BERT: MLM pre-training regularised by matching words in context to their glosses",
        description="Continue MLM training of a BERT/RoBERTa-family model on (word, sentence, gloss) triplets, "
        "adding an InfoNCE loss that aligns the word's contextual representation with the embedding of its "
        "gloss (GR-BERT). The result is a Hugging Face *ForMaskedLM folder usable anywhere an MLM is.",
    )
    add_config_options(p, GlossPretrainConfig, GLOSS_GROUPS)
    p.set_defaults(func=run_gloss_pretrain)
    return p


def run_gloss_pretrain(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from mirrorbert.gloss.pretrain import pretrain

    names = {f.name for f in fields(GlossPretrainConfig)}
    cfg = GlossPretrainConfig(**{k: v for k, v in vars(args).items() if k in names and v is not None})
    result = pretrain(cfg)
    if result.interrupted:
        from mirrorbert.training.engine import stop_message

        print(stop_message(result.stop_signal, result.steps, result.checkpoint), file=sys.stderr)
        return 130
    print(jsonio.dumps(result.summary(), indent=2))
    return 0


# --------------------------------------------------------------------------- lexsub
def add_lexsub_parser(subparsers: Any) -> argparse.ArgumentParser:
    from mirrorbert.evaluation import lexsub as ls

    p = subparsers.add_parser(
        "lexsub",
        help="lexical substitution (SemEval-2007 LS07, CoInCo LS14) with a masked LM",
        description="Generate substitutes from p(x|s) at the target position of the full sentence, filter them "
        "with WordNet (same lemma, wrong POS, duplicates) and score with the official SemEval-2007 metrics "
        "(best, best-mode, oot, oot-mode; precision and recall) and P@1, P@3. Scores are percentages.",
    )
    options.add(p, use("model", required=True, note="a masked LM, e.g. a gloss-pretrain output"))
    p.add_argument("--dataset", default="LS07", help="LS07, LS14 (alias CoInCo), or a comma-separated list (default LS07)")
    options.add(p, use("data_dir", note="holding lexsub/ and wordnet/"))
    p.add_argument("--post", action="append", default=None,
                   help="post-processing, repeatable or comma-separated: emb (mix in input-embedding similarity), "
                        "valid (re-rank the top candidates by sentence similarity after substitution); default none")
    p.add_argument("--emb-weight", type=float, default=ls.DEFAULT_EMB_WEIGHT,
                   help=f"weight of the embedding-similarity log-probability (default {ls.DEFAULT_EMB_WEIGHT})")
    p.add_argument("--emb-temperature", type=float, default=ls.DEFAULT_EMB_TEMPERATURE,
                   help="temperature of the embedding-similarity softmax (default 1/15)")
    p.add_argument("--valid-weight", type=float, default=ls.DEFAULT_VALID_WEIGHT,
                   help=f"weight of the proposal score added to the validation score (default {ls.DEFAULT_VALID_WEIGHT})")
    p.add_argument("--valid-top", type=int, default=ls.DEFAULT_VALID_TOP,
                   help=f"how many top candidates 'valid' re-ranks (default {ls.DEFAULT_VALID_TOP})")
    options.add(p, use("batch_size", default=32, note="sentences per forward pass"),
                use("max_length", default=256, note=MODEL_POSITIONS), "device", use("limit", note="the first N items (smoke tests)"),
                use("output", note="a folder for system files in the official format (<set>.best, <set>.oot) and scores"),
                "overwrite")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    options.add(p, "no_progress")
    p.set_defaults(func=run_lexsub)
    return p


def _parse_post(values: list[str] | None) -> tuple[str, ...]:
    out: list[str] = []
    for v in values or []:
        for part in v.replace("+", ",").split(","):
            part = part.strip().lower()
            if not part or part == "none":
                continue
            if part not in ("emb", "valid"):
                raise UserError(f"--post: unknown post-processing {part!r}; choose from emb, valid, none")
            if part not in out:
                out.append(part)
    return tuple(out)


def _write_plan(args: argparse.Namespace):
    """The write policy for a command's --output, given its inputs (model, data directory)."""
    from mirrorbert.safeguards.writes import WritePlan

    return WritePlan({"--model": args.model, "--data-dir": args.data_dir}, overwrite=args.overwrite)


def run_lexsub(args: argparse.Namespace) -> int:
    from mirrorbert.evaluation.lexsub import GenerationConfig, evaluate_lexsub, resolve_dataset
    from mirrorbert.safeguards.writes import atomic_output_dir

    if args.limit is not None and args.limit <= 0:
        raise UserError(f"--limit must be positive, got {args.limit}")
    if args.emb_temperature <= 0:
        raise UserError(f"--emb-temperature must be > 0, got {args.emb_temperature}")
    cfg = GenerationConfig(
        post=_parse_post(args.post), emb_weight=args.emb_weight, emb_temperature=args.emb_temperature,
        valid_weight=args.valid_weight, valid_top=args.valid_top, batch_size=args.batch_size,
        max_length=args.max_length,
    )
    cfg.validate()
    from mirrorbert.runtime.device import check_device_and_precision

    check_device_and_precision(args.device)
    names = [resolve_dataset(n.strip()) for n in args.dataset.split(",") if n.strip()]
    results = {}
    with _write_plan(args).folder("--output", args.output).locked(), contextlib.ExitStack() as stack:
        out = None if not args.output else stack.enter_context(
            atomic_output_dir(args.output, args.overwrite, kind="lexsub"))
        for name in names:
            scores = evaluate_lexsub(args.model, name, data_dir=args.data_dir, device=args.device, config=cfg,
                                     limit=args.limit, output_dir=out, show_progress=args.show_progress,
                                     trust_remote_code=getattr(args, "trust_remote_code", False))
            results[name] = scores.as_dict()
    if args.json:
        print(jsonio.dumps(results, indent=2))
        return 0
    cols = ("best", "best-m", "oot", "oot-m")
    print(f"model: {args.model}   post: {'+'.join(cfg.post) or 'none'}   (scores in %; P / R)")
    print(f"{'set':6} " + " ".join(f"{c:>13}" for c in cols) + f" {'P@1':>7} {'P@3':>7}  items")
    for name, r in results.items():
        pr = [(r["best_p"], r["best_r"]), (r["best_mode_p"], r["best_mode_r"]), (r["oot_p"], r["oot_r"]),
              (r["oot_mode_p"], r["oot_mode_r"])]
        print(f"{name:6} " + " ".join(f"{p:6.2f}/{q:6.2f}" for p, q in pr)
              + f" {r['p_at_1']:7.2f} {r['p_at_3']:7.2f}  {r['n_attempted']}/{r['n_items']}")
    return 0


# --------------------------------------------------------------------------- finetune-sts
def add_finetune_sts_parser(subparsers: Any) -> argparse.ArgumentParser:
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig

    d = config_defaults(FinetuneStsConfig)
    p = subparsers.add_parser(
        "finetune-sts",
        help="supervised STS-B fine-tuning (Siamese cosine regression), mean and std over seeds",
        description="Fine-tune a model as a Siamese encoder on STS-B train (all or seeded subsets) with a "
        "cosine-similarity regression loss, then report the STS-B test Spearman (x100), mean and sample standard "
        "deviation over seeds.",
    )
    options.add(p, use("model", required=True, note="an MLM, a gloss-pretrain or train output"),
                use("data_dir", note="holding sts/STSBenchmark"),
                use("pooling", choices=POOLINGS, note="mean where the model saved none"), defaults=d)
    p.add_argument("--fractions", default="1,0.5,0.2", help="training fractions (default 1,0.5,0.2)")
    options.add(p, use("seeds", default="0,1,2,3"), "epochs",
                use("batch_size", note="sentence pairs per step"), "lr", "warmup",
                use("max_length", note=MODEL_POSITIONS), "device", "precision",
                use("output", note="the results as a JSON file"), "overwrite", "no_progress", defaults=d)
    p.set_defaults(func=run_finetune_sts)
    return p


def format_finetune_summary(summary: dict, n_seeds: int, model: str) -> str:
    """Labelled lines; a spread only where there is one (one seed has no standard deviation)."""
    lines = [f"STS-B test split, Spearman x100, model {model}, "
             + (f"mean +- std over {n_seeds} seeds" if n_seeds > 1 else "one seed (no spread: --seeds 0,1,2 for one)")]
    for frac, r in summary.items():
        spread = f" +- {r['std']:.2f}" if n_seeds > 1 and r.get("std") is not None else ""
        lines.append(f"  trained on {float(frac) * 100:5.1f}% of STS-B train ({r['train_pairs']} pairs): "
                     f"{r['mean']:.2f}{spread}")
    return "\n".join(lines)


def run_finetune_sts(args: argparse.Namespace) -> int:
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig, finetune_sts, parse_floats, parse_ints
    from mirrorbert.safeguards.writes import write_text_atomic

    cfg = FinetuneStsConfig(
        model=args.model, data_dir=args.data_dir, pooling=args.pooling,
        fractions=parse_floats(args.fractions, "--fractions"), seeds=parse_ints(args.seeds, "--seeds"),
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup, max_length=args.max_length,
        device=args.device, precision=args.precision, show_progress=args.show_progress,
        trust_remote_code=getattr(args, "trust_remote_code", False),
    )
    cfg.validate()
    with _write_plan(args).file("--output", args.output).locked():
        result = finetune_sts(cfg)
        summary = result.summary()
        if args.output:
            write_text_atomic(args.output, jsonio.dumps({"model": args.model, "results": summary,
                                                       "runs": [r.__dict__ for r in result.runs]}, indent=2) + "\n",
                              overwrite=args.overwrite)
    print(format_finetune_summary(summary, len(cfg.seeds), args.model))
    return 0
