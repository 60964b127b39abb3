"""GR-BERT pre-training: MLM + gloss regulariser on (word, sentence, gloss) triplets, through the one run lifecycle
(`training/run.py`): AdamW, linear warmup and decay, the held-out gloss-matching accuracy after every epoch and
the best epoch's model kept (`method.py`). The output is the inference MLM only (``mt``: the single encoder;
``sc``: enc2) as a Hugging Face ``*ForMaskedLM`` folder with its tokenizer, plus ``gr_training.json``.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.encoder.architectures import usable_precision
from mirrorbert.encoder.masked_lm import load_masked_lm, model_max_length
from mirrorbert.errors import UserError
from mirrorbert.gloss.config import GlossPretrainConfig
from mirrorbert.gloss.method import STREAM_ORDER, GlossData, GlossMethod
from mirrorbert.gloss.model import GlossRegularizedMLM, encode_triplets
from mirrorbert.gloss.parts import cpu_state, load_parts
from mirrorbert.gloss.triplets import load_triplets, split_holdout, triplet_stats, write_triplets_tsv
from mirrorbert.mlm.masking import MlmMasker
from mirrorbert.mlm.models import load_mlm
from mirrorbert.reporting.metrics import library_versions
from mirrorbert.training.checkpoints import checkpoint_folder
from mirrorbert.training.plan import contrastive_plan
from mirrorbert.training.run import GuardedPaths, Recipe, RunContext, run

logger = logging.getLogger(__name__)

STREAM_LIMIT = 14
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


def _fingerprint(triplets) -> str:
    h = hashlib.sha256()
    for t in triplets:
        h.update(f"{t.word}\t{t.sentence}\t{t.gloss}\t{t.start}\t{t.end}\n".encode("utf-8"))
    return h.hexdigest()


def prepare_triplets(cfg: GlossPretrainConfig):
    """Load triplets, optionally subsample (seeded), split off the held-out set."""
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


def pretrain(cfg: GlossPretrainConfig) -> GlossPretrainResult:
    """Run GR-BERT pre-training as configured and write the best model to ``cfg.output``."""
    cfg.validate()
    return run(GlossRecipe(cfg))


class GlossRecipe(Recipe):
    """GR-BERT's part of a run: the triplets, the model with its gloss encoder, the best epoch's saved MLM."""

    label = "gloss-pretrain"

    def guarded_paths(self) -> GuardedPaths:
        cfg = self.cfg
        return GuardedPaths(inputs={"--model": cfg.model, "--triplets": cfg.triplets, "--data-dir": cfg.data_dir,
                                    "--resume": cfg.resume},
                            extra_outputs=[("--log-dir", cfg.log_dir)],
                            extra_files=[("--export-triplets", cfg.export_triplets)], model=cfg.model)

    def read_data(self, run_ctx: RunContext) -> None:
        self.train_t, self.held_t, self.inventory, self.stats = prepare_triplets(self.cfg)
        self.fingerprint = _fingerprint(self.train_t)

    def check_resume(self, resume, run_ctx: RunContext) -> None:
        if resume.meta.get("data_sha256") not in (None, self.fingerprint):
            raise UserError(f"--resume {resume.path}: the triplets differ from the run that wrote this checkpoint")
        if resume.meta.get("arch") not in (None, self.cfg.arch):
            raise UserError(f"--resume {resume.path}: checkpoint was written with --arch {resume.meta.get('arch')}")

    def build(self, run_ctx: RunContext) -> GlossMethod:
        cfg = self.cfg
        tokenizer, model, data = self._model_and_data(run_ctx)
        run_ctx.precision = usable_precision(model.context, run_ctx.precision, run_ctx.device)
        plan = contrastive_plan(len(data.train_enc), cfg.batch_size, cfg.seed, STREAM_ORDER, cfg.steps, cfg.epochs)
        return GlossMethod(cfg, model, tokenizer, data, plan, run_ctx)

    def _model_and_data(self, run_ctx: RunContext):
        """The model (from the checkpoint when resuming), the encoded triplets and the optional MLM masker."""
        cfg = self.cfg
        if run_ctx.resume is not None:
            tokenizer, model = load_parts(run_ctx.resume.model_dir, cfg)
        else:
            tokenizer, mlm = load_masked_lm(cfg.model, cfg.trust_remote_code)
            model = GlossRegularizedMLM.from_mlm(mlm, arch=cfg.arch, lam=cfg.lam, tau=cfg.tau)
        model.to(run_ctx.device).train()
        positions = model_max_length(model.context, tokenizer)
        max_length, gloss_length = min(cfg.max_length, positions), min(cfg.max_gloss_length, positions)
        train_enc = encode_triplets(tokenizer, self.train_t, max_length)
        held_enc = encode_triplets(tokenizer, self.held_t, max_length)
        if len(train_enc) < 2:
            raise UserError(f"only {len(train_enc)} usable training triplets: need at least 2")
        masker = None
        if cfg.mlm_prob > 0:
            vocab = model.context.get_input_embeddings().weight.shape[0]
            masker = MlmMasker.from_tokenizer(tokenizer, probability=cfg.mlm_prob, vocab_size=vocab)
        return tokenizer, model, GlossData(self.train_t, self.held_t, train_enc, held_enc, self.inventory, masker,
                                           gloss_length, self.fingerprint)

    def restore(self, method: GlossMethod, extra: dict[str, Any], resume) -> None:
        """The position, the history and the best model so far."""
        method.epoch, method.next_batch = extra["epoch"], extra["next_batch"]
        method.history, method.best = extra.get("history", []), extra.get("best")
        method.losses.restore(extra, f"--resume {resume.path}")
        best_dir = method.ckpt_root / "best-model"
        if method.best is not None and best_dir.is_dir():
            best = checkpoint_folder(method.ckpt_root, "--checkpoint-dir").subfolder("best-model")  # never a link out
            method.best_state = cpu_state(load_mlm(str(best.root), f"--resume {resume.path}:",
                                                   self.cfg.trust_remote_code))

    def before_run(self, method: GlossMethod, engine) -> None:
        if engine.step == 0 and not method.history:
            method.record_eval(0, 0)  # the starting point, for comparison

    def close(self, method: GlossMethod) -> None:
        method.metrics.close()

    def stopped(self, method: GlossMethod, outcome, run_ctx: RunContext) -> GlossPretrainResult:
        return GlossPretrainResult(None, outcome.steps, method.history, method.best, self.stats, run_ctx.wall(),
                                   interrupted=True, checkpoint=outcome.checkpoint, stop_signal=outcome.signal)

    def finish(self, method: GlossMethod, outcome, engine, run_ctx: RunContext) -> GlossPretrainResult:
        cfg, wall, final = self.cfg, run_ctx.wall(), method.model.inference_model
        if method.best_state is not None:
            final.load_state_dict(method.best_state)
            logger.info("keeping the best epoch: %s", method.best)
        info = _run_info(self, method, outcome.steps, wall)
        final.eval()

        def write_into(folder: Path) -> None:
            final.save_pretrained(folder)
            method.tokenizer.save_pretrained(folder)
            (folder / TRAINING_INFO).write_text(jsonio.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")

        # with the best epoch's weights loaded, a new checkpoint would not be the last step's state
        engine.save_final(cfg.output, write_into, overwrite=cfg.overwrite, resumable=method.best_state is None)
        logger.info("GR-BERT model written to %s (%d steps)", cfg.output, outcome.steps)
        return GlossPretrainResult(Path(cfg.output), outcome.steps, method.history, method.best, self.stats, wall,
                                   checkpoint=outcome.checkpoint)


def _run_info(recipe: GlossRecipe, method: GlossMethod, step: int, wall: float) -> dict[str, Any]:
    """What the model folder's training-info file records about the run."""
    cfg, plan = recipe.cfg, method.plan
    return {
        "method": "gr-bert",
        "arch": cfg.arch,
        "config": {**cfg.to_dict(), "batch_size": plan.batch_size, "warmup_steps": method.warmup_steps,
                   "total_steps": plan.total_steps},
        "triplets": recipe.stats,
        "heldout_history": method.history,
        "best": method.best,
        "steps": step,
        **method.losses.fields(),  # final_loss (a window's mean, named), last_batch_loss, mean_loss_last_epoch
        "wall_time_s": round(wall, 2),
        "device": str(method.device),
        "precision": method.precision,
        "versions": library_versions(),
    }


__all__ = ["GlossPretrainConfig", "GlossPretrainResult", "pretrain"]
