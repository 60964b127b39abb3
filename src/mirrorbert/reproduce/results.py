"""What a `mirrorbert reproduce` run is asked (`ReproduceConfig`) and what it gives (`CellResult`, `ReproduceResult`).

Shared by the runner, which fills them, and the report, which reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.reproduce.cells import PAPERS, Skipped

#: gloss-pretrain options the runner sets per cell (--seeds, the GR cells' arch, the paths), not --gr-option.
GR_OPTIONS_FIXED = {"model", "output", "data_dir", "overwrite", "device", "show_progress", "arch", "seed", "resume",
                    "checkpoint_dir", "log_dir", "export_triplets"}


@dataclass
class ReproduceConfig:
    model: str
    output: str
    data_dir: str | None = None
    paper: str = "mirror"
    experiments: list[str] | None = None  # None: every experiment of the paper(s)
    seeds: tuple[int, ...] = (0,)
    quick: bool = False
    device: str = "auto"
    eval_batch_size: int = 64
    train_options: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides for every Mirror cell
    gr_options: dict[str, Any] = field(default_factory=dict)  # GlossPretrainConfig overrides for the GR-BERT models
    keep_models: bool = False
    report_only: bool = False  # write the report from the cached cells; list the others as not run
    overwrite: bool = False  # discard an earlier run in `output` (only a folder mirrorbert wrote) and start over
    command: str = ""  # the command line, for the report
    trust_remote_code: bool = False  # --trust-remote-code (safeguards/model_loading.py)
    show_progress: bool = True  # the progress of each cell's training (a bar, or a line every 30 s off a terminal)

    def validate(self) -> list[str]:
        from mirrorbert.settings.typed import check_types

        check_types(self)
        if self.paper not in PAPERS:
            raise UserError(f"--paper: unknown paper {self.paper!r}; choose one of {', '.join(PAPERS)}")
        known = PAPERS["all"]
        chosen = list(self.experiments) if self.experiments else list(PAPERS[self.paper])
        unknown = [e for e in chosen if e not in known]
        if unknown:
            raise UserError(f"--experiments: unknown experiment(s) {', '.join(unknown)}; known: {', '.join(known)}")
        if not self.seeds:
            raise UserError("--seeds: give at least one seed")
        from mirrorbert.settings.seeds import SEED_RULE, seed_ok

        if any(not seed_ok(s) for s in self.seeds):
            raise UserError(f"--seeds {self.seeds!r}: every seed {SEED_RULE}")
        from mirrorbert.runtime.device import check_device_and_precision

        check_device_and_precision(self.device)
        bs = self.eval_batch_size
        if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
            raise UserError(f"--eval-batch-size {bs!r}: must be an integer >= 1")
        from mirrorbert.mirror.config import FIELD_NAMES, resolve_config

        bad = sorted(set(self.train_options) - FIELD_NAMES)
        if bad:
            raise UserError(f"--train-option: unknown option(s) {', '.join(bad)}")
        try:  # the values, through the same typed config as `mirrorbert train`
            resolve_config({"model": self.model, **self.train_options})
        except (UserError, TypeError) as exc:
            raise UserError(f"--train-option: {exc}") from None
        from mirrorbert.gloss.pretrain import GlossPretrainConfig

        # the runner sets these itself (per cell) or they would break the cache and the report
        gr_fields = {f.name for f in fields(GlossPretrainConfig)} - GR_OPTIONS_FIXED
        bad = sorted(set(self.gr_options) - gr_fields)
        if bad:
            raise UserError(f"--gr-option: unknown or runner-set option(s) {', '.join(bad)}")
        try:  # the values, before hours of work
            GlossPretrainConfig(model=self.model, output="-", **self.gr_options).validate()
        except (UserError, TypeError) as exc:
            raise UserError(f"--gr-option: {exc}") from None
        return chosen


@dataclass
class CellResult:
    cell: str
    experiment: str
    state: str
    seed: int | None
    config_hash: str
    metrics: dict[str, float]
    skipped: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    status: str = "ok"  # ok | skipped | error
    message: str = ""
    wall_s: float = 0.0
    commands: list[str] = field(default_factory=list)
    data: dict[str, str] = field(default_factory=dict)  # what -> sha256 fingerprint
    data_note: str = ""
    x: float | None = None
    versions: dict[str, str] = field(default_factory=dict)
    cached: bool = False
    est_s: float | None = None  # the estimate printed before the cell ran
    train_s: float = 0.0  # of wall_s, training the cell's model


@dataclass
class ReproduceResult:
    config: ReproduceConfig
    base_model: str | None
    results: list[CellResult]
    skipped: list[Skipped]
    computed: int
    wall_s: float
    report: Path | None = None

    @property
    def failed(self) -> list[CellResult]:
        """Cells that failed in this run (not cached; the next run tries them again)."""
        return [r for r in self.results if r.status == "error"]


__all__ = ["CellResult", "GR_OPTIONS_FIXED", "ReproduceConfig", "ReproduceResult"]
