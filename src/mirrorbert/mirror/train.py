"""`train()`: a Mirror-BERT run as a `Recipe` of the one run lifecycle (training/run.py): its strings, model and
second views, its resume checks, `--eval-after` (the evaluation package imported only when asked for), its saved
model. The step itself (two views, InfoNCE, one update) is `mirror.step`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.data.readers import chunked
from mirrorbert.data.strings import TrainingStrings, strings_for_config
from mirrorbert.data.token_store import CHUNK, StoreStrings, TokenStore, open_token_store, store_key
from mirrorbert.encoder.architectures import usable_precision
from mirrorbert.encoder.dropout import DropHead, dropout_overrides
from mirrorbert.encoder.model import MIRRORBERT_JSON, Encoder
from mirrorbert.encoder.packing import packing_flag
from mirrorbert.encoder.pooling import pooling_from_sentence_transformers
from mirrorbert.encoder.source import ModelHandle, open_model
from mirrorbert.errors import UserError
from mirrorbert.mirror.collapse import check_collapse, collapse_advice
from mirrorbert.mirror.config import TrainConfig, resolve_pooling
from mirrorbert.mirror.step import MirrorMethod, embed_views, mirror_plan
from mirrorbert.mirror.views import SecondViews, note_tokenless
from mirrorbert.publish.model_card import CARD_SETTINGS
from mirrorbert.reporting.metrics import library_versions
from mirrorbert.runtime.device import compile_model, enable_gradient_checkpointing, peak_memory_bytes
from mirrorbert.runtime.distributed import sharded_encoding
from mirrorbert.runtime.randomness import replay_rng
from mirrorbert.settings.fields import names_with
from mirrorbert.training.run import GuardedPaths, Recipe, RunContext, run

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    output: Path | None
    steps: int
    final_loss: float | None  # mean over the last `final_loss_window_steps` steps (training/loss_record.py)
    wall_time_s: float
    interrupted: bool = False
    checkpoint: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)
    stop_signal: str | None = None  # "SIGTERM" (preempted) or "SIGINT" when interrupted
    # (seconds, strings, non-padding tokens) per optimiser step, for benchmarks and diagnostics
    step_log: list[tuple[float, int, int]] = field(default_factory=list)
    final_loss_window_steps: int = 0
    last_batch_loss: float | None = None  # one batch, possibly an epoch's short last one: not a run's measure


def open_start_model(cfg: TrainConfig) -> ModelHandle:
    """The model to start from, opened and checked with what this run asks of it (max length, a mask token)."""
    handle = open_model(cfg.model, trust_remote_code=cfg.trust_remote_code)
    try:
        handle.check_max_length(cfg.max_length)
        if cfg.mask_span > 0:
            handle.need_mask()
        handle.warn_if_decoder()
    except BaseException:
        handle.close()
        raise
    return handle


def start_pooling(cfg: TrainConfig, start: ModelHandle) -> str:
    """The pooling to train with: `--pooling` when given; else a sentence-transformers model's saved pooling (said in
    one info line); else the preset's (sentence: mean for BERT-family models, [CLS] otherwise) or the default."""
    saved = None if cfg.pooling_given else pooling_from_sentence_transformers(start.files)[0]
    if saved is None:
        return resolve_pooling(cfg.pooling, start.config().model_type)
    logger.info("pooling: %s, as the sentence-transformers model %s was saved with (--pooling changes it)", saved,
                cfg.model)
    return saved


def _training_record(start: ModelHandle) -> bool:
    """Whether the start model's mirrorbert.json records a training run (it was tuned by mirrorbert)."""
    info = start.json(MIRRORBERT_JSON, {})
    return isinstance(info, dict) and bool(info.get("training"))


def train(cfg: TrainConfig, strings: TrainingStrings | None = None) -> TrainResult:
    """Run Mirror-BERT tuning as configured and write the model to `cfg.output` (`cfg` checked itself when made)."""
    cfg.validate()  # every required option given (`output= is required`), before anything is read
    return run(MirrorRecipe(cfg, strings))


class MirrorRecipe(Recipe):
    """Mirror-BERT's part of a run: strings and their token store, the encoder with its dropout, the save."""

    label = "mirror"
    distributed = True

    def __init__(self, cfg: TrainConfig, strings: TrainingStrings | None = None) -> None:
        super().__init__(cfg)
        self.strings = strings
        self.eval_tasks = check_eval_after(cfg.eval_after, cfg.data_dir)
        self.encoder: Encoder | None = None
        self.pooling, self.drophead, self.compiled, self.raw_mlm = "cls", None, False, True

    def guarded_paths(self) -> GuardedPaths:
        cfg = self.cfg
        return GuardedPaths(inputs={"--model": cfg.model, "--data": cfg.data, "--resume": cfg.resume,
                                    "--data-dir": cfg.data_dir},
                            extra_outputs=[("--log-dir", cfg.log_dir)], model=cfg.model)

    def read_data(self, run_ctx: RunContext) -> None:
        if run_ctx.dist.world_size > 1 and self.cfg.grad_cache_chunk:
            raise UserError("--grad-cache-chunk: not supported with several processes yet (DDP's gradient hooks "
                            "would fire inside the cached replay); use --gradient-checkpointing there")
        self.strings = self.strings or strings_for_config(self.cfg, stream=True)

    def check_resume(self, resume, run_ctx: RunContext) -> None:
        if resume.meta.get("data_sha256") not in (None, self.strings.fingerprint):
            raise UserError(f"--resume {resume.path}: the training data differ from the run that wrote this checkpoint")
        step, total = int(resume.meta.get("step", 0)), mirror_plan(self.cfg, len(self.strings.strings)).total_steps
        if step > total:  # it would 'finish' with no training and write a model named after a step it never reached
            raise UserError(f"--resume {resume.path}: the checkpoint is at step {step}, past the end of this run "
                            f"(step {total}: --steps/--epochs); ask for more than {step} steps to continue it")

    def build(self, run_ctx: RunContext) -> MirrorMethod:
        cfg = self.cfg
        encoder, views = self._encoder_and_views(run_ctx)
        run_ctx.precision = usable_precision(encoder.model, run_ctx.precision, run_ctx.device)
        with run_ctx.timer.phase("compile"):
            self.compiled = cfg.compile and compile_model(encoder.model, warm_up=lambda: _compile_warm_up(
                encoder, views.store.token_ids([0, 1]), run_ctx.precision))
        plan = mirror_plan(cfg, len(views.store))
        if plan.batch_size < cfg.batch_size:
            logger.warning("--batch-size %d is larger than the data (%d strings): using %d", cfg.batch_size,
                           len(views.store), plan.batch_size)
        return MirrorMethod(cfg, encoder, views, plan, run_ctx, self.strings.fingerprint)

    def _encoder_and_views(self, run_ctx: RunContext) -> tuple[Encoder, SecondViews]:
        """The encoder to train (from the checkpoint when resuming) and the second-view masker over the token store."""
        cfg, resume = self.cfg, run_ctx.resume
        with run_ctx.timer.phase("load"), open_start_model(cfg) as start:
            base_config = start.config()
            self.pooling = start_pooling(cfg, start)
            self.raw_mlm = start.json("modules.json") is None and not _training_record(start)
            overrides = dropout_overrides(base_config, cfg.dropout)
            if resume is None:
                encoder = Encoder.from_handle(start, pooling=self.pooling, device=str(run_ctx.device),
                                              config_overrides=overrides)
            else:
                with open_model(resume.model_dir, option=f"--resume {resume.path}:",
                                trust_remote_code=cfg.trust_remote_code) as saved:
                    encoder = Encoder.from_handle(saved, pooling=self.pooling, device=str(run_ctx.device),
                                                  config_overrides=overrides)
        encoder.packing = packing_flag(cfg.packing)
        encoder.train()
        self.encoder = encoder
        self.drophead = DropHead(encoder.model, cfg.drophead) if cfg.drophead > 0 else None
        with run_ctx.timer.phase("tokenise"):
            store = training_store(self.strings, encoder.tokenizer, cfg.max_length, run_ctx.dist)
            views = SecondViews(encoder.tokenizer, store, cfg.mask_unit, cfg.mask_span, cfg.mask_min_chars,
                                cfg.max_length)
        views.warn_if_never_applies()
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(encoder.model)
        return encoder, views

    def restore(self, method: MirrorMethod, extra: dict[str, Any], resume) -> None:
        method.epoch, method.next_batch = extra["epoch"], extra["next_batch"]
        method.losses.restore(extra, f"--resume {resume.path}")

    def before_run(self, method: MirrorMethod, engine) -> None:
        method.dist.wrap(self.encoder)

    def close(self, method: MirrorMethod) -> None:
        method.metrics.close()
        method.dist.unwrap(self.encoder)
        if self.drophead is not None:
            self.drophead.remove()

    def stopped(self, method: MirrorMethod, outcome, run_ctx: RunContext) -> TrainResult:
        return TrainResult(None, outcome.steps, method.losses.final, run_ctx.wall(), interrupted=True,
                           checkpoint=outcome.checkpoint, step_log=method.step_log, stop_signal=outcome.signal,
                           **_loss_extras(method))

    def finish(self, method: MirrorMethod, outcome, engine, run_ctx: RunContext) -> TrainResult:
        """After the last step: the run's record, the collapse check, --eval-after, the output."""
        cfg, encoder, wall = self.cfg, self.encoder, run_ctx.wall()
        info = _run_info(self, method, outcome.steps, wall)
        encoder.eval()
        advice = collapse_advice(cfg.lr, sum(p.numel() for p in encoder.model.parameters()), self.pooling,
                                 raw_mlm=self.raw_mlm)
        info["collapse"] = check_collapse(encoder, self.strings.strings, method.losses.first,
                                          method.losses.mean_last_epoch, outcome.steps, seed=cfg.seed, advice=advice)
        if self.eval_tasks:
            with sharded_encoding(run_ctx.dist), run_ctx.timer.phase("eval"):  # every rank shares the encoding
                info["eval_after"] = evaluate_after_training(encoder, self.eval_tasks, cfg.data_dir)
        info["timings"] = run_ctx.timer.report()  # up to here: the save cannot time itself into its own file
        output = engine.save_final(cfg.output, lambda folder: encoder.write(folder, info), overwrite=cfg.overwrite)
        info["timings"] = run_ctx.timer.report()  # now with the save, for the caller and the -v line
        logger.debug("phase timings (s): %s", jsonio.dumps(info["timings"]))
        logger.info("model written to %s (%d steps, final loss %s: mean of the last %d)", output, outcome.steps,
                    method.losses.final, len(method.losses.recent))
        if cfg.max_length < encoder.max_length:  # say it: the saved limit is not the one the strings were cut at
            logger.info("trained on strings cut at %d tokens; the saved model encodes up to %d (its own limit; "
                        "max_length=%d when loading encodes as in training)", cfg.max_length, encoder.max_length,
                        cfg.max_length)
        return TrainResult(output, outcome.steps, method.losses.final, wall, checkpoint=outcome.checkpoint,
                           info=info, step_log=method.step_log, **_loss_extras(method))


def check_eval_after(tasks: str | Iterable[str] | None, data_dir: str | None) -> list[str]:
    """Validated task names (empty when none asked); fails before training on unknown tasks or data dir."""
    if tasks is None or (isinstance(tasks, str) and not tasks.strip()):
        return []
    from mirrorbert.evaluation import datasets
    from mirrorbert.evaluation.runner import parse_tasks

    try:
        names = parse_tasks(tasks)
        datasets.resolve_data_dir(data_dir)
    except UserError as exc:
        raise UserError(f"--eval-after: {str(exc).removeprefix('--tasks: ')}") from None
    return names


def evaluate_after_training(encoder, tasks: list[str], data_dir: str | None, batch_size: int = 64) -> dict[str, Any]:
    """Run the evaluation suite on the trained encoder: flat metrics ``{"task/metric": value}`` and statuses."""
    from mirrorbert.evaluation import evaluate

    result = evaluate(encoder, tasks, data_dir, batch_size=batch_size, model_name=str(encoder.source))
    metrics = {f"{task}/{key}": value for task, outcome in result.outcomes.items() for key, value in outcome.metrics.items()}
    not_run = {task: f"{o.status}: {o.message}" for task, o in result.outcomes.items() if o.status != "ok"}
    for task, message in not_run.items():
        logger.warning("--eval-after %s: %s", task, message)
    return {"tasks": list(tasks), "data_dir": result.data_dir, "scale": "fractions (x100 in the card)",
            "metrics": metrics, "not_run": not_run}


def _compile_warm_up(encoder: Encoder, sample: list[list[int]], precision: str) -> None:
    """One forward and backward so torch.compile compiles (or fails) now; no trace in RNG or gradients."""
    with replay_rng():
        embed_views(encoder, sample, sample, precision=precision).float().sum().backward()
    encoder.zero_grad(set_to_none=True)


def _loss_extras(method: MirrorMethod) -> dict[str, Any]:
    return {"final_loss_window_steps": len(method.losses.recent), "last_batch_loss": method.losses.last}


def training_store(strings: TrainingStrings, tokenizer, max_length: int, dist_ctx=None) -> TokenStore:
    """The strings' token store (data/token_store.py: built once, cached by content and tokenizer), with the
    strings that give no tokens reported; `strings.strings` then reads from the store, so the run keeps no
    Python list of every string. Under several processes rank 0 builds it and the others open what it wrote."""
    current = strings.strings
    if isinstance(current, StoreStrings) and current.store.meta.get("key") == store_key(
            strings.fingerprint, tokenizer, max_length):
        return current.store  # the same object trained on before: its strings are the store already

    def build() -> TokenStore:
        return open_token_store(chunked(current, CHUNK), strings.fingerprint, tokenizer, max_length,
                                source=f"--data {strings.source}")

    store = build() if dist_ctx is None else dist_ctx.on_main(build, None)
    if store is None:  # another rank: rank 0 has written (and checked) it, this one opens it
        store = build()
    note_tokenless(strings, store.dropped, store.meta.get("dropped_example"), len(store))
    strings.strings = store.strings
    return store


def _run_info(recipe: MirrorRecipe, method: MirrorMethod, steps: int, wall: float) -> dict[str, Any]:
    """What `mirrorbert.json` records about the run."""
    cfg, device, elapsed = recipe.cfg, method.device, method.elapsed()
    masking = method.views.stats.shares()
    logger.info("span masking (%s, k=%d): %.1f%% of real tokens hidden, %.1f%% of strings masked", cfg.mask_unit,
                cfg.mask_span, 100 * masking["masked_token_share"], 100 * masking["masked_string_share"])
    return {
        "method": "mirror-bert",
        "config": {**cfg.to_dict(), "pooling": recipe.pooling, "batch_size": method.plan.batch_size},
        CARD_SETTINGS: list(names_with(type(cfg), "card")),  # the settings the model card shows, in order
        "data": recipe.strings.summary(),
        "seed": cfg.seed,
        "steps": steps,
        "epochs": round(steps / max(1, method.plan.batches_per_epoch), 3),
        **method.losses.fields(),  # final_loss (a window's mean, named), last_batch_loss, mean_loss_last_epoch
        **masking,
        "wall_time_s": round(wall, 2),
        "strings_per_s": round(method.seen_strings / elapsed, 2),
        "real_tokens_per_s": round(method.seen_tokens / elapsed, 2),
        "device": str(device),
        "world_size": method.dist.world_size,
        "precision": method.precision,
        "compiled": bool(recipe.compiled),
        "peak_memory_bytes": peak_memory_bytes(device),
        "peak_memory_measure": "cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        "versions": library_versions(),
    }


__all__ = ["train", "TrainResult", "MirrorRecipe"]
