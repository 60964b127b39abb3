"""Training configuration: one typed dataclass, the paper's presets, config files and overrides
(defaults < preset < config file < command-line options)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError, first_line
from mirrorbert.settings.choices import DEFAULT_MODEL, LOSSES, MASK_UNITS, SCHEDULES
from mirrorbert.settings.fields import FROM_PRESET, field_defaults, fill_presets, names_with, option, option_fields
from mirrorbert.settings.option_help import COUNT
from mirrorbert.settings.run_options import RunOptions
from mirrorbert.settings.typed import coerce_mapping

# The paper's settings (Liu et al. 2021, section 3 and appendix); `pooling: None`: by model type (resolve_pooling).
PRESETS: dict[str, dict[str, Any]] = {
    "word": {"temperature": 0.2, "mask_span": 0, "epochs": 2, "max_length": 25, "pooling": "cls"},
    "phrase": {"temperature": 0.04, "mask_span": 2, "mask_unit": "char", "epochs": 2, "max_length": 25, "pooling": "cls"},
    "sentence": {"temperature": 0.04, "mask_span": 5, "mask_unit": "char", "epochs": 1, "max_length": 50, "pooling": None},
}
MEAN_POOLING_SENTENCE_MODEL_TYPES = ("bert",)  # mean pooling at sentence level in the paper's appendix


@dataclass(kw_only=True)
class TrainConfig(RunOptions):
    """Every option of a Mirror-BERT run (the bookkeeping ones from `RunOptions`), checked when made and whenever a
    field is set (UserError naming the option); `preset` fills every preset field not given. `pooling_given`:
    pooling was given (made with it or set since), so it wins over a start model's own."""

    model: str = option(DEFAULT_MODEL, shared="model", note="the masked LM to start from", group="output",
                        resume_safe=True)
    preset: str | None = option(None, help="paper settings: " + " | ".join(PRESETS), choices=tuple(PRESETS),
                                group="output", card=True)
    data: str | None = option(None, help="strings: .txt (one per line), .csv/.tsv/.parquet/.arrow or a saved "
                                         "datasets folder (with --column), .jsonl (with --field)", group="data",
                              excludes=("words_top", "random_strings"), resume_safe=True)
    column: str | None = option(None, shared="column", group="data", excludes=("field",), resume_safe=True)
    field: str | None = option(None, shared="field", group="data", resume_safe=True)
    header: bool = option(True, shared="no_header", flag="--no-header", group="data", resume_safe=True)
    words_top: int | None = option(None, help="train on the N most frequent words of --lang (wordfreq)", range=COUNT,
                                   group="data", excludes=("random_strings",), resume_safe=True)
    lang: str = option("en", help="language of --words-top", group="data", resume_safe=True)
    random_strings: int | None = option(None, help="train on N random letter/digit strings (zero-semantics control)",
                                        range=COUNT, group="data", resume_safe=True)
    limit: int | None = option(None, shared="limit", note="a random sample of the strings (seeded)", group="data",
                               resume_safe=True)
    skip_bad_lines: bool = option(False, shared="skip_bad_lines", group="data", resume_safe=True)
    temperature: float = option(0.04, help="InfoNCE temperature tau", range="(0, inf)", group="method", preset=True,
                                card=True)
    loss: str = option("infonce", help="infonce (paper eq. 1) | ms (multi-similarity loss with online triplet "
                                       "mining, as SapBERT)", choices=LOSSES, group="method", card=True)
    mask_span: int = option(0, help="mask a span of K units (--mask-unit) in the second view; 0: off",
                            range="[0, inf)", group="method", preset=True, card=True)
    mask_unit: str = option("char", help="char (the authors' code: K characters become one mask token) | token "
                                         "(our variant: K tokens become K mask tokens)", choices=MASK_UNITS,
                            group="method", preset=True, card=True)
    mask_min_chars: int = option(30, help="char unit: strings of N characters or fewer stay unmasked",
                                 range="[0, inf)", group="method", card=True)
    dropout: float = option(0.1, help="dropout probability (hidden, attention, embeddings)", range="[0, 1)",
                            group="method", card=True)
    drophead: float = option(0.0, help="probability of dropping a whole attention head per example",
                             range="[0, 1)", group="method", card=True)
    controlled_dropout: bool = option(False, help="identical dropout masks for both views (ablation)",
                                      group="method", card=True)
    # not given: a sentence-transformers model's own pooling, else the preset's (mirror.train.start_pooling)
    pooling: str | None = option("cls", shared="pooling", unset="mean (BERT models) or cls (others)",
                                 group="method", preset=True, card=True)
    max_length: int = option(50, shared="max_length", range="[3, inf)", why="special tokens plus one token",
                             group="method", preset=True, card=True)
    lr: float = option(2e-5, shared="lr", group="optimisation", card=True)
    weight_decay: float = option(0.01, shared="weight_decay", group="optimisation", card=True)
    schedule: str = option("constant", help="constant (paper) | linear (decay to 0 after warmup)",
                           choices=SCHEDULES, group="optimisation", card=True)
    warmup_steps: int = option(0, shared="warmup_steps", group="optimisation", card=True)
    max_grad_norm: float | None = option(None, shared="max_grad_norm", group="optimisation", card=True)
    batch_size: int = option(200, shared="batch_size", note="strings per step, 2 views each", range="[2, inf)",
                             why="the loss needs in-batch negatives", group="optimisation", card=True)
    epochs: int = option(1, shared="epochs", group="optimisation", preset=True, card=True, resume_safe=True)
    steps: int | None = option(None, shared="steps", group="optimisation", card=True, resume_safe=True)
    packing: str = option("auto", shared="packing", group="hardware")
    compile: bool = option(False, help="torch.compile the model; falls back to eager with a warning if it fails",
                           group="hardware")
    gradient_checkpointing: bool = option(False, help="recompute activations in backward: less memory, ~30% more "
                                                      "time", group="hardware")
    grad_cache_chunk: int | None = option(None, help="GradCache: run the encoder N views at a time with cached "
                                                     "embedding gradients, so big batches fit in small memory with "
                                                     "every in-batch negative kept; 0: off", unset="off",
                                          range="[0, inf)", excludes=("controlled_dropout",), group="hardware")
    eval_after: str | None = option(None, help="comma-separated eval tasks (e.g. sts,wordsim) run on the trained "
                                               "model before saving; scores go into mirrorbert.json and README.md",
                                    group="eval", resume_safe=True)
    data_dir: str | None = option(None, shared="data_dir", note="the evaluation sets of --eval-after", group="eval",
                                  resume_safe=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pooling_given", self.pooling is not FROM_PRESET)
        fill_presets(self, PRESETS.get(self.preset, {}) if isinstance(self.preset, str) else {})
        super().__post_init__()

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, value)
        if key == "pooling" and getattr(self, "_checked", False):
            object.__setattr__(self, "pooling_given", True)


FIELD_NAMES = {f.name for f in dataclasses.fields(TrainConfig)}
UNPRESET_DEFAULTS: dict[str, Any] = {name: field_defaults(TrainConfig)[name]
                                     for name in names_with(TrainConfig, "preset")}


MAX_CONFIG_BYTES = 1 << 20  # a file of options; a bigger one is refused before it is read


class _Duplicate(Exception):
    """A config file names a key twice (yaml and json would silently keep the last)."""


def _unique(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(f"key {key!r} appears twice")
        seen[key] = value
    return seen


@lru_cache(maxsize=1)
def _yaml_loader():
    """yaml's SafeLoader refusing a mapping that names a key twice (its own keeps the last silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
                try:
                    if key in lines:
                        raise _Duplicate(f"key {key!r} appears twice (lines {lines[key]} and {line})")
                except TypeError:  # an unhashable key: yaml's own error follows
                    continue
                lines[key] = line
            return super().construct_mapping(node, deep)

    return Loader


def load_config_file(path: str | Path, config_class: type = TrainConfig) -> dict[str, Any]:
    """Read a YAML or JSON mapping whose keys are `config_class`'s options (dashes or underscores), each key once;
    a UTF-8 byte-order mark is allowed."""
    from mirrorbert.safeguards.readback import read_regular_bytes

    path = Path(path)
    names = {f.name for f in option_fields(config_class)}
    command_line_only = names_with(config_class, "command_line_only")
    try:
        text = read_regular_bytes(path, "--config", MAX_CONFIG_BYTES).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"--config {path}: not valid UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_unique)
        else:
            import yaml

            data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader
    except _Duplicate as exc:
        raise UserError(f"--config {path}: {exc}") from None
    except Exception as exc:  # both parsers raise many types; the message is what matters
        raise UserError(f"--config {path}: cannot parse: {first_line(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of option names to values")
    out: dict[str, Any] = {}
    for key, value in data.items():
        norm = str(key).replace("-", "_")
        if norm not in names:
            raise UserError(f"--config {path}: unknown option {key!r}")
        if norm in command_line_only:  # permission to run code from the model is the user's own decision
            raise UserError(f"--config {path}: {key!r} is not taken from a file (a shared file must not be able to "
                            f"run code); give --{norm.replace('_', '-')} on the command line")
        if norm in out:
            raise UserError(f"--config {path}: {key!r} and {norm!r} name the same option; give it once")
        out[norm] = value
    return coerce_mapping(config_class, out, f"--config {path}")


def resolve_config(
    overrides: dict[str, Any] | None = None, config_file: str | Path | None = None
) -> TrainConfig:
    """Merge defaults, preset, file and explicit overrides (None values in overrides mean 'not given'); the
    preset and every check are TrainConfig's."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(overrides) - FIELD_NAMES
    if unknown:
        raise UserError(f"unknown option(s): {', '.join(sorted(unknown))}")
    from_file = load_config_file(config_file) if config_file else {}
    return TrainConfig(**{**from_file, **overrides})  # a file's values win over the preset, overrides over both


def resolve_pooling(cfg_pooling: str | None, model_type: str) -> str:
    """The sentence preset leaves pooling open: mean for BERT-family models, [CLS] for the others."""
    if cfg_pooling is not None:
        return cfg_pooling
    return "mean" if model_type in MEAN_POOLING_SENTENCE_MODEL_TYPES else "cls"
