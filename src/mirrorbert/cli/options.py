"""Every option that more than one command takes, defined once: flag, dest, type, action, help, default.

A command adds them by name, in the order its --help lists them:

    options.add(p, use("model", required=True, note=ENCODER), "column", "field", "device")

`use(name, ...)` carries what genuinely differs for one command, and nothing else may:

* `required=True`, or a `default` where the command's semantics differ (`encode` encodes in fp32,
  `pretrain-mlm` clips gradients at 1.0);
* `note`, a short per-command suffix of the help ("; " + note) saying what the option means there
  (what `--output` writes, what `--batch-size` counts); the shared wording always comes first;
* a handful of argparse details where a command has always parsed the value differently (`choices`, `type`,
  `nargs`, `metavar`, `dest`); tests/cli/test_options.py lists each one that is allowed.

`add(..., defaults=...)` takes the defaults of a whole command at once: a mapping (a config dataclass's
field defaults, `config_defaults`) fills the options named in it, and `UNSET` leaves every default at None
so that `train` can tell "not given" from "given" and let a --config file or --preset fill the rest.

`state_defaults` then appends "(default: X)" to every help that does not state its default yet, X being the
real default, or the spec's `unset` text where None means something ("$MIRRORBERT_DATA", "the model's").
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mirrorbert.safeguards.model_loading import TRUST_HELP, TRUST_OPTION
from mirrorbert.settings.choices import PACKING_MODES

UNSET = object()  # add(..., defaults=UNSET): every default None (`train`: a config file or preset fills them)
KEEP = object()  # "no change" in `use`

PACKING_HELP = ("auto | on | grouped | off: how a batch avoids padding. on: several strings per row with "
                "block-diagonal attention (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT); grouped: strings sorted by "
                "length and run in small padded groups (any model, least memory); off: padded to the batch's longest. "
                "Default auto: packed rows where the model supports them and they cost fewer FLOPs than padding "
                "(random training batches; encode's length-sorted batches stay padded), length groups for "
                "models that cannot be packed")
# The --model note of the commands that encode with a model (encode, search, index, export).
ENCODER = "a trained folder, a sentence-transformers folder or a Hugging Face MLM"


@dataclass(frozen=True)
class Spec:
    """One option as every command that takes it parses it; `unset` says what a None default means."""

    flag: str
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)  # argparse's: type, action, dest, default, metavar
    unset: str | None = None

    @property
    def name(self) -> str:
        """What a command calls it in `add`: the flag as an identifier (`--no-progress`: no_progress)."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest", self.name)


def _spec(flag: str, help: str, unset: str | None = None, **kwargs: Any) -> Spec:
    return Spec(flag, help, kwargs, unset)


_SPECS = (
    # model and output
    _spec("--model", "model folder or Hugging Face hub id"),
    _spec("--output", "where to write"),
    _spec("--overwrite", "replace an existing --output (a folder only if mirrorbert wrote it)", action="store_true"),
    _spec("--architecture", "model architecture: bert-tiny (L2/H128) | bert-mini (L4/H256) | bert-small (L4/H512) | "
                            "bert-medium (L8/H512), or a config JSON file"),
    _spec(TRUST_OPTION, TRUST_HELP, dest="trust_remote_code", action="store_true"),
    # input
    _spec("--data-dir", "the data directory", unset="$MIRRORBERT_DATA"),
    _spec("--corpus", "the corpus"),
    _spec("--column", "column holding the text in a CSV/TSV/Parquet/Arrow file or saved dataset"),
    _spec("--field", "field holding the text in a JSONL file"),
    _spec("--skip-bad-lines", "skip lines that are not UTF-8 instead of stopping", action="store_true"),
    _spec("--limit", "use only N inputs", type=int),
    # encoding
    _spec("--pooling", "cls | mean | first-last", unset="the model's saved pooling"),
    _spec("--max-length", "truncate inputs to N tokens", unset="the model's", type=int),
    _spec("--batch-size", "batch size", type=int, default=64),
    _spec("--eval-batch-size", "batch size of the evaluations", type=int, default=64),
    _spec("--packing", PACKING_HELP, choices=PACKING_MODES, default="auto"),
    _spec("--quantize", "float32 (exact vectors) or a quantisation", default="float32"),
    _spec("--nprobe", "ivf: lists scanned per query; more finds more true neighbours, more slowly",
          unset="index: 4 x the square root of nlist; search: the index's own", type=int),
    # optimisation
    _spec("--lr", "AdamW learning rate", type=float),
    _spec("--weight-decay", "AdamW weight decay", type=float, default=0.01),
    _spec("--warmup", "warmup fraction of all steps", type=float),
    _spec("--warmup-steps", "linear warmup steps", type=int),
    _spec("--max-grad-norm", "clip gradients to this norm", unset="off", type=float),
    _spec("--epochs", "passes over the training data", type=int),
    _spec("--steps", "stop after N optimiser steps (overrides --epochs)", type=int),
    _spec("--seed", "random seed", type=int, default=42),
    _spec("--seeds", "comma-separated training seeds; several give mean ± std", default="0"),
    # hardware
    _spec("--device", "auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:1 | mps", default="auto"),
    _spec("--precision", "fp32 | bf16 | fp16 (GPU only) | auto (bf16 where native, i.e. Ampere+ GPUs and CPUs with "
                         "AVX512-BF16/AMX; fp16 on older GPUs; else fp32)", default="fp32"),
    _spec("--threads", "CPU threads for torch", unset="torch's choice, usually all cores", type=int),
    # bookkeeping
    _spec("--save-every", "write a checkpoint every N steps", type=int, default=0),
    _spec("--checkpoint-dir", "where checkpoints go", unset="<output>.checkpoints"),
    _spec("--keep-checkpoints", "how many checkpoints to keep", type=int, default=2),
    _spec("--resume", "continue from a checkpoint folder (step-N) or a checkpoint root"),
    _spec("--log-dir", "write TensorBoard scalars here"),
    _spec("--log-every", "log training metrics every N steps", type=int),
    _spec("--no-progress", "no progress: neither the bar on a terminal nor the line every 30 s "
          "(MIRRORBERT_PROGRESS_INTERVAL) in a log", dest="show_progress", action="store_false", default=True),
)
SPECS: dict[str, Spec] = {spec.name: spec for spec in _SPECS}
BY_FLAG: dict[str, Spec] = {spec.flag: spec for spec in _SPECS}


@dataclass(frozen=True)
class Use:
    """One command's use of a shared option: only what differs there (see the module docstring)."""

    name: str
    note: str | None = None
    changes: dict[str, Any] = field(default_factory=dict)


ALLOWED_CHANGES = frozenset({"required", "default", "choices", "type", "nargs", "metavar", "dest"})


def use(name: str, note: str | None = None, **changes: Any) -> Use:
    """A shared option with one command's differences; an unknown name or change fails at import, not in use."""
    unknown = set(changes) - ALLOWED_CHANGES
    if name not in SPECS or unknown:
        raise ValueError(f"options.use({name!r}): unknown option or change {sorted(unknown)}")
    return Use(name, note, changes)


def config_defaults(config_class) -> dict[str, Any]:
    """The field defaults of a command's config dataclass, so that its CLI never keeps a second copy."""
    return {f.name: f.default for f in dataclasses.fields(config_class) if f.default is not dataclasses.MISSING}


def add(parser, *options: str | Use, defaults: Mapping[str, Any] | object | None = None) -> None:
    """Add shared options to `parser` (or an argument group) by name, in the order given."""
    for item in options:
        one = item if isinstance(item, Use) else use(item)
        spec = SPECS[one.name]
        kwargs = {**spec.kwargs, **one.changes}
        if defaults is UNSET:
            kwargs["default"] = None
        elif isinstance(defaults, Mapping) and "default" not in one.changes and not kwargs.get("required"):
            dest = kwargs.get("dest", spec.dest)  # a required option has no default
            if dest in defaults:
                kwargs["default"] = defaults[dest]
        parser.add_argument(spec.flag, help=spec.help + (f"; {one.note}" if one.note else ""), **kwargs)


# ----------------------------------------------------------------------------- --help states every default
def _default_text(action: argparse.Action, value: Any) -> str:
    if value is None or value == []:
        spec = BY_FLAG.get(action.option_strings[0])
        return spec.unset if spec is not None and spec.unset else "none"
    return str(value)


def state_defaults(parser: argparse.ArgumentParser, defaults: dict | None = None,
                   preset_keys: tuple[str, ...] = ()) -> None:
    """Append "(default: X)" to every option's help that does not state its default yet.

    `defaults` replaces argparse's where a command keeps those at None (`train`: the config's defaults);
    options in `preset_keys` say that --preset sets its own.
    """
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS) or action.dest == "help":
            continue
        if "default" in action.help.lower() or action.required:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) or action.nargs == 0:
            text = "off"
        else:
            value = defaults.get(action.dest, action.default) if defaults is not None else action.default
            text = _default_text(action, value)
            if action.dest in preset_keys:
                text += "; --preset sets its own"
        action.help = f"{action.help} (default: {text.replace('%', '%%')})"
