"""What a `mirrorbert reproduce` run is asked (`ReproduceConfig`) and what it gives (`CellResult`, `ReproduceResult`).

Shared by the runner, which fills them, and the report, which reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.reproduce.cells import PAPERS, Skipped
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options

#: gloss-pretrain options the runner sets per cell (--seeds, the GR cells' arch, the paths), not --gr-option.
GR_OPTIONS_FIXED = {"model", "output", "data_dir", "overwrite", "device", "show_progress", "arch", "seed", "resume",
                    "checkpoint_dir", "log_dir", "export_triplets"}


@dataclass(kw_only=True)
class ReproduceConfig(Options):
    """Options of `mirrorbert reproduce`: each field but `command` is its CLI option (settings/fields.py)."""

    model: str | None = option(None, shared="model", note="the base masked LM", required=True)
    output: str | None = option(None, shared="output", note="a folder for report.md, results.json, plots/, cells/ "
                                                            "(the cache)", required=True)
    data_dir: str | None = option(None, shared="data_dir", note="evaluation and training data")
    paper: str = option("mirror", help="which paper's experiments", choices=tuple(sorted(PAPERS)))
    experiments: list[str] | None = option(None, help="comma list of experiments (default: all of --paper): "
                                                      + ", ".join(PAPERS["all"]), choices=PAPERS["all"],
                                           metavar="EXPERIMENTS")
    seeds: tuple[int, ...] = option((0,), shared="seeds")
    quick: bool = option(False, help="smoke test: few strings, few steps, small evaluation limits")
    train_options: dict[str, Any] = option(help="override a `mirrorbert train` option in every Mirror cell, e.g. "
                                                "lr=5e-5 (repeatable; default none)", default_factory=dict,
                                           flag="--train-option", metavar="KEY=VALUE")
    gr_options: dict[str, Any] = option(help="override a `mirrorbert gloss-pretrain` option of the GR-BERT models, "
                                             "e.g. epochs=1 (repeatable; default none: gloss-pretrain's defaults)",
                                        default_factory=dict, flag="--gr-option", metavar="KEY=VALUE")
    device: str = option("auto", shared="device")
    eval_batch_size: int = option(64, shared="eval_batch_size")
    show_progress: bool = option(True, shared="no_progress", note="no progress of the cells' training",
                                 flag="--no-progress")
    report_only: bool = option(False, help="compute nothing: write the report from the cells already cached in "
                                           "OUTPUT, listing the others as not run (e.g. while a long run is still "
                                           "going, or after stopping one)")
    overwrite: bool = option(False, shared="overwrite", note="discard what an earlier run left in OUTPUT (its cache "
                                                             "included) and start over; default: continue an earlier "
                                                             "reproduce run in OUTPUT")
    keep_models: bool = option(False, help="keep the trained models in OUTPUT/models (default: delete each once its "
                                           "cells are done)")
    trust_remote_code: bool = option(False, shared="trust_remote_code")
    command: str = ""  # the command line, for the report

    def rules(self) -> None:
        """--train-option and --gr-option values through the same typed configs as the commands they set."""
        from mirrorbert.gloss.pretrain import GlossPretrainConfig
        from mirrorbert.mirror.config import FIELD_NAMES, resolve_config

        self._overrides("train_options", FIELD_NAMES, "unknown option(s)",
                        lambda: resolve_config({"model": self.model, **self.train_options}))
        gr_fields = {f.name for f in fields(GlossPretrainConfig)} - GR_OPTIONS_FIXED
        self._overrides("gr_options", gr_fields, "unknown or runner-set option(s)",
                        lambda: GlossPretrainConfig(model=self.model or "-", output="-", **self.gr_options))

    def _overrides(self, name: str, known: set[str], unknown: str, build: Callable[[], Any]) -> None:
        """The overrides in field ``name``: every key among ``known``, the values accepted by ``build``."""
        bad = sorted(set(getattr(self, name)) - set(known))
        if bad:
            raise UserError(f"{self.say(name)}: {unknown} {', '.join(bad)}")
        try:
            build()
        except (UserError, TypeError) as exc:
            raise UserError(f"{self.say(name)}: {exc}") from None

    def validate(self) -> list[str]:
        """Ready to run (the device too); the experiments to run."""
        from mirrorbert.runtime.device import check_device_and_precision

        super().validate()
        check_device_and_precision(self.device)
        return list(self.experiments) if self.experiments else list(PAPERS[self.paper])


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
