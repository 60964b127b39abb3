"""`mirrorbert train`: Mirror-BERT tuning from the command line (the work is in `mirror/train.py`).

Every option is a `TrainConfig` field (mirror/config.py), its flag made from the field (cli/field_options.py).
Every argparse default is None, so that "not given" can be told from "given": a --config file and a --preset
fill what the command line leaves out, and `TrainConfig` the rest (its defaults are the ones --help states).
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.field_options import add_config_options
from mirrorbert.cli.push import PUSH_TO_HUB_HELP, check_push_to_hub, push_trained
from mirrorbert.mirror.config import FIELD_NAMES, PRESETS, TrainConfig, resolve_config
from mirrorbert.reporting.timing import pending_phase
from mirrorbert.safeguards.writes import WritePlan, check_outputs_avoid
from mirrorbert.settings.fields import preset_names

EXIT_INTERRUPTED = 130
# The --help groups of `train`, in order, by the `group` key of the fields.
GROUPS = {"output": "model and output", "data": "training strings", "method": "method",
          "optimisation": "optimisation", "hardware": "hardware and bookkeeping",
          "eval": "evaluation after training (model card)"}


def add_train_parser(sub) -> None:
    """`train`: one flag per TrainConfig field, every default None (see the module docstring)."""
    p = sub.add_parser(
        "train", help="Mirror-BERT tuning of a masked LM into an encoder",
        description="Mirror-BERT: self-supervised contrastive tuning with duplicated views, span masking "
                    "and dropout. Options default to the chosen --preset (the paper's settings).",
    )
    add_config_options(p, TrainConfig, GROUPS, leave_unset=True, preset_values=preset_values(),
                       after={"output": _add_run_inputs})
    p.set_defaults(func=run_train)


def _add_run_inputs(group) -> None:
    """What `train` takes besides TrainConfig's fields: where the result goes after, and a file of options."""
    group.add_argument("--push-to-hub", metavar="USER/NAME", help=PUSH_TO_HUB_HELP)
    group.add_argument("--config", dest="config_file", help="YAML or JSON file of options; command-line options win")


def preset_values() -> dict[str, str]:
    """Per preset field, what each preset sets it to, as --help states it ("word 0.2, phrase 0.04, ...")."""
    unset = {f.name: f.metadata.get("unset") or "none" for f in dataclasses.fields(TrainConfig)}
    return {name: ", ".join(f"{preset} {unset[name] if values[name] is None else values[name]}"
                            for preset, values in PRESETS.items() if name in values)
            for name in preset_names(TrainConfig)}


def _train_keys() -> tuple[str, ...]:
    """Every TrainConfig field is a `train` option of the same name, so the CLI never lists them twice."""
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
