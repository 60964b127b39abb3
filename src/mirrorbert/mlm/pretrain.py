"""Masked-language-model pre-training, from scratch or continued from any HF masked LM.

The corpus is tokenised once into memory-mapped token streams (`corpus.py`); batches are packed
windows of `seq_length` tokens, corrupted by `masking.py` in a background thread. The training
machinery (device, precision, optimiser, schedule, checkpoints, RNG state, TensorBoard, atomic output)
is the shared one of `mirrorbert.training`, so `pretrain-mlm` behaves like `mirrorbert train`.

Exact resume: the data position and every mask are pure functions of (seed, step), the optimiser,
scheduler and RNG state live in the checkpoint, so N steps + resume N steps equals 2N steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from mirrorbert.errors import UserError, first_line
from mirrorbert.mlm.config import RESUME_HARMLESS, RESUME_KEYS, PretrainConfig, validate
from mirrorbert.mlm.corpus import PackedSequences, check_corpus_files, epoch_order, prepare_corpus
from mirrorbert.training.prefetch import prefetch
from mirrorbert.mlm.masking import IGNORE_INDEX, MaskingConfig, MlmMasker
from mirrorbert.safeguards.writes import write_json_atomic
from mirrorbert.safeguards.preflight import check_max_length, inspect_model, max_positions, weights_load_error
from mirrorbert.safeguards.writes import weights_size
from mirrorbert.training.checkpoints import (
    CheckpointManager, check_resume_config, guard_training_run, load_checkpoint, restore_training_state,
)
from mirrorbert.runtime.device import autocast, make_grad_scaler, resolve_device, resolve_precision, set_threads
from mirrorbert.training.engine import Engine
from mirrorbert.reporting.metrics import MetricLogger, library_versions
from mirrorbert.training.optim import backward_and_step, build_optimizer, build_scheduler
from mirrorbert.runtime.randomness import derived_generator, seed_everything

logger = logging.getLogger(__name__)

# Named sizes of Turc et al. (2019), "Well-Read Students Learn Better"; heads = hidden / 64.
ARCHITECTURES: dict[str, dict[str, int]] = {
    "bert-tiny": {"num_hidden_layers": 2, "hidden_size": 128},
    "bert-mini": {"num_hidden_layers": 4, "hidden_size": 256},
    "bert-small": {"num_hidden_layers": 4, "hidden_size": 512},
    "bert-medium": {"num_hidden_layers": 8, "hidden_size": 512},
}
INFO_FILE = "mlm_pretraining.json"
# Random streams derived from the seed (see training.randomness.derived_generator), one per purpose.
STREAM_MASK, STREAM_EVAL = 11, 12
# Positions of the named sizes (BERT's); a longer --seq-length needs a config JSON that says so.
ARCHITECTURE_POSITIONS = 512


@dataclass
class PretrainResult:
    output: Path | None
    steps: int
    tokens: int
    train_loss: float | None  # mean per masked token over the last logging window (train_loss_window_steps)
    train_accuracy: float | None
    eval_loss: float | None
    eval_accuracy: float | None
    tokens_per_s: float
    wall_time_s: float
    interrupted: bool = False
    checkpoint: Path | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    stop_signal: str | None = None  # "SIGTERM" (preempted) or "SIGINT" when interrupted
    train_loss_window_steps: int | None = None


# --------------------------------------------------------------------------- model / tokenizer
def load_tokenizer(path: str, trust_remote_code: bool = False):
    from mirrorbert.safeguards.model_loading import load_tokenizer as load_tokenizer_checked

    if not Path(path).exists():
        raise UserError(f"--tokenizer {path}: no such folder")
    try:
        return load_tokenizer_checked(path, trust_remote_code=trust_remote_code, option="--tokenizer")
    except UserError:
        raise
    except (OSError, ValueError) as exc:
        first = first_line(exc)
        raise UserError(f"--tokenizer {path}: cannot load a tokenizer from this folder: {first}") from None


def architecture_config(architecture: str, tokenizer, seq_length: int):
    """A fresh config for a named size or a config JSON file, sized to the tokenizer's vocabulary."""
    from transformers import BertConfig

    from mirrorbert.safeguards.model_loading import config_for_model

    if architecture in ARCHITECTURES:
        size = ARCHITECTURES[architecture]
        hidden = size["hidden_size"]
        config = BertConfig(
            hidden_size=hidden, num_hidden_layers=size["num_hidden_layers"], num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden, max_position_embeddings=ARCHITECTURE_POSITIONS,
        )
    else:
        path = Path(architecture)
        if not path.is_file():
            raise UserError(
                f"--architecture {architecture}: not a named size ({', '.join(ARCHITECTURES)}) nor a config JSON file"
            )
        from mirrorbert.safeguards.readback import parse_json, read_regular_bytes

        values = parse_json(read_regular_bytes(path, "--architecture", 16 << 20), "--architecture", path)
        if not isinstance(values, dict):
            raise UserError(f"--architecture {path}: expected a JSON object of config fields")
        values = {k: v for k, v in values.items() if k not in ("architectures", "transformers_version")}
        model_type = values.pop("model_type", "bert")
        try:
            config = config_for_model(model_type, **values)
        except (ValueError, TypeError) as exc:
            raise UserError(f"--architecture {path}: {exc}") from None
    # before any weight is allocated: a sequence longer than the positions cannot run at all
    check_max_length(seq_length, config, "--seq-length", f"--architecture {architecture}")
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if tokenizer.bos_token_id is not None:
        config.bos_token_id = tokenizer.bos_token_id
    if tokenizer.eos_token_id is not None:
        config.eos_token_id = tokenizer.eos_token_id
    return config


def build_model(cfg: PretrainConfig):
    """(model, tokenizer, description) for a fresh architecture or a pretrained MLM."""
    from mirrorbert.safeguards.model_loading import load_model, model_from_config

    if cfg.architecture is not None:
        tokenizer = load_tokenizer(cfg.tokenizer, cfg.trust_remote_code)
        config = architecture_config(cfg.architecture, tokenizer, cfg.seq_length)
        try:
            model = model_from_config(config, "AutoModelForMaskedLM", trust_remote_code=cfg.trust_remote_code,
                                      option=f"--architecture {cfg.architecture}")
        except UserError:
            raise
        except ValueError as exc:
            raise UserError(f"--architecture {cfg.architecture}: no masked-LM head for this config ({exc})") from None
        return model, tokenizer, f"{cfg.architecture} (from scratch)"
    from mirrorbert.safeguards.preflight import check_model_reachable, model_load_error

    name = cfg.model
    if Path(name).is_dir() and not (Path(name) / "config.json").exists():
        raise UserError(f"--model {name}: folder has no config.json (not a Hugging Face model folder)")
    # config, tokenizer, weight-file headers and --seq-length first: cheap, and before the weights load
    config, _ = inspect_model(name, max_length=cfg.seq_length, max_length_option="--seq-length", need_mask=True,
                              mask_option="--model", tokenizer_source=cfg.tokenizer,
                              trust_remote_code=cfg.trust_remote_code, tokenizer_option="--tokenizer")
    from mirrorbert.encoder.architectures import check_supported

    check_supported(config, name)
    check_model_reachable(name, cfg.trust_remote_code)
    try:
        model = load_model(name, "AutoModelForMaskedLM", trust_remote_code=cfg.trust_remote_code)
        tokenizer = load_tokenizer(cfg.tokenizer, cfg.trust_remote_code) if cfg.tokenizer else \
            _auto_tokenizer(name, cfg.trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  damaged weights raise safetensors' own error type
        error = weights_load_error(name, exc) or (
            model_load_error(name, exc) if isinstance(exc, (OSError, ValueError)) else None)
        if error is None:
            raise
        raise error from None
    embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embeddings:
        raise UserError(
            f"--tokenizer: {len(tokenizer)} tokens but the model {name} has only {embeddings} embeddings"
        )
    return model, tokenizer, name


def _auto_tokenizer(name: str, trust_remote_code: bool = False):
    from mirrorbert.safeguards.model_loading import load_tokenizer as load_tokenizer_checked

    return load_tokenizer_checked(name, trust_remote_code=trust_remote_code)




def _mlm_head(model) -> torch.nn.Module | None:
    """The prediction head, if the model exposes it the usual way (BERT: `cls`, RoBERTa: `lm_head`)."""
    for name in ("cls", "lm_head"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    return None


def mlm_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
             head: torch.nn.Module | None) -> tuple[torch.Tensor, int, int]:
    """(sum of token losses, number of targets, number predicted correctly).

    The vocabulary projection is the costliest layer of a small model; applying the head to the 15% of
    positions that are targets, instead of to all of them, gives the same loss at a fraction of the cost.
    """
    targets = labels != IGNORE_INDEX
    if head is not None:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)[0]
        logits = head(hidden[targets])
        gold = labels[targets]
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).logits[targets]
        gold = labels[targets]
    loss = torch.nn.functional.cross_entropy(logits.float(), gold, reduction="sum")
    correct = int((logits.argmax(-1) == gold).sum().item()) if gold.numel() else 0
    return loss, int(gold.numel()), correct


# --------------------------------------------------------------------------- batches
@dataclass
class _Plan:
    """Where every micro-batch comes from; a pure function of the data, sizes and seed."""

    n_sequences: int
    batch_size: int
    grad_accum: int
    seed: int
    total_steps: int = 0

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.n_sequences // self.batch_size)

    def micro_batch(self, m: int, orders: dict[int, np.ndarray]) -> tuple[int, int, np.ndarray]:
        epoch, b = divmod(m, self.batches_per_epoch)
        if epoch not in orders:
            orders.clear()  # keep only the current epoch's order in memory
            orders[epoch] = epoch_order(self.n_sequences, self.seed, epoch)
        return epoch, b, orders[epoch][b * self.batch_size : (b + 1) * self.batch_size]


def _training_batches(plan: _Plan, packed: PackedSequences, masker: MlmMasker, start_micro: int) -> Iterator[tuple]:
    orders: dict[int, np.ndarray] = {}
    m = start_micro
    while True:
        epoch, b, index = plan.micro_batch(m, orders)
        ids, att = packed.batch(index)
        corrupted, labels = masker(ids, att, derived_generator(plan.seed, STREAM_MASK, epoch, b))
        yield corrupted, att, labels
        m += 1


def evaluate(model, head, packed: PackedSequences | None, masker: MlmMasker, cfg: PretrainConfig,
             device: torch.device) -> dict[str, float] | None:
    """Loss and masked-token accuracy on a fixed, evenly spaced subset of held-out sequences, fixed masks."""
    if packed is None or len(packed) == 0:
        return None
    n = min(len(packed), cfg.eval_sequences)
    index = np.unique(np.linspace(0, len(packed) - 1, n).round().astype(np.int64))
    was_training = model.training
    model.eval()
    total_loss, total_n, total_correct = 0.0, 0, 0
    try:
        with torch.no_grad():
            for b, start in enumerate(range(0, len(index), cfg.batch_size)):
                ids, att = packed.batch(index[start : start + cfg.batch_size])
                corrupted, labels = masker(ids, att, derived_generator(cfg.seed, STREAM_EVAL, b))
                with autocast(device, cfg.precision):
                    loss, count, correct = mlm_loss(model, corrupted.to(device), att.to(device), labels.to(device), head)
                total_loss += float(loss)
                total_n += count
                total_correct += correct
    finally:
        model.train(was_training)
    if total_n == 0:
        return None
    return {"eval_loss": total_loss / total_n, "eval_accuracy": total_correct / total_n, "eval_targets": total_n}


# loss and correct summed over the window's targets (n), so its loss is the mean per masked token
_EMPTY_WINDOW = {"loss": 0.0, "n": 0, "correct": 0, "tokens": 0, "steps": 0}


class MlmMethod:
    """MLM pre-training for the engine: packed windows, masks from (seed, epoch, batch), accumulated steps."""

    def __init__(self, cfg, model, tokenizer, head, plan, optimizer, scheduler, scaler, device, packed, eval_packed,
                 masker, corpus_key, step, tokens_seen, history, resumed_window):
        self.cfg, self.model, self.tokenizer, self.head, self.plan = cfg, model, tokenizer, head, plan
        self.optimizer, self.scheduler, self.scaler, self.device = optimizer, scheduler, scaler, device
        self.eval_packed, self.masker, self.corpus_key = eval_packed, masker, corpus_key
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.tokens_seen, self.history = tokens_seen, history
        # the running window of the training metrics (the steps since the last log line, --log-every), carried
        # through checkpoints so a resumed run logs and reports the same; `train_loss` is its last one's mean
        self.window = {**_EMPTY_WINDOW, **(resumed_window or {}), "t": time.time()}
        self.run_tokens, self.loop_start = 0, time.time()
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] | None = None
        self.metrics = MetricLogger(cfg.log_dir)
        self.micro = prefetch(_training_batches(plan, packed, masker, step * cfg.grad_accum), cfg.prefetch_batches)

    def batches(self):
        while True:
            yield [next(self.micro) for _ in range(self.cfg.grad_accum)]

    def train_step(self, micro, engine) -> dict[str, str]:
        cfg, device = self.cfg, self.device
        n_targets = sum(int((labels != IGNORE_INDEX).sum()) for _, _, labels in micro)
        self.optimizer.zero_grad(set_to_none=True)
        step_loss, step_correct, step_tokens = 0.0, 0, 0
        for i, (ids, att, labels) in enumerate(micro):
            with autocast(device, cfg.precision):
                loss_sum, count, correct = mlm_loss(self.model, ids.to(device), att.to(device), labels.to(device),
                                                    self.head)
            step_loss += float(loss_sum.detach())
            step_correct += correct
            step_tokens += int(att.sum())
            engine.check_finite(step_loss)
            # Normalised by the targets of the whole step, so accumulation equals one big batch.
            backward_and_step(loss_sum / max(1, n_targets), self.optimizer, self.scheduler, self.scaler,
                              self.parameters, cfg.max_grad_norm, update=i == len(micro) - 1)
        self.tokens_seen += step_tokens
        self.run_tokens += step_tokens
        for key, value in (("loss", step_loss), ("n", n_targets), ("correct", step_correct), ("tokens", step_tokens),
                           ("steps", 1)):
            self.window[key] += value
        rate = self.run_tokens / max(time.time() - self.loop_start, 1e-9)
        return {"loss": f"{step_loss / max(1, n_targets):.3f}", "acc": f"{step_correct / max(1, n_targets):.3f}",
                "tok_s": f"{rate:.0f}"}

    def after_step(self, step: int) -> bool:
        cfg, window = self.cfg, self.window
        if step % cfg.log_every == 0 or step == self.plan.total_steps:
            now = time.time()
            self.last_train = {
                "step": step, "tokens": self.tokens_seen,
                "loss": window["loss"] / max(1, window["n"]), "accuracy": window["correct"] / max(1, window["n"]),
                "lr": self.scheduler.get_last_lr()[0], "tokens_per_s": window["tokens"] / max(now - window["t"], 1e-9),
                "window_steps": window["steps"],
            }
            self.history.append(self.last_train)
            self.metrics.log(step, **{f"train/{k}": v for k, v in self.last_train.items() if k != "step"})
            logger.debug("step %d: %s", step, self.last_train)
            self.window = {**_EMPTY_WINDOW, "t": now}
        if step % cfg.eval_every == 0 or step == self.plan.total_steps:
            self.last_eval = evaluate(self.model, self.head, self.eval_packed, self.masker, cfg, self.device)
            if self.last_eval is not None:
                self.history.append({"step": step, "tokens": self.tokens_seen, **self.last_eval})
                self.metrics.log(step, **{k.replace("eval_", "eval/"): v for k, v in self.last_eval.items()})
                logger.info("step %d (%d tokens): held-out loss %.4f, masked-token accuracy %.4f",
                            step, self.tokens_seen, self.last_eval["eval_loss"], self.last_eval["eval_accuracy"])
        return False

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self.micro.close()
        self.metrics.close()

    def save_model(self, folder: Path) -> None:
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"tokens": self.tokens_seen, "history": self.history,
                "window": {k: v for k, v in self.window.items() if k != "t"}}

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"pretrain": {"corpus_key": self.corpus_key, "config": self.cfg.to_dict(),
                             "total_steps": self.plan.total_steps}}


# --------------------------------------------------------------------------- the loop
def pretrain(cfg: PretrainConfig) -> PretrainResult:
    """Run MLM pre-training as configured and write an HF `*ForMaskedLM` folder to `cfg.output`."""
    validate(cfg)
    with set_threads(cfg.threads), contextlib.ExitStack() as locks:
        # path rules, writability and locks, before anything is loaded
        guard_training_run(locks, output=cfg.output, overwrite=cfg.overwrite,
                  inputs={"--corpus": list(cfg.corpus), "--model": cfg.model, "--tokenizer": cfg.tokenizer,
                          "--resume": cfg.resume},
                  checkpoint_dir=cfg.resolved_checkpoint_dir(), resuming=cfg.resume is not None,
                  extra_outputs=[("--log-dir", cfg.log_dir), ("--cache-dir", cfg.resolved_cache_dir())],
                  model_bytes=weights_size(cfg.model))
        return _pretrain(cfg)


def _model_and_data(cfg: PretrainConfig):
    """The starting model and tokenizer, the masker, and the corpus packed into train and held-out windows."""
    model, tokenizer, source = build_model(cfg)
    if tokenizer.mask_token_id is None:
        raise UserError(f"tokenizer of {source} has no mask token; MLM pre-training needs one ([MASK] or <mask>)")
    limit = max_positions(model.config)
    if limit is not None and cfg.seq_length > limit:
        raise UserError(f"--seq-length {cfg.seq_length}: the model takes at most {limit} positions")
    masker = MlmMasker.from_tokenizer(
        tokenizer, MaskingConfig(mlm_probability=cfg.mlm_probability, whole_word=cfg.whole_word_mask),
        vocab_size=model.get_input_embeddings().weight.shape[0],
    )
    corpus = prepare_corpus(cfg.corpus, tokenizer, cfg.resolved_cache_dir(), cfg.eval_fraction,
                            show_progress=cfg.show_progress)
    packed = corpus.packed("train", cfg.seq_length)
    if len(packed) == 0:
        raise UserError("--corpus: every document went to the held-out slice; lower --eval-fraction")
    eval_packed = corpus.packed("eval", cfg.seq_length) if corpus.n_tokens("eval") else None
    if eval_packed is None:
        logger.warning("the held-out slice is empty (corpus too small for --eval-fraction %s): no evaluation",
                       cfg.eval_fraction)
    return model, tokenizer, source, masker, corpus, packed, eval_packed


def _run_info(cfg, source, lr, warmup, corpus, packed, eval_packed, plan, result, rate, wall, device):
    """What `mlm_pretraining.json` records about the run."""
    return {
        "method": "mlm-pretraining",
        "source": source,
        "config": {**cfg.to_dict(), "lr": lr, "warmup_steps": warmup},
        "corpus": {"files": corpus.meta["sources"], "train_tokens": corpus.n_tokens("train"),
                   "eval_tokens": corpus.n_tokens("eval"), "train_sequences": len(packed),
                   "eval_sequences": len(eval_packed) if eval_packed is not None else 0},
        "steps": result.steps,
        "total_steps": plan.total_steps,
        "tokens_seen": result.tokens,
        "epochs": round(result.steps * cfg.grad_accum / plan.batches_per_epoch, 4),
        "train_loss": result.train_loss,
        "train_loss_window_steps": result.train_loss_window_steps,
        "train_accuracy": result.train_accuracy,
        "eval_loss": result.eval_loss,
        "eval_accuracy": result.eval_accuracy,
        "tokens_per_s_last_session": round(rate, 1),
        "wall_time_s_last_session": round(wall, 1),
        "device": str(device),
        "precision": cfg.precision,
        "versions": library_versions(),
        "history": result.history,
    }


def _load_resume(cfg: PretrainConfig):
    """The checkpoint to resume from (None for a new run), refused early when its options differ."""
    if not cfg.resume:
        return None
    resume = load_checkpoint(cfg.resume)
    saved_config = resume.meta.get("pretrain", {}).get("config", {})
    check_resume_config(resume.path, {k: v for k, v in saved_config.items() if k not in RESUME_KEYS},
                        cfg.to_dict(), RESUME_HARMLESS)  # RESUME_KEYS keep their own message in _check_resume
    return resume


def _check_resume(resume, cfg: PretrainConfig, corpus_key: str, total_steps: int) -> None:
    """The checkpoint's corpus and data-order settings must be this run's."""
    saved = resume.meta.get("pretrain", {})
    if saved.get("corpus_key") != corpus_key:
        raise UserError(f"--resume {resume.path}: the corpus or tokenizer differ from the run that wrote it")
    changed = [k for k in RESUME_KEYS if saved.get("config", {}).get(k) != getattr(cfg, k)]
    if changed:
        raise UserError(f"--resume {resume.path}: cannot resume with different "
                        + ", ".join("--" + k.replace("_", "-") for k in changed))
    if saved.get("total_steps") != total_steps:
        logger.warning("the budget changed since the checkpoint (%s -> %d steps): the learning-rate schedule "
                       "is stretched from here on", saved.get("total_steps"), total_steps)


def _budget(cfg: PretrainConfig, n_sequences: int):
    """The plan with its total steps (from --max-tokens or --epochs), tokens per step, warmup and lr."""
    plan = _Plan(n_sequences, cfg.batch_size, cfg.grad_accum, cfg.seed)
    tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_length
    if cfg.max_tokens is not None:
        plan.total_steps = max(1, math.ceil(cfg.max_tokens / tokens_per_step))
    else:
        epochs = cfg.epochs if cfg.epochs is not None else 1.0
        plan.total_steps = max(1, math.ceil(math.ceil(epochs * plan.batches_per_epoch) / cfg.grad_accum))
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else min(10_000, round(0.06 * plan.total_steps))
    lr = cfg.lr if cfg.lr is not None else (5e-4 if cfg.architecture else 5e-5)
    return plan, tokens_per_step, warmup, lr


def _result(method: MlmMethod, step: int, wall: float) -> PretrainResult:
    last_train, last_eval, history = method.last_train, method.last_eval, method.history
    if not last_train and history:
        last_train = next((h for h in reversed(history) if "loss" in h), {})
    return PretrainResult(
        output=None, steps=step, tokens=method.tokens_seen, train_loss=last_train.get("loss"),
        train_accuracy=last_train.get("accuracy"),
        eval_loss=(last_eval or {}).get("eval_loss"), eval_accuracy=(last_eval or {}).get("eval_accuracy"),
        tokens_per_s=method.run_tokens / max(time.time() - method.loop_start, 1e-9), wall_time_s=wall,
        history=history, train_loss_window_steps=last_train.get("window_steps"),
    )


def _pretrain(cfg: PretrainConfig) -> PretrainResult:
    device = resolve_device(cfg.device)
    cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
    started = time.time()
    seed_everything(cfg.seed)

    check_corpus_files(cfg.corpus)  # a missing or binary corpus fails before the model loads
    resume = _load_resume(cfg)
    model, tokenizer, source, masker, corpus, packed, eval_packed = _model_and_data(cfg)
    from mirrorbert.encoder.architectures import prepare_model, usable_precision

    cfg = dataclasses.replace(cfg, precision=usable_precision(prepare_model(model), cfg.precision))

    plan, tokens_per_step, warmup, lr = _budget(cfg, len(packed))

    if resume is not None:  # weights come from the checkpoint; everything else was built identically
        from mirrorbert.safeguards.model_loading import load_model

        model = load_model(resume.model_dir, "AutoModelForMaskedLM", trust_remote_code=cfg.trust_remote_code,
                           option=f"--resume {resume.path}:")
    model.to(device)
    model.train()
    head = _mlm_head(model)
    optimizer = build_optimizer(model, lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, "linear", warmup, plan.total_steps)
    scaler = make_grad_scaler(device, cfg.precision)
    checkpoints = CheckpointManager(cfg.resolved_checkpoint_dir(), keep=cfg.keep_checkpoints)

    step, tokens_seen, history, last_checkpoint, resumed_window = 0, 0, [], None, None
    if resume is not None:
        _check_resume(resume, cfg, corpus.meta["key"], plan.total_steps)
        extra = restore_training_state(resume, optimizer, scheduler, scaler)
        step, tokens_seen, history = extra["step"], extra["tokens"], list(extra.get("history", []))
        resumed_window = extra.get("window")
        last_checkpoint = resume.path
        logger.info("resumed from %s at step %d (%d tokens)", resume.path, step, tokens_seen)

    method = MlmMethod(cfg, model, tokenizer, head, plan, optimizer, scheduler, scaler, device,
                       packed, eval_packed, masker, corpus.meta["key"], step, tokens_seen, history, resumed_window)
    engine = Engine(method, total_steps=plan.total_steps, checkpoints=checkpoints, save_every=cfg.save_every,
                    checkpointing=bool(cfg.save_every) or resume is not None, step=step,
                    last_checkpoint=last_checkpoint, stop_at=None if cfg.stop_after_steps is None else
                    step + cfg.stop_after_steps, desc="pretrain-mlm", show_progress=cfg.show_progress)
    logger.info(
        "MLM pre-training %s: %d train sequences of %d tokens, %d steps of %d sequences (%d tokens), lr %g, "
        "warmup %d, device %s, %s", source, len(packed), cfg.seq_length, plan.total_steps,
        cfg.batch_size * cfg.grad_accum, tokens_per_step, lr, warmup, device, cfg.precision,
    )
    try:
        outcome = engine.run()
    finally:
        method.close()
    step, last_checkpoint, wall = outcome.steps, outcome.checkpoint, time.time() - started
    result = _result(method, step, wall)
    rate = result.tokens_per_s
    if outcome.stopped:  # interrupted or --stop-after-steps: the engine left a checkpoint to resume from
        result.interrupted, result.checkpoint, result.stop_signal = outcome.interrupted, last_checkpoint, outcome.signal
        logger.warning("stopped at step %d of %d; resume with --resume %s", step, plan.total_steps, last_checkpoint)
        return result
    result.checkpoint = last_checkpoint

    info = _run_info(cfg, source, lr, warmup, corpus, packed, eval_packed, plan, result, rate, wall, device)
    result.info = info
    model.eval()

    def write_into(folder: Path) -> None:
        method.save_model(folder)
        write_json_atomic(folder / INFO_FILE, info)

    result.output = engine.save_final(cfg.output, write_into, overwrite=cfg.overwrite)
    logger.info("model written to %s (%d steps, %d tokens)", cfg.output, step, result.tokens)
    return result


__all__ = ["ARCHITECTURES", "PretrainConfig", "PretrainResult", "pretrain", "mlm_loss", "validate"]
