"""Training configuration: one typed dataclass, the paper's presets, config files and overrides.

Precedence (lowest to highest): dataclass defaults < preset < config file < command-line options.
Everything is validated once, here, so the rest of the code can trust the values.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError, first_line
from mirrorbert.settings.choices import (DEFAULT_MODEL, LOSSES, MASK_UNITS, PACKING_MODES, POOLINGS, PRECISIONS,
                                         SCHEDULES)
from mirrorbert.settings.fields import (command_line_only_names, field_defaults, fill_presets, option,
                                        preset_names)
from mirrorbert.settings.run_options import RunOptions
from mirrorbert.settings.seeds import SEED_RULE, seed_ok
from mirrorbert.settings.typed import check_finite_numbers, check_types, coerce_mapping

# The paper's settings (Liu et al. 2021, section 3 and appendix). `pooling: None` in the sentence
# preset means "mean for BERT-family models, [CLS] otherwise", resolved once the model type is known.
PRESETS: dict[str, dict[str, Any]] = {
    "word": {"temperature": 0.2, "mask_span": 0, "epochs": 2, "max_length": 25, "pooling": "cls"},
    "phrase": {"temperature": 0.04, "mask_span": 2, "mask_unit": "char", "epochs": 2, "max_length": 25, "pooling": "cls"},
    "sentence": {"temperature": 0.04, "mask_span": 5, "mask_unit": "char", "epochs": 1, "max_length": 50, "pooling": None},
}
# Model types whose sentence-level Mirror-BERT uses mean pooling in the paper's appendix.
MEAN_POOLING_SENTENCE_MODEL_TYPES = ("bert",)


@dataclass(kw_only=True)
class TrainConfig(RunOptions):
    """Every knob of a Mirror-BERT run; each field is the long CLI option of the same name (`_` -> `-`), declared
    once with its help and facts (settings/fields.py); the bookkeeping ones come from `RunOptions`.

    Fields as keywords; `preset` fills every preset field not given explicitly. Every value is checked when
    the config is made and whenever a field is set afterwards: a bad one raises UserError (a ValueError)
    naming the option, so code that receives a TrainConfig can trust it.
    """

    # what to train
    model: str = option(DEFAULT_MODEL, shared="model", note="the masked LM to start from", group="output",
                        resume_safe=True)
    preset: str | None = option(None, help="paper settings: " + " | ".join(PRESETS), group="output", card=True)
    # training strings
    data: str | None = option(None, help="strings: .txt (one per line), .csv/.tsv/.parquet/.arrow or a saved "
                                         "datasets folder (with --column), .jsonl (with --field)", group="data",
                              resume_safe=True)
    column: str | None = option(None, shared="column", group="data", resume_safe=True)
    field: str | None = option(None, shared="field", group="data", resume_safe=True)
    words_top: int | None = option(None, help="train on the N most frequent words of --lang (wordfreq)", group="data",
                                   resume_safe=True)
    lang: str = option("en", help="language of --words-top", group="data", resume_safe=True)
    random_strings: int | None = option(None, help="train on N random letter/digit strings (zero-semantics control)",
                                        group="data", resume_safe=True)
    limit: int | None = option(None, shared="limit", note="a random sample of the strings (seeded)", group="data",
                               resume_safe=True)
    skip_bad_lines: bool = option(False, shared="skip_bad_lines", group="data", resume_safe=True)
    # the method; fidelity to the authors' code: the unit of --mask-span (characters, as the paper's runs, or
    # tokens), the shortest string masked in char mode, and the loss (InfoNCE or SapBERT's multi-similarity)
    temperature: float = option(0.04, help="InfoNCE temperature tau", group="method", preset=True, card=True)
    loss: str = option("infonce", help="infonce (paper eq. 1) | ms (multi-similarity loss with online triplet "
                                       "mining, as SapBERT)", group="method", card=True)
    mask_span: int = option(0, help="mask a span of K units (--mask-unit) in the second view; 0: off",
                            group="method", preset=True, card=True)
    mask_unit: str = option("char", help="char (the authors' code: K characters become one mask token) | token "
                                         "(our variant: K tokens become K mask tokens)", group="method",
                            preset=True, card=True)
    mask_min_chars: int = option(30, help="char unit: strings of N characters or fewer stay unmasked",
                                 group="method", card=True)
    dropout: float = option(0.1, help="dropout probability (hidden, attention, embeddings)", group="method",
                            card=True)
    drophead: float = option(0.0, help="probability of dropping a whole attention head per example",
                             group="method", card=True)
    controlled_dropout: bool = option(False, help="identical dropout masks for both views (ablation)",
                                      group="method", card=True)
    # None (the sentence preset): mean for BERT-family models, [CLS] otherwise, resolved once the model type is known
    pooling: str | None = option("cls", shared="pooling", unset="mean (BERT models) or cls (others)",
                                 group="method", preset=True, card=True)
    max_length: int = option(50, shared="max_length", group="method", preset=True, card=True)
    # optimisation
    lr: float = option(2e-5, shared="lr", group="optimisation", card=True)
    weight_decay: float = option(0.01, shared="weight_decay", group="optimisation", card=True)
    schedule: str = option("constant", help="constant (paper) | linear (decay to 0 after warmup)",
                           group="optimisation", card=True)
    warmup_steps: int = option(0, shared="warmup_steps", group="optimisation", card=True)
    max_grad_norm: float | None = option(None, shared="max_grad_norm", group="optimisation", card=True)
    batch_size: int = option(200, shared="batch_size", note="strings per step, 2 views each", group="optimisation",
                             card=True)
    epochs: int = option(1, shared="epochs", group="optimisation", preset=True, card=True, resume_safe=True)
    steps: int | None = option(None, shared="steps", group="optimisation", card=True, resume_safe=True)
    # speed and memory: packed rows, length groups or padding (encoder/packing.py; no argparse choices: this
    # config checks the value, a --config file's too), torch.compile, activation checkpointing, GradCache chunks
    packing: str = option("auto", shared="packing", group="hardware")
    compile: bool = option(False, help="torch.compile the model; falls back to eager with a warning if it fails",
                           group="hardware")
    gradient_checkpointing: bool = option(False, help="recompute activations in backward: less memory, ~30% more "
                                                      "time", group="hardware")
    grad_cache_chunk: int | None = option(None, help="GradCache: run the encoder N views at a time with cached "
                                                     "embedding gradients, so big batches fit in small memory with "
                                                     "every in-batch negative kept; 0: off", unset="off",
                                          group="hardware")
    # model card: evaluate the trained model before saving (scores go into mirrorbert.json and README.md)
    eval_after: str | None = option(None, help="comma-separated eval tasks (e.g. sts,wordsim) run on the trained "
                                               "model before saving; scores go into mirrorbert.json and README.md",
                                    group="eval", resume_safe=True)
    data_dir: str | None = option(None, shared="data_dir", note="the evaluation sets of --eval-after", group="eval",
                                  resume_safe=True)

    def __post_init__(self) -> None:
        fill_presets(self, PRESETS.get(self.preset, {}) if isinstance(self.preset, str) else {})
        validate(self)
        object.__setattr__(self, "_checked", True)

    def __setattr__(self, key: str, value: Any) -> None:
        if not getattr(self, "_checked", False):  # the dataclass __init__ filling the fields
            object.__setattr__(self, key, value)
            return
        before = getattr(self, key)
        object.__setattr__(self, key, value)
        try:
            validate(self)
        except UserError:
            object.__setattr__(self, key, before)
            raise


FIELD_NAMES = {f.name for f in dataclasses.fields(TrainConfig)}
# What the preset fields are without a preset.
UNPRESET_DEFAULTS: dict[str, Any] = {name: field_defaults(TrainConfig)[name] for name in preset_names(TrainConfig)}


def option_name(key: str) -> str:
    return "--" + key.replace("_", "-")


# Options a config file may not set: permission to run code from the model is the user's own decision.
COMMAND_LINE_ONLY = command_line_only_names(TrainConfig)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping whose keys are TrainConfig fields (dashes or underscores)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--config {path}: not valid UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # both parsers raise many types; the message is what matters
        raise UserError(f"--config {path}: cannot parse: {first_line(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of option names to values")
    out = {}
    for key, value in data.items():
        norm = str(key).replace("-", "_")
        if norm not in FIELD_NAMES:
            raise UserError(f"--config {path}: unknown option {key!r}")
        if norm in COMMAND_LINE_ONLY:
            raise UserError(f"--config {path}: {key!r} is not taken from a file (a shared file must not be able to "
                            f"run code); give --{norm.replace('_', '-')} on the command line")
        out[norm] = value
    return coerce_mapping(TrainConfig, out, f"--config {path}")


def resolve_config(
    overrides: dict[str, Any] | None = None, config_file: str | Path | None = None
) -> TrainConfig:
    """Merge defaults, preset, file and explicit overrides (None values in overrides mean 'not given')."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(overrides) - FIELD_NAMES
    if unknown:
        raise UserError(f"unknown option(s): {', '.join(sorted(option_name(k) for k in unknown))}")
    from_file = load_config_file(config_file) if config_file else {}
    preset = overrides.get("preset", from_file.get("preset"))
    if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
        raise UserError(f"--preset: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    # a file's values win over the preset, explicit overrides over both; TrainConfig applies the preset
    # and checks every value
    return TrainConfig(**{**from_file, **overrides})


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise UserError(f"{option_name(key)}: {message}")


# Text-valued fields (None allowed where the default is None); a list or number there is a typo.
TEXT_FIELDS = ("model", "output", "preset", "data", "column", "field", "lang", "pooling", "schedule", "device",
               "precision", "checkpoint_dir", "resume", "log_dir")


def validate(cfg: TrainConfig) -> None:
    """Every rule of every field; TrainConfig runs it when made and when a field is set."""
    check_types(cfg)
    for key in TEXT_FIELDS:  # first, so the checks below may compare strings safely
        value = getattr(cfg, key)
        _check(value is None or isinstance(value, str), key, f"expected text, got {type(value).__name__} {value!r}")
    _check(isinstance(cfg.model, str) and bool(cfg.model.strip()), "model", "must not be empty")
    _check(isinstance(cfg.lang, str) and bool(cfg.lang.strip()), "lang", "expected a language tag such as en, fr or zh")
    _check(cfg.preset is None or cfg.preset in PRESETS, "preset", f"unknown preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}")
    _check(cfg.pooling is None or cfg.pooling in POOLINGS, "pooling", f"unknown pooling {cfg.pooling!r}; choose one of {', '.join(POOLINGS)}")
    _check(cfg.precision in PRECISIONS, "precision", f"unknown precision {cfg.precision!r}; choose one of {', '.join(PRECISIONS)}")
    _check(cfg.packing in PACKING_MODES, "packing", f"unknown mode {cfg.packing!r}; choose one of {', '.join(PACKING_MODES)}")
    _check(cfg.schedule in SCHEDULES, "schedule", f"unknown schedule {cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    _check(_is_number(cfg.temperature) and math.isfinite(cfg.temperature) and cfg.temperature > 0, "temperature",
           "must be a positive finite number")
    _check(_is_int(cfg.mask_span) and cfg.mask_span >= 0, "mask_span", "must be an integer >= 0")
    _check(cfg.mask_unit in MASK_UNITS, "mask_unit", f"unknown unit {cfg.mask_unit!r}; choose one of {', '.join(MASK_UNITS)}")
    _check(_is_int(cfg.mask_min_chars) and cfg.mask_min_chars >= 0, "mask_min_chars", "must be an integer >= 0")
    _check(cfg.loss in LOSSES, "loss", f"unknown loss {cfg.loss!r}; choose one of {', '.join(LOSSES)}")
    for key in ("dropout", "drophead"):
        value = getattr(cfg, key)
        _check(_is_number(value) and 0 <= value < 1, key, "must be in [0, 1)")
    _check(_is_number(cfg.lr) and cfg.lr > 0, "lr", "must be a positive number")
    _check(_is_number(cfg.weight_decay) and cfg.weight_decay >= 0, "weight_decay", "must be >= 0")
    _check(cfg.max_grad_norm is None or (_is_number(cfg.max_grad_norm) and cfg.max_grad_norm > 0), "max_grad_norm", "must be a positive number")
    for key in ("batch_size", "epochs", "max_length", "keep_checkpoints", "log_every"):
        _check(_is_int(getattr(cfg, key)) and getattr(cfg, key) >= 1, key, "must be an integer >= 1")
    _check(cfg.batch_size >= 2, "batch_size", "must be at least 2 (the loss needs in-batch negatives)")
    _check(cfg.max_length >= 3, "max_length", "must be at least 3 (special tokens plus one token)")
    for key in ("steps", "limit", "words_top", "random_strings"):
        value = getattr(cfg, key)
        _check(value is None or (_is_int(value) and value >= 1), key, "must be an integer >= 1")
    for key in ("warmup_steps", "save_every"):
        _check(_is_int(getattr(cfg, key)) and getattr(cfg, key) >= 0, key, "must be an integer >= 0")
    _check(seed_ok(cfg.seed), "seed", SEED_RULE)
    _check(cfg.threads is None or (_is_int(cfg.threads) and cfg.threads >= 1), "threads", "must be an integer >= 1")
    _check(cfg.grad_cache_chunk is None or (_is_int(cfg.grad_cache_chunk) and cfg.grad_cache_chunk >= 0),
           "grad_cache_chunk", "must be an integer >= 0 (0: off)")
    _check(not (cfg.grad_cache_chunk and cfg.controlled_dropout), "grad_cache_chunk",
           "cannot be combined with --controlled-dropout (its two views must run as paired passes)")
    sources = [cfg.data is not None, cfg.words_top is not None, cfg.random_strings is not None]
    _check(sum(sources) <= 1, "data", "give only one of --data, --words-top, --random-strings")
    _check(not (cfg.column and cfg.field), "column", "--column is for CSV/TSV/Parquet/Arrow, --field for JSONL; not both")
    check_finite_numbers(cfg)  # last: the checks above give their own messages for nan/inf where they apply


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def resolve_pooling(cfg_pooling: str | None, model_type: str) -> str:
    """The sentence preset leaves pooling open: mean for BERT-family models, [CLS] for the others."""
    if cfg_pooling is not None:
        return cfg_pooling
    return "mean" if model_type in MEAN_POOLING_SENTENCE_MODEL_TYPES else "cls"
