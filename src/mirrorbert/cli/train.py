"""`mirrorbert train`: Mirror-BERT tuning from the command line (the work is in `mirror/train.py`).

Every option's argparse default is None, so that "not given" can be told from "given": a --config file and
a --preset fill what the command line leaves out, and `TrainConfig` the rest (its defaults are the ones
--help states).
"""

from __future__ import annotations

import logging
import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli import options
from mirrorbert.cli.options import UNSET, use
from mirrorbert.cli.push import PUSH_TO_HUB_HELP, check_push_to_hub, push_trained
from mirrorbert.reporting.timing import pending_phase
from mirrorbert.safeguards.writes import WritePlan, check_outputs_avoid

EXIT_INTERRUPTED = 130
# Options whose value comes from --preset when one is given.
PRESET_KEYS = ("temperature", "mask_span", "epochs", "max_length", "pooling")


def add_train_parser(sub) -> None:
    """`train`, its options in the groups --help shows; every default None (see the module docstring)."""
    p = sub.add_parser(
        "train", help="Mirror-BERT tuning of a masked LM into an encoder",
        description="Mirror-BERT: self-supervised contrastive tuning with duplicated views, span masking "
                    "and dropout. Options default to the chosen --preset (the paper's settings).",
    )
    _add_model_and_data(p)
    _add_method(p.add_argument_group("method"))
    _add_optimisation(p.add_argument_group("optimisation"))
    _add_hardware(p.add_argument_group("hardware and bookkeeping"))
    e = p.add_argument_group("evaluation after training (model card)")
    e.add_argument("--eval-after", help="comma-separated eval tasks (e.g. sts,wordsim) run on the trained model before "
                                        "saving; scores go into mirrorbert.json and README.md (default: none)")
    options.add(e, use("data_dir", note="the evaluation sets of --eval-after"), defaults=UNSET)
    p.set_defaults(func=run_train)


def _add_model_and_data(p) -> None:
    """What is trained, on which strings, and where it goes."""
    g = p.add_argument_group("model and output")
    options.add(g, use("model", note="the masked LM to start from"), use("output", note="the trained model's folder"),
                "overwrite", defaults=UNSET)
    g.add_argument("--push-to-hub", metavar="USER/NAME", help=PUSH_TO_HUB_HELP)
    g.add_argument("--preset", help="paper settings: word | phrase | sentence")
    g.add_argument("--config", dest="config_file", help="YAML or JSON file of options; command-line options win")
    d = p.add_argument_group("training strings")
    d.add_argument("--data", help="strings: .txt (one per line), .csv/.tsv/.parquet/.arrow or a saved datasets folder (with --column), .jsonl (with --field)")
    options.add(d, "column", "field", defaults=UNSET)
    d.add_argument("--words-top", type=int, help="train on the N most frequent words of --lang (wordfreq)")
    d.add_argument("--lang", help="language of --words-top (default en)")
    d.add_argument("--random-strings", type=int, help="train on N random letter/digit strings (zero-semantics control)")
    options.add(d, use("limit", note="a random sample of the strings (seeded)"), "skip_bad_lines", defaults=UNSET)


def _add_method(m) -> None:
    """The paper's knobs: views, masking, dropout, loss."""
    m.add_argument("--temperature", type=float, help="InfoNCE temperature tau (default 0.04; word preset 0.2)")
    m.add_argument("--loss", help="infonce (default, paper eq. 1) | ms (multi-similarity loss with online triplet "
                                  "mining, as SapBERT)")
    m.add_argument("--mask-span", type=int, help="mask a span of K units (--mask-unit) in the second view (0: off; default 0, presets: phrase 2, sentence 5)")
    m.add_argument("--mask-unit", help="char (default, the authors' code: K characters become one mask token) | "
                                       "token (our variant: K tokens become K mask tokens)")
    m.add_argument("--mask-min-chars", type=int, help="char unit: strings of N characters or fewer stay unmasked (default 30)")
    m.add_argument("--dropout", type=float, help="dropout probability (hidden, attention, embeddings)")
    m.add_argument("--drophead", type=float, help="probability of dropping a whole attention head per example")
    m.add_argument("--controlled-dropout", action="store_true", default=None, help="identical dropout masks for both views (ablation)")
    options.add(m, "pooling", "max_length", defaults=UNSET)


def _add_optimisation(o) -> None:
    """AdamW, schedule and budget."""
    options.add(o, "lr", "weight_decay", defaults=UNSET)
    o.add_argument("--schedule", help="constant (paper) | linear (decay to 0 after warmup)")
    options.add(o, "warmup_steps", "max_grad_norm", use("batch_size", note="strings per step, 2 views each"),
                "epochs", "steps", "seed", defaults=UNSET)


def _add_hardware(h) -> None:
    """Where and how fast it runs, and what it leaves behind (checkpoints, logs)."""
    # no `choices` for --packing: a value from a --config file is checked by TrainConfig, so is the command line's
    options.add(h, "device", "precision", use("packing", choices=None), "threads", defaults=UNSET)
    h.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the model (default: off; falls back to eager with a warning if it fails)")
    h.add_argument("--gradient-checkpointing", action="store_true", default=None,
                   help="recompute activations in backward: less memory, ~30%% more time (default: off)")
    h.add_argument("--grad-cache-chunk", type=int,
                   help="GradCache: run the encoder N views at a time with cached embedding gradients, so "
                        "big batches fit in small memory with every in-batch negative kept (default 0: off)")
    options.add(h, use("save_every", note="0: only at the end or on interrupt"), "checkpoint_dir", "keep_checkpoints",
                "resume", "log_dir", "log_every", "no_progress", defaults=UNSET)


def train_defaults() -> dict:
    """TrainConfig's defaults: the ones `train --help` states (argparse's are all None)."""
    from mirrorbert.mirror.config import default_values

    return default_values()


def _train_keys() -> tuple[str, ...]:
    """Every TrainConfig field is a `train` option of the same name, so the CLI never lists them twice."""
    from mirrorbert.mirror.config import FIELD_NAMES

    return tuple(sorted(FIELD_NAMES))


def train_headline(cfg, n_strings: int) -> str:
    """One line a person reads before training starts (the whole configuration: -v and mirrorbert.json)."""
    mask = f"span {cfg.mask_span} {cfg.mask_unit}s" if cfg.mask_span else "no span masking"
    budget = f"{cfg.steps} steps" if cfg.steps else f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
    return (f"training {cfg.model} on {n_strings} strings -> {cfg.output}\n"
            f"  {'preset ' + cfg.preset if cfg.preset else 'no preset'}: temperature {cfg.temperature:g}, {mask}, "
            f"dropout {cfg.dropout:g}, max length {cfg.max_length}, batch {cfg.batch_size} strings, "
            f"learning rate {cfg.lr:g}, {budget} (full configuration: -v, and mirrorbert.json)")


def train_summary(result) -> str:
    """What happened, labelled: steps, loss from first step to the last epoch's mean, collapse, scores."""
    info = result.info
    first = (info.get("collapse") or {}).get("first_loss")
    last = info.get("mean_loss_last_epoch")
    lines = [f"done: {result.steps} steps in {result.wall_time_s:.0f} s; training loss "
             + (f"{first:.4f} at the first step -> {last:.4f} (mean of the last epoch)" if first is not None
                and last is not None else
                f"{result.final_loss} (mean of the last {result.final_loss_window_steps} steps)")]
    collapse = info.get("collapse") or {}
    if "mean_pairwise_cosine" in collapse:
        lines.append(f"  mean pairwise cosine of {collapse['sample']} training strings: "
                     f"{collapse['mean_pairwise_cosine']:.3f}" + (" (collapsed)" if collapse.get("collapsed") else ""))
    scores = (info.get("eval_after") or {}).get("metrics") or {}
    for key, value in scores.items():
        if isinstance(value, (int, float)) and not key.endswith("_n"):
            lines.append(f"  after training, {key}: {100 * value:.2f} (x100)")
    lines.append(f"  model: {result.output}")
    return "\n".join(lines)


def run_train(args) -> int:
    """Resolve the configuration, check every output before any data is read, train, report (rank 0 only)."""
    from mirrorbert.mirror.config import resolve_config
    from mirrorbert.data.strings import strings_for_config

    push_repo = check_push_to_hub(getattr(args, "push_to_hub", None))  # before anything is read or trained
    cfg = resolve_config({k: getattr(args, k, None) for k in _train_keys()}, config_file=args.config_file)
    if cfg.output:  # the outputs, before the data is read (the trainer checks again, and locks them)
        inputs = {"--config": args.config_file, "--model": cfg.model, "--data": cfg.data, "--data-dir": cfg.data_dir,
                  "--resume": cfg.resume}
        WritePlan(inputs, overwrite=bool(cfg.overwrite)).folder("--output", cfg.output) \
            .append_folder("--log-dir", cfg.log_dir).check()
        check_outputs_avoid({"--config": args.config_file}, ("--checkpoint-dir", cfg.resolved_checkpoint_dir()))
    with pending_phase("data"):  # the trainer's phase timings take this over
        strings = strings_for_config(cfg, stream=True)  # data mistakes surface before torch is even imported
    with pending_phase("import"):  # torch and the trainer's modules
        from mirrorbert.runtime.distributed import launched_rank
        from mirrorbert.mirror.train import train

    main_rank = launched_rank() == 0  # under torchrun/accelerate only rank 0 speaks
    if main_rank:
        logging.getLogger("mirrorbert").debug("resolved configuration:\n%s", jsonio.dumps(cfg.to_dict(), indent=2))
        print(train_headline(cfg, len(strings.strings)), file=sys.stderr)
    result = train(cfg, strings)
    if result.interrupted:  # every process of an interrupted job names the checkpoint that rank 0 wrote
        from mirrorbert.training.engine import stop_message

        print(stop_message(result.stop_signal, result.steps, result.checkpoint, launched_rank()), file=sys.stderr)
        return EXIT_INTERRUPTED
    if not main_rank:
        return 0
    print(train_summary(result), file=sys.stderr)
    pushed = push_trained(result.output, push_repo) if push_repo else None
    print(jsonio.dumps({"output": str(result.output), "steps": result.steps, "final_loss": result.final_loss,
                      "final_loss_window_steps": result.final_loss_window_steps,
                      "last_batch_loss": result.last_batch_loss,
                      "mean_loss_last_epoch": result.info.get("mean_loss_last_epoch"),
                      "wall_time_s": round(result.wall_time_s, 2),
                      "strings_per_s": result.info.get("strings_per_s"),
                      **({"pushed": pushed["url"]} if pushed else {})}, indent=2))
    return 0
