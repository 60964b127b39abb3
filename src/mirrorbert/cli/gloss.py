"""`mirrorbert gloss-pretrain` (GR-BERT), `lexsub` (lexical substitution) and `finetune-sts` (supervised STS-B)."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.cli.train import stopped
from mirrorbert.errors import UserError
from mirrorbert.evaluation.lexsub import GenerationConfig
from mirrorbert.gloss.config import GlossPretrainConfig
from mirrorbert.gloss.finetune_sts import FinetuneStsConfig
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options


GLOSS_GROUPS = {"output": "model, data and output", "data": "model, data and output", "method": "method",
                "optimisation": "optimisation", "hardware": "hardware and bookkeeping"}


def add_gloss_parser(subparsers: Any) -> argparse.ArgumentParser:
    return command(subparsers, "gloss-pretrain", run_gloss_pretrain, GlossPretrainConfig, titles=GLOSS_GROUPS,
                   summary="GR-BERT: MLM pre-training regularised by matching words in context to their glosses",
                   description="Continue MLM training of a BERT/RoBERTa-family model on (word, sentence, gloss) "
                               "triplets, adding an InfoNCE loss that aligns the word's contextual representation "
                               "with the embedding of its gloss (GR-BERT). The result is a Hugging Face *ForMaskedLM "
                               "folder usable anywhere an MLM is.")


def run_gloss_pretrain(args: argparse.Namespace) -> int:
    cfg = options_from_args(GlossPretrainConfig, args)  # every option checked, the required ones named
    from mirrorbert.gloss.pretrain import pretrain

    result = pretrain(cfg)
    if result.interrupted:
        return stopped(result)
    print(jsonio.dumps(result.summary(), indent=2))
    return 0


@dataclass(kw_only=True)
class LexsubOptions(Options):
    """`mirrorbert lexsub`'s options besides how substitutes are generated (`GenerationConfig`)."""

    model: str | None = option(None, shared="model", note="a masked LM, e.g. a gloss-pretrain output", required=True)
    dataset: list[str] = option(help="LS07, LS14 (alias CoInCo), or a comma-separated list",
                                default_factory=lambda: ["LS07"])
    data_dir: str | None = option(None, shared="data_dir", note="holding lexsub/ and wordnet/")
    device: str = option("auto", shared="device")
    limit: int | None = option(None, shared="limit", note="the first N items (smoke tests)")
    output: str | None = option(None, shared="output", note="a folder for system files in the official format "
                                                            "(<set>.best, <set>.oot) and scores")
    overwrite: bool = option(False, shared="overwrite")
    json: bool = option(False, help="print the scores as JSON")
    show_progress: bool = option(True, shared="no_progress", flag="--no-progress")
    trust_remote_code: bool = option(False, shared="trust_remote_code")


def add_lexsub_parser(subparsers: Any) -> argparse.ArgumentParser:
    return command(subparsers, "lexsub", run_lexsub, LexsubOptions, GenerationConfig,
                   summary="lexical substitution (SemEval-2007 LS07, CoInCo LS14) with a masked LM",
                   description="Generate substitutes from p(x|s) at the target position of the full sentence, filter "
                               "them with WordNet (same lemma, wrong POS, duplicates) and score with the official "
                               "SemEval-2007 metrics (best, best-mode, oot, oot-mode; precision and recall) and P@1, "
                               "P@3. Scores are percentages.")


def _parse_post(values: list[str] | None) -> tuple[str, ...]:
    """--post's steps, each once in the order given (`emb+valid` or `emb,valid`; `none` for none)."""
    parts = [part.strip().lower() for value in values or [] for part in value.replace("+", ",").split(",")]
    unknown = [part for part in parts if part not in ("", "none", "emb", "valid")]
    if unknown:
        raise UserError(f"--post: unknown post-processing {unknown[0]!r}; choose from emb, valid, none")
    return tuple(dict.fromkeys(part for part in parts if part in ("emb", "valid")))


def run_lexsub(args: argparse.Namespace) -> int:
    from mirrorbert.evaluation.lexsub import evaluate_lexsub, resolve_dataset
    from mirrorbert.safeguards.writes import WritePlan, atomic_output_dir

    opts = options_from_args(LexsubOptions, args)
    cfg = options_from_args(GenerationConfig, args, post=_parse_post(args.post))
    from mirrorbert.runtime.device import check_device_and_precision

    check_device_and_precision(opts.device)
    names = [resolve_dataset(n) for n in opts.dataset]
    results = {}
    plan = WritePlan({"--model": opts.model, "--data-dir": opts.data_dir}, overwrite=opts.overwrite)
    plan.folder("--output", opts.output)
    with plan.locked(), contextlib.ExitStack() as stack:
        out = None if not opts.output else stack.enter_context(
            atomic_output_dir(opts.output, opts.overwrite, kind="lexsub"))
        for name in names:
            scores = evaluate_lexsub(opts.model, name, data_dir=opts.data_dir, device=opts.device, config=cfg,
                                     limit=opts.limit, output_dir=out, show_progress=opts.show_progress,
                                     trust_remote_code=opts.trust_remote_code)
            results[name] = scores.as_dict()
    if opts.json:
        print(jsonio.dumps(results, indent=2))
        return 0
    cols = ("best", "best-m", "oot", "oot-m")
    print(f"model: {opts.model}   post: {'+'.join(cfg.post) or 'none'}   (scores in %; P / R)")
    print(f"{'set':6} " + " ".join(f"{c:>13}" for c in cols) + f" {'P@1':>7} {'P@3':>7}  items")
    for name, r in results.items():
        pr = [(r["best_p"], r["best_r"]), (r["best_mode_p"], r["best_mode_r"]), (r["oot_p"], r["oot_r"]),
              (r["oot_mode_p"], r["oot_mode_r"])]
        print(f"{name:6} " + " ".join(f"{p:6.2f}/{q:6.2f}" for p, q in pr)
              + f" {r['p_at_1']:7.2f} {r['p_at_3']:7.2f}  {r['n_attempted']}/{r['n_items']}")
    return 0


@dataclass(kw_only=True)
class FinetuneStsOutput(Options):
    """Where `finetune-sts` writes its results, besides printing them (`FinetuneStsConfig` is the run)."""

    output: str | None = option(None, shared="output", note="the results as a JSON file")
    overwrite: bool = option(False, shared="overwrite")


def add_finetune_sts_parser(subparsers: Any) -> argparse.ArgumentParser:
    return command(subparsers, "finetune-sts", run_finetune_sts, FinetuneStsConfig, FinetuneStsOutput,
                   summary="supervised STS-B fine-tuning (Siamese cosine regression), mean and std over seeds",
                   description="Fine-tune a model as a Siamese encoder on STS-B train (all or seeded subsets) with a "
                               "cosine-similarity regression loss, then report the STS-B test Spearman (x100), mean "
                               "and sample standard deviation over seeds.")


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
    from mirrorbert.gloss.finetune_sts import finetune_sts
    from mirrorbert.safeguards.writes import WritePlan, write_text_atomic

    cfg = options_from_args(FinetuneStsConfig, args)
    out = options_from_args(FinetuneStsOutput, args)
    plan = WritePlan({"--model": cfg.model, "--data-dir": cfg.data_dir}, overwrite=out.overwrite)
    with plan.file("--output", out.output).locked():
        result = finetune_sts(cfg)
        summary = result.summary()
        print(format_finetune_summary(summary, len(cfg.seeds), cfg.model))
        if out.output:
            record = jsonio.dumps({"model": cfg.model, "results": summary, "runs": [r.__dict__ for r in result.runs]},
                                  indent=2) + "\n"
            try:
                write_text_atomic(out.output, record, overwrite=out.overwrite)
            except UserError as exc:  # the runs are done: their results are not lost with the file
                print(record, end="")
                raise UserError(f"{exc}; the results it would hold are printed above (stdout)") from None
    return 0
