"""`mirrorbert train`: Mirror-BERT tuning from the command line (the work is in `mirror/train.py`). Every argparse
default is None, so that a --config file and a --preset fill what the command line leaves out."""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.cli.push import push_trained
from mirrorbert.mirror.config import FIELD_NAMES, PRESETS, TrainConfig, resolve_config
from mirrorbert.reporting.timing import pending_phase
from mirrorbert.safeguards.writes import WritePlan, check_outputs_avoid
from mirrorbert.settings.fields import names_with, option
from mirrorbert.settings.validation import Options

EXIT_INTERRUPTED = 130
GROUPS = {"output": "model and output", "data": "training strings", "method": "method",
          "optimisation": "optimisation", "hardware": "hardware and bookkeeping",
          "eval": "evaluation after training (model card)"}


@dataclass(kw_only=True)
class TrainRun(Options):
    """What `train` takes besides TrainConfig's fields: a file of options, and where the result goes after."""

    push_to_hub: str | None = option(None, help="after training, upload the --output folder to this Hugging Face "
                                                "Hub repository (USER/NAME, created when missing; the id is checked "
                                                "before training starts; as `mirrorbert push`)", metavar="USER/NAME",
                                     group="output")
    config_file: str | None = option(None, help="YAML or JSON file of options; command-line options win",
                                     flag="--config", group="output")


def add_train_parser(sub) -> None:
    command(sub, "train", run_train, TrainConfig, TrainRun, titles=GROUPS, leave_unset=True, presets=preset_values(),
            summary="Mirror-BERT tuning of a masked LM into an encoder",
            description="Mirror-BERT: self-supervised contrastive tuning with duplicated views, span masking and "
                        "dropout. Options default to the chosen --preset (the paper's settings).")


def preset_values() -> dict[str, str]:
    """Per preset field, what each preset sets it to, as --help states it ("word 0.2, phrase 0.04, ...")."""
    unset = {f.name: f.metadata.get("unset") or "none" for f in dataclasses.fields(TrainConfig)}
    return {name: ", ".join(f"{preset} {unset[name] if values[name] is None else values[name]}"
                            for preset, values in PRESETS.items() if name in values)
            for name in names_with(TrainConfig, "preset")}


def stopped(result, rank: int = 0) -> int:
    """A stopped training run: where its checkpoint is and how to resume, and the exit status."""
    from mirrorbert.training.engine import stop_message

    print(stop_message(result.stop_signal, result.steps, result.checkpoint, rank), file=sys.stderr)
    return EXIT_INTERRUPTED


def train_headline(cfg, n_strings: int) -> str:
    """One line a person reads before training starts (the whole configuration: -v and mirrorbert.json)."""
    mask = f"span {cfg.mask_span} {cfg.mask_unit}s" if cfg.mask_span else "no span masking"
    budget = f"{cfg.steps} steps" if cfg.steps else f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
    return (f"training {cfg.model} on {n_strings} strings -> {cfg.output}\n"
            f"  {'preset ' + cfg.preset if cfg.preset else 'no preset'}: temperature {cfg.temperature:g}, {mask}, "
            f"dropout {cfg.dropout:g}, max length {cfg.max_length}, batch {cfg.batch_size} strings, "
            f"learning rate {cfg.lr:g}, {budget} (full configuration: -v, and mirrorbert.json)")


def train_summary(result) -> str:
    """What happened, labelled: steps, loss from the first step to the final loss (the mean of the last steps,
    the progress lines' `loss`), collapse, scores."""
    info, collapse = result.info, result.info.get("collapse") or {}
    first = collapse.get("first_loss")
    final = (f"{result.final_loss:.4f}" if isinstance(result.final_loss, float) else str(result.final_loss)) + \
        f" (mean of the last {result.final_loss_window_steps} steps, the progress lines' loss)"
    lines = [f"done: {result.steps} steps in {result.wall_time_s:.0f} s; training loss "
             + (f"{first:.4f} at the first step -> {final}" if first is not None else final)]
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
    """Resolve the configuration, check every option and output before any data is read, train, report (rank 0
    only)."""
    from mirrorbert.data.strings import strings_for_config
    from mirrorbert.publish.hub import check_repo_id

    run_options = options_from_args(TrainRun, args)
    repo = run_options.push_to_hub
    push_repo = None if repo is None else check_repo_id(repo, "--push-to-hub")  # before anything is read or trained
    cfg = resolve_config({k: getattr(args, k, None) for k in FIELD_NAMES}, config_file=run_options.config_file)
    cfg.validate()  # the required options, named now: nothing was read yet
    inputs = {"--config": run_options.config_file, "--model": cfg.model, "--data": cfg.data,
              "--data-dir": cfg.data_dir, "--resume": cfg.resume}
    # the outputs, before the data is read (the trainer checks again, and locks them)
    WritePlan(inputs, overwrite=bool(cfg.overwrite)).folder("--output", cfg.output) \
        .append_folder("--log-dir", cfg.log_dir).check()
    check_outputs_avoid({"--config": run_options.config_file}, ("--checkpoint-dir", cfg.resolved_checkpoint_dir()))
    with pending_phase("data"):  # the trainer's phase timings take this over
        strings = strings_for_config(cfg, stream=True)  # data mistakes surface before torch is even imported
    with pending_phase("import"):  # torch and the trainer's modules
        from mirrorbert.runtime.distributed import launch_environment
        from mirrorbert.mirror.train import train

    main_rank = launch_environment()[1] == 0  # under torchrun/accelerate only rank 0 speaks
    if main_rank:
        logging.getLogger("mirrorbert").debug("resolved configuration:\n%s", jsonio.dumps(cfg.to_dict(), indent=2))
        print(train_headline(cfg, len(strings.strings)), file=sys.stderr)
    result = train(cfg, strings)
    if result.interrupted:  # every process of an interrupted job names the checkpoint that rank 0 wrote
        return stopped(result, launch_environment()[1])
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
