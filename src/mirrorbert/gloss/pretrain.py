"""GR-BERT training loop: MLM + gloss regulariser on (word, sentence, gloss) triplets.

Optimisation follows the paper: AdamW (lr 2e-5), 10% linear warmup then linear decay,
batches of triplets (paper: 48), several epochs; after every epoch the gloss-matching
accuracy on the held-out triplets is measured and the best epoch's model is kept. Device,
precision, seeding, checkpoints (optimiser, scheduler and RNG state; exact resume) and the
atomic output folder come from :mod:`mirrorbert.training`, shared with ``mirrorbert train``.

The output is the inference MLM only (``mt``: the single encoder; ``sc``: enc2) as a
Hugging Face ``*ForMaskedLM`` folder with its tokenizer, plus ``gr_training.json``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.gloss.config import RESUME_HARMLESS, GlossPretrainConfig
from mirrorbert.training.loss_record import LossRecord

logger = logging.getLogger(__name__)

STREAM_ORDER, STREAM_MASK, STREAM_HARD, STREAM_LIMIT = 11, 12, 13, 14
TRAINING_INFO = "gr_training.json"


@dataclass
class GlossPretrainResult:
    output: Path | None
    steps: int
    history: list[dict[str, Any]]
    best: dict[str, Any] | None
    stats: dict[str, Any]
    wall_time_s: float
    interrupted: bool = False
    checkpoint: Path | None = None
    stop_signal: str | None = None  # "SIGTERM" (preempted) or "SIGINT" when interrupted

    def summary(self) -> dict[str, Any]:
        return {"output": str(self.output) if self.output else None, "steps": self.steps, "triplets": self.stats,
                "heldout_accuracy": [{k: h[k] for k in ("epoch", "step", "accuracy", "accuracy_word") if k in h}
                                     for h in self.history],
                "best": self.best, "wall_time_s": round(self.wall_time_s, 2)}


# --------------------------------------------------------------------------- data
def _fingerprint(triplets) -> str:
    h = hashlib.sha256()
    for t in triplets:
        h.update(f"{t.word}\t{t.sentence}\t{t.gloss}\t{t.start}\t{t.end}\n".encode("utf-8"))
    return h.hexdigest()


def prepare_triplets(cfg: GlossPretrainConfig):
    """Load triplets, optionally subsample (seeded), split off the held-out set."""
    from mirrorbert.gloss.triplets import load_triplets, split_holdout, triplet_stats, write_triplets_tsv

    triplets, inventory = load_triplets(cfg.triplets, cfg.data_dir, show_progress=cfg.show_progress)
    stats: dict[str, Any] = {"source": cfg.triplets, **triplet_stats(triplets)}
    if cfg.limit and cfg.limit < len(triplets):
        rng = random.Random(cfg.seed * 1_000_003 + STREAM_LIMIT)
        triplets = [triplets[i] for i in sorted(rng.sample(range(len(triplets)), cfg.limit))]
        stats["limit"] = cfg.limit
    train, heldout = split_holdout(triplets, cfg.holdout, seed=cfg.seed)
    stats.update({"train": len(train), "heldout": len(heldout)})
    logger.info("triplets: %d words, %d glosses, %d triplets (%d train, %d held out)",
                stats["words"], stats["glosses"], stats["triplets"], len(train), len(heldout))
    if cfg.export_triplets:
        write_triplets_tsv(train, cfg.export_triplets)
    return train, heldout, inventory, stats


# --------------------------------------------------------------------------- model I/O
def load_start_model(name: str, trust_remote_code: bool = False):
    """Tokenizer and masked LM to start from, with a clear error when they cannot be loaded."""
    from mirrorbert.safeguards.model_loading import load_model, load_tokenizer
    from mirrorbert.safeguards.preflight import first_line, inspect_model, weights_load_error

    # cheap checks before the weights load
    config, _ = inspect_model(name, need_mask=True, mask_option="--model", trust_remote_code=trust_remote_code)
    from mirrorbert.encoder.architectures import check_supported

    check_supported(config, name)
    try:
        tok = load_tokenizer(name, trust_remote_code=trust_remote_code)
        mlm = load_model(name, "AutoModelForMaskedLM", trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  damaged weights raise safetensors' own error type
        error = weights_load_error(name, exc)
        if error is None and not isinstance(exc, (OSError, ValueError)):
            raise
        raise error or UserError(f"--model {name}: cannot load a masked LM and its tokenizer ({first_line(exc)})") from None
    return tok, mlm


def save_parts(model, tokenizer, folder: Path) -> None:
    """Everything a resumed run needs: every encoder, not just the inference one."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.context.save_pretrained(folder / "context")
    tokenizer.save_pretrained(folder / "context")
    if model.context2 is not None:
        model.context2.save_pretrained(folder / "context2")
    save_file({k: v.detach().to("cpu").contiguous() for k, v in model.gloss_encoder.state_dict().items()},
              str(folder / GLOSS_ENCODER))


def load_parts(folder: Path, cfg: GlossPretrainConfig):
    from mirrorbert.gloss.model import GlossRegularizedMLM
    from mirrorbert.safeguards.model_loading import load_model, load_tokenizer

    option, trust = f"--resume {folder.parent}:", cfg.trust_remote_code
    ck = _checkpoint(folder)
    ck.subfolder(f"{folder.name}/context")  # the encoders' folders inside the checkpoint, never a link out
    tok = load_tokenizer(folder / "context", trust_remote_code=trust, option=option)
    model = GlossRegularizedMLM.from_mlm(load_model(folder / "context", "AutoModelForMaskedLM",
                                                    trust_remote_code=trust, option=option),
                                         arch=cfg.arch, lam=cfg.lam, tau=cfg.tau)
    if cfg.arch == "sc":
        if not ck.is_dir(f"{folder.name}/context2"):
            raise UserError(f"--resume {folder.parent}: checkpoint has no enc2 (was it written with --arch mt?)")
        ck.subfolder(f"{folder.name}/context2")
        model.context2 = load_model(folder / "context2", "AutoModelForMaskedLM", trust_remote_code=trust,
                                    option=option)
    model.gloss_encoder.load_state_dict(_gloss_encoder_state(folder))
    return tok, model


GLOSS_ENCODER = "gloss_encoder.safetensors"
LEGACY_GLOSS_ENCODER = "gloss_encoder.pt"  # older mirrorbert: a pickle, read with weights_only=True only


def _checkpoint(folder: Path):
    """The confined reader of the checkpoint holding the parts folder `folder` (`step-N/model`)."""
    from mirrorbert.training.checkpoints import checkpoint_folder

    return checkpoint_folder(folder.parent, f"--resume {folder.parent}:")


def _gloss_encoder_state(folder: Path) -> dict[str, Any]:
    """The gloss encoder's weights of a checkpoint: safetensors, or an older `.pt` read without running code;
    either only inside the checkpoint folder, a regular file."""
    import torch

    from mirrorbert.errors import first_line
    from mirrorbert.training.state_format import load_legacy_pt

    option, ck = f"--resume {folder.parent}", _checkpoint(folder)
    if ck.exists(f"{folder.name}/{GLOSS_ENCODER}"):
        from safetensors.torch import load_file

        real = ck.check_file(f"{folder.name}/{GLOSS_ENCODER}")
        try:
            return load_file(str(real), device="cpu")
        except Exception as exc:  # noqa: BLE001  safetensors raises its own error type
            raise UserError(f"{option}: {folder / GLOSS_ENCODER} cannot be read ({first_line(exc)})") from None
    if ck.exists(f"{folder.name}/{LEGACY_GLOSS_ENCODER}"):
        state = load_legacy_pt(ck.check_file(f"{folder.name}/{LEGACY_GLOSS_ENCODER}"), option,
                               shown=folder / LEGACY_GLOSS_ENCODER)
        if isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
            return state
        raise UserError(f"{option}: {folder / LEGACY_GLOSS_ENCODER} does not hold a gloss encoder's weights")
    raise UserError(f"{option}: checkpoint is incomplete: {folder / GLOSS_ENCODER} is missing")


def _cpu_state(module) -> dict[str, Any]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


# --------------------------------------------------------------------------- training
class GlossMethod:
    """GR-BERT for the engine: triplet batches of the epoch's order, held-out evaluation at every epoch end."""

    def __init__(self, cfg, model, tokenizer, train_t, held_t, train_enc, held_enc, inventory, masker, batch_size,
                 per_epoch, total_steps, gloss_length, optimizer, scheduler, scaler, device, fingerprint, ckpt_root,
                 checkpointing):
        from mirrorbert.reporting.metrics import MetricLogger

        self.cfg, self.model, self.tokenizer, self.train_t, self.held_t = cfg, model, tokenizer, train_t, held_t
        self.train_enc, self.held_enc, self.inventory, self.masker = train_enc, held_enc, inventory, masker
        self.batch_size, self.per_epoch, self.total_steps, self.gloss_length = batch_size, per_epoch, total_steps, gloss_length
        self.optimizer, self.scheduler, self.scaler, self.device = optimizer, scheduler, scaler, device
        self.fingerprint, self.ckpt_root, self.checkpointing = fingerprint, ckpt_root, checkpointing
        self.epoch, self.next_batch = 0, 0
        self.losses = LossRecord(per_epoch)  # the reported means (a window, the last epoch), through checkpoints
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.best_state: dict[str, Any] | None = None
        self.metrics = MetricLogger(cfg.log_dir)

    def batches(self):
        import torch

        from mirrorbert.runtime.randomness import derived_generator

        n = len(self.train_enc)
        while True:
            order = torch.randperm(n, generator=derived_generator(self.cfg.seed, STREAM_ORDER, self.epoch)).tolist()
            batches = [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)][:self.per_epoch]
            yield from batches[self.next_batch:]

    def train_step(self, index, engine) -> dict[str, str]:
        from mirrorbert.gloss.model import collate
        from mirrorbert.runtime.device import autocast
        from mirrorbert.training.optim import backward_and_step
        from mirrorbert.runtime.randomness import derived_generator

        cfg, step = self.cfg, engine.step
        batch = collate(
            [self.train_enc[i] for i in index], self.train_t, self.tokenizer,
            inventory=self.inventory if cfg.hard_negatives else None,
            rng=random.Random(cfg.seed * 1_000_003 + STREAM_HARD * 7919 + step),
            masker=self.masker, generator=derived_generator(cfg.seed, STREAM_MASK, step),
            max_gloss_length=self.gloss_length,
        ).to(self.device)
        with autocast(self.device, cfg.precision):
            out = self.model(batch)
        engine.check_finite(out.loss)
        backward_and_step(out.loss, self.optimizer, self.scheduler, self.scaler, self.model.parameters(),
                          cfg.max_grad_norm)
        self.next_batch += 1
        self.losses.add(float(out.loss.item()))
        self.metrics.log(step + 1, loss=self.losses.last, gr_loss=float(out.gr.item()), mlm_loss=float(out.mlm.item()),
                         batch_accuracy=out.accuracy, lr=self.scheduler.get_last_lr()[0])
        return {"loss": f"{self.losses.last:.3f}", "gr": f"{out.gr.item():.3f}", "mlm": f"{out.mlm.item():.3f}",
                "acc": f"{out.accuracy:.2f}"}

    def after_step(self, step: int) -> bool:
        if self.next_batch < self.per_epoch:
            return False
        self.epoch, self.next_batch = self.epoch + 1, 0
        self.losses.end_epoch()
        self.record_eval(self.epoch, step)
        return True  # a checkpoint at every epoch end (when checkpointing)

    def finish(self) -> None:
        self.losses.finish()
        if self.next_batch != 0:  # --steps ended mid-epoch: evaluate the final model too
            self.record_eval(self.epoch + 1, self.total_steps)

    def record_eval(self, tag_epoch: int, step: int) -> None:
        from mirrorbert.gloss.model import gloss_matching_accuracy
        from mirrorbert.runtime.device import autocast

        if not self.held_enc:
            return
        res = gloss_matching_accuracy(self.model, self.tokenizer, self.held_t, self.held_enc, device=self.device,
                                      batch_size=self.cfg.eval_batch_size, max_gloss_length=self.gloss_length,
                                      autocast_ctx=lambda: autocast(self.device, self.cfg.precision))
        if not res:
            return
        entry = {"epoch": tag_epoch, "step": step, **{k: round(float(v), 6) for k, v in res.items()}}
        self.history.append(entry)
        self.metrics.log(step, heldout_accuracy=res["accuracy"], heldout_accuracy_word=res["accuracy_word"])
        logger.info("epoch %d (step %d): held-out gloss-matching accuracy %.4f (within word %.4f, %d triplets)",
                    tag_epoch, step, res["accuracy"], res["accuracy_word"], int(res["n"]))
        if step > 0 and (self.best is None or res["accuracy"] > self.best["accuracy"]):
            self.best = {"epoch": tag_epoch, "step": step, "accuracy": entry["accuracy"],
                         "accuracy_word": entry["accuracy_word"]}
            self.best_state = _cpu_state(self.model.inference_model)
            if self.checkpointing:
                self.save_best_dir()

    def save_best_dir(self) -> None:
        """Keep the best model on disk too, so that a resumed run still knows it."""
        from mirrorbert.safeguards.writes import make_temporary, mark_folder, record_files, remove_tree

        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        mark_folder(self.ckpt_root)  # a later run over this folder needs --resume or --overwrite
        final = self.ckpt_root / "best-model"
        tmp = make_temporary(final, folder=True)
        self.model.save_inference(tmp, self.tokenizer)
        record_files(tmp, "best-model")  # what --overwrite may later prove it wrote
        remove_tree(final)  # a link there: only the link
        os.replace(tmp, final)

    def save_model(self, folder: Path) -> None:
        save_parts(self.model, self.tokenizer, folder)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "next_batch": self.next_batch, "history": self.history, "best": self.best,
                "losses": self.losses.state()}

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"data_sha256": self.fingerprint, "arch": self.cfg.arch, "config": self.cfg.to_dict()}


def pretrain(cfg: GlossPretrainConfig) -> GlossPretrainResult:
    """Run GR-BERT pre-training as configured and write the best model to ``cfg.output``."""
    import contextlib

    from mirrorbert.safeguards.writes import weights_size
    from mirrorbert.training.checkpoints import guard_training_run

    cfg.validate()
    with contextlib.ExitStack() as locks:  # path rules, writability and locks, before anything is loaded
        guard_training_run(locks, output=cfg.output, overwrite=cfg.overwrite,
                  inputs={"--model": cfg.model, "--triplets": cfg.triplets, "--data-dir": cfg.data_dir,
                          "--resume": cfg.resume},
                  checkpoint_dir=cfg.resolved_checkpoint_dir(), resuming=cfg.resume is not None,
                  extra_outputs=[("--log-dir", cfg.log_dir)], extra_files=[("--export-triplets", cfg.export_triplets)],
                  model_bytes=weights_size(cfg.model))
        return _pretrain(cfg)


def _run_info(cfg: GlossPretrainConfig, method: GlossMethod, stats, batch_size: int, warmup_steps: int,
              total_steps: int, step: int, wall: float, device) -> dict[str, Any]:
    """What the model folder's training-info file records about the run."""
    from mirrorbert.reporting.metrics import library_versions

    return {
        "method": "gr-bert",
        "arch": cfg.arch,
        "config": {**cfg.to_dict(), "batch_size": batch_size, "warmup_steps": warmup_steps, "total_steps": total_steps},
        "triplets": stats,
        "heldout_history": method.history,
        "best": method.best,
        "steps": step,
        **method.losses.fields(),  # final_loss (a window's mean, named), last_batch_loss, mean_loss_last_epoch
        "wall_time_s": round(wall, 2),
        "device": str(device),
        "precision": cfg.precision,
        "versions": library_versions(),
    }


def _load_resume(cfg: GlossPretrainConfig, fingerprint: str):
    """The checkpoint to resume from (None for a new run), refused when its options, triplets or arch differ."""
    from mirrorbert.training.checkpoints import check_resume_config, load_checkpoint

    if not cfg.resume:
        return None
    resume = load_checkpoint(cfg.resume)
    check_resume_config(resume.path, resume.meta.get("config"), cfg.to_dict(), RESUME_HARMLESS)
    if resume.meta.get("data_sha256") not in (None, fingerprint):
        raise UserError(f"--resume {resume.path}: the triplets differ from the run that wrote this checkpoint")
    if resume.meta.get("arch") not in (None, cfg.arch):
        raise UserError(f"--resume {resume.path}: checkpoint was written with --arch {resume.meta.get('arch')}")
    return resume


def _model_and_data(cfg: GlossPretrainConfig, resume, train_t, held_t, device):
    """The model (from the checkpoint when resuming), the encoded triplets and the optional MLM masker."""
    from mirrorbert.gloss.model import GlossRegularizedMLM, encode_triplets
    from mirrorbert.encoder.masked_lm import model_max_length

    if resume is not None:
        tokenizer, model = load_parts(resume.model_dir, cfg)
    else:
        tokenizer, mlm = load_start_model(cfg.model, cfg.trust_remote_code)
        model = GlossRegularizedMLM.from_mlm(mlm, arch=cfg.arch, lam=cfg.lam, tau=cfg.tau)
    model.to(device).train()
    max_length = min(cfg.max_length, model_max_length(model.context, tokenizer))
    gloss_length = min(cfg.max_gloss_length, model_max_length(model.context, tokenizer))
    train_enc = encode_triplets(tokenizer, train_t, max_length)
    held_enc = encode_triplets(tokenizer, held_t, max_length)
    if len(train_enc) < 2:
        raise UserError(f"only {len(train_enc)} usable training triplets: need at least 2")
    masker = None
    if cfg.mlm_prob > 0:
        from mirrorbert.mlm.masking import MaskingConfig, MlmMasker

        vocab = model.context.get_input_embeddings().weight.shape[0]
        masker = MlmMasker.from_tokenizer(tokenizer, MaskingConfig(mlm_probability=cfg.mlm_prob), vocab_size=vocab)
    return tokenizer, model, train_enc, held_enc, masker, gloss_length


def _restore(resume, engine, method: GlossMethod) -> None:
    """Optimiser, scheduler, scaler and RNG state, the position, the history and the best model so far."""
    from mirrorbert.training.checkpoints import restore_training_state

    extra = restore_training_state(resume, method.optimizer, method.scheduler, method.scaler)
    engine.step, method.epoch, method.next_batch = extra["step"], extra["epoch"], extra["next_batch"]
    method.history, method.best = extra.get("history", []), extra.get("best")
    method.losses.restore(extra, f"--resume {resume.path}")
    best_dir = method.ckpt_root / "best-model"
    if method.best is not None and best_dir.is_dir():
        from mirrorbert.safeguards.model_loading import load_model
        from mirrorbert.training.checkpoints import checkpoint_folder

        checkpoint_folder(method.ckpt_root, "--checkpoint-dir").subfolder("best-model")  # never a link out

        method.best_state = _cpu_state(load_model(best_dir, "AutoModelForMaskedLM", option=f"--resume {resume.path}:",
                                                  trust_remote_code=method.cfg.trust_remote_code))
    engine.last_checkpoint = resume.path
    logger.info("resumed from %s at step %d (epoch %d, batch %d)", resume.path, engine.step, method.epoch,
                method.next_batch)


def _pretrain(cfg: GlossPretrainConfig) -> GlossPretrainResult:
    from mirrorbert.training.checkpoints import CheckpointManager
    from mirrorbert.runtime.device import make_grad_scaler, resolve_device, resolve_precision
    from mirrorbert.training.engine import Engine
    from mirrorbert.training.optim import build_optimizer, build_scheduler
    from mirrorbert.runtime.randomness import seed_everything

    device = resolve_device(cfg.device)
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device))
    started = time.time()
    train_t, held_t, inventory, stats = prepare_triplets(cfg)
    fingerprint = _fingerprint(train_t)
    seed_everything(cfg.seed)

    resume = _load_resume(cfg, fingerprint)
    tokenizer, model, train_enc, held_enc, masker, gloss_length = _model_and_data(cfg, resume, train_t, held_t, device)
    from mirrorbert.encoder.architectures import prepare_model, usable_precision

    for part in (model.context, model.context2, model.gloss_encoder):
        if part is not None:
            prepare_model(part)
    cfg = replace(cfg, precision=usable_precision(model.context, cfg.precision))

    batch_size = min(cfg.batch_size, len(train_enc))
    n = len(train_enc)
    per_epoch = n // batch_size + (1 if n % batch_size >= 2 else 0)  # a trailing single triplet has no negatives
    total_steps = cfg.steps or cfg.epochs * per_epoch
    warmup_steps = int(round(cfg.warmup * total_steps))
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, "linear", warmup_steps, total_steps)
    scaler = make_grad_scaler(device, cfg.precision)
    ckpt_root = cfg.resolved_checkpoint_dir()
    checkpoints = CheckpointManager(ckpt_root, keep=cfg.keep_checkpoints)
    checkpointing = cfg.save_every > 0 or cfg.checkpoint_dir is not None or resume is not None

    method = GlossMethod(cfg, model, tokenizer, train_t, held_t, train_enc, held_enc, inventory, masker,
                         batch_size, per_epoch, total_steps, gloss_length, optimizer, scheduler, scaler, device,
                         fingerprint, ckpt_root, checkpointing)
    engine = Engine(method, total_steps=total_steps, checkpoints=checkpoints, save_every=cfg.save_every,
                    checkpointing=checkpointing, desc="gloss-pretrain", show_progress=cfg.show_progress)
    if resume is not None:
        _restore(resume, engine, method)
    try:
        if engine.step == 0 and not method.history:
            method.record_eval(0, 0)  # the starting point, for comparison
        outcome = engine.run()
    finally:
        method.metrics.close()
    wall = time.time() - started
    step, history, best, last_checkpoint = outcome.steps, method.history, method.best, outcome.checkpoint
    if outcome.interrupted:
        return GlossPretrainResult(None, step, history, best, stats, wall, interrupted=True, checkpoint=last_checkpoint,
                                   stop_signal=outcome.signal)

    final = model.inference_model
    if method.best_state is not None:
        final.load_state_dict(method.best_state)
        logger.info("keeping the best epoch: %s", best)
    info = _run_info(cfg, method, stats, batch_size, warmup_steps, total_steps, step, wall, device)
    final.eval()

    def write_into(folder: Path) -> None:
        final.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / TRAINING_INFO).write_text(jsonio.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")

    # with the best epoch's weights loaded, a new checkpoint would not be the last step's state
    engine.save_final(cfg.output, write_into, overwrite=cfg.overwrite, resumable=method.best_state is None)
    logger.info("GR-BERT model written to %s (%d steps)", cfg.output, step)
    return GlossPretrainResult(Path(cfg.output), step, history, best, stats, wall, checkpoint=last_checkpoint)


__all__ = ["GlossPretrainConfig", "GlossPretrainResult", "pretrain"]
