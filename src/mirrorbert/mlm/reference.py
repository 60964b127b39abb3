"""The quickstart's offline fallback: where the default model cannot be downloaded, a small BERT pre-trained here
from scratch on the offline reference corpus (`scripts/build_reference_corpus.py`) within a time budget: a few
calibration steps measure tokens/s, and the run gets the tokens that fit in what is left. The model is cached
under the work folder. The command line is `mirrorbert.cli.reference_mlm`.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes import remove_tree

logger = logging.getLogger(__name__)

DEFAULT_GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
TOKENIZER = "tokenizers/bert-base-uncased"


@dataclass
class ReferencePlan:
    """How the fallback MLM is pre-trained (the settings of scripts/train_reference_mlm.sh, time-bounded)."""

    architecture: str = "bert-mini"
    budget_s: float = 600.0  # corpus + calibration + pre-training
    threads: int | None = 2
    batch_size: int = 64
    seq_length: int = 128
    lr: float = 1e-3
    calibration_steps: int = 4
    min_steps: int = 8
    device: str = "auto"


def model_dir(work: Path, plan: ReferencePlan) -> Path:
    return Path(work) / f"{plan.architecture}-{int(plan.budget_s)}s"


def script_corpus_builder(script: Path, data_dir: Path) -> Callable[[Path], None]:
    """Build the corpus with scripts/build_reference_corpus.py (without GCIDE where it is not installed)."""

    def build(corpus: Path) -> None:
        cmd = [sys.executable, str(script), "--data-dir", str(data_dir), "--output", str(corpus)]
        if not DEFAULT_GCIDE.is_file():
            logger.info("GCIDE (Debian package dict-gcide) is not installed: the corpus is built without it")
            cmd.append("--skip-gcide")
        corpus.parent.mkdir(parents=True, exist_ok=True)
        logger.info("building the offline reference corpus %s", corpus)
        # its table goes to stdout (the last line names a failure), its progress and errors to our stderr
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise UserError(f"building the reference corpus failed (exit status {done.returncode}; its error is "
                            f"on stderr above): {done.stdout.strip().splitlines()[-1:]}")

    return build


def ensure_reference_mlm(work: Path, data_dir: Path, build_corpus: Callable[[Path], None],
                         plan: ReferencePlan | None = None) -> Path:
    """The cached reference MLM under ``work``, pre-training it within ``plan.budget_s`` first if absent."""
    from mirrorbert.mlm.pretrain import PretrainConfig, pretrain

    plan = plan or ReferencePlan()
    out = model_dir(work, plan)
    if (out / "config.json").is_file():
        logger.info("reusing the reference MLM %s", out)
        return out
    tokenizer = Path(data_dir) / TOKENIZER
    if not tokenizer.is_dir():
        raise UserError(f"reference MLM: tokenizer not found at {tokenizer} (the data directory's {TOKENIZER})")
    start = time.monotonic()
    work = Path(work)
    corpus = work / "corpus.txt"
    if not corpus.is_file():
        build_corpus(corpus)
    common = dict(corpus=[str(corpus)], architecture=plan.architecture, tokenizer=str(tokenizer),
                  batch_size=plan.batch_size, seq_length=plan.seq_length, lr=plan.lr, threads=plan.threads,
                  cache_dir=str(work / "cache"), device=plan.device, show_progress=True, eval_every=10**9, seed=0,
                  overwrite=True)
    step_tokens = plan.batch_size * plan.seq_length
    calibration = work / "calibration"
    # the calibration run also fills the token cache the real run reuses
    cal = pretrain(PretrainConfig(output=str(calibration), max_tokens=step_tokens * plan.calibration_steps, **common))
    remove_tree(calibration)
    rate = max(cal.tokens_per_s, 1.0)
    left = plan.budget_s - (time.monotonic() - start)
    max_tokens = max(step_tokens * plan.min_steps, int(rate * left))
    logger.info("reference MLM: %.0f tokens/s measured; %.0f s left of the budget -> %d tokens (%d steps)", rate, left,
                max_tokens, -(-max_tokens // step_tokens))
    result = pretrain(PretrainConfig(output=str(out), max_tokens=max_tokens, **common))
    (out / "quickstart_reference.json").write_text(jsonio.dumps(
        {"plan": asdict(plan), "calibration_tokens_per_s": rate, "max_tokens": max_tokens, "steps": result.steps,
         "eval_loss": result.eval_loss, "eval_accuracy": result.eval_accuracy,
         "wall_time_s": round(time.monotonic() - start, 1)}, indent=2) + "\n", encoding="utf-8")
    return out


def model_or_fallback(model: str, work: Path, data_dir: Path, build_corpus: Callable[[Path], None],
                      plan: ReferencePlan | None = None, say: Callable[[str], None] = print) -> str:
    """``model`` if it can be loaded here, else (in one line of ``say``) the offline reference MLM."""
    from mirrorbert.safeguards.preflight import check_model_reachable

    try:
        check_model_reachable(model)
        return model
    except UserError:
        plan = plan or ReferencePlan()
        folder = model_dir(work, plan)
        cached = (folder / "config.json").is_file()
        say(f"quickstart: {model} cannot be downloaded here (Hugging Face hub unreachable); using the offline "
            f"reference MLM {folder} instead ({'cached' if cached else f'a {plan.architecture} pre-trained now on the offline corpus, about {plan.budget_s / 60:.0f} min'})")
        return str(ensure_reference_mlm(work, data_dir, build_corpus, plan))
