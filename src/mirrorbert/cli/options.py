"""Every option that more than one command takes, defined once: flag, dest, type, action, help, default.

A command adds them by name, in the order its --help lists them:

    options.add(p, use("model", required=True, note=ENCODER), "column", "field", "device")

Their wording (help, and what a None default means) is settings/option_help.py's, which the trainers' config
fields share (`option(..., shared="lr")`): `train`, `pretrain-mlm` and `gloss-pretrain` make their flags from
those fields (cli/field_options.py), so `--lr` reads the same in every command.

`use(name, ...)` carries what genuinely differs for one command, and nothing else may:

* `required=True`, or a `default` where the command's semantics differ (`encode` encodes in fp32,
  `lexsub` batches 32 sentences);
* `note`, a short per-command suffix of the help ("; " + note) saying what the option means there
  (what `--output` writes, what `--batch-size` counts); the shared wording always comes first;
* a handful of argparse details where a command has always parsed the value differently (`choices`, `type`,
  `nargs`, `metavar`, `dest`); tests/cli/test_options.py lists each one that is allowed.

`add(..., defaults=...)` takes the defaults of a whole command at once: a mapping (a config dataclass's
field defaults, `config_defaults`) fills the options named in it.

`state_defaults` then appends "(default: X)" to every help that does not state its default yet, X being the
real default, or the spec's `unset` text where None means something ("$MIRRORBERT_DATA", "the model's").
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mirrorbert.settings.choices import PACKING_MODES
from mirrorbert.settings.option_help import wording

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


def _spec(flag: str, **kwargs: Any) -> Spec:
    """The option `flag` with its shared wording (settings/option_help.py) and argparse's `kwargs`."""
    shared = wording(flag.lstrip("-").replace("-", "_"))
    return Spec(flag, shared.help, kwargs, shared.unset)


_SPECS = (
    # model and output
    _spec("--model"),
    _spec("--output"),
    _spec("--overwrite", action="store_true"),
    _spec("--architecture"),
    _spec("--trust-remote-code", action="store_true"),
    # input
    _spec("--data-dir"),
    _spec("--corpus"),
    _spec("--column"),
    _spec("--field"),
    _spec("--skip-bad-lines", action="store_true"),
    _spec("--limit", type=int),
    # encoding
    _spec("--pooling"),
    _spec("--max-length", type=int),
    _spec("--batch-size", type=int, default=64),
    _spec("--eval-batch-size", type=int, default=64),
    _spec("--packing", choices=PACKING_MODES, default="auto"),
    _spec("--quantize", default="float32"),
    _spec("--nprobe", type=int),
    # optimisation
    _spec("--lr", type=float),
    _spec("--warmup", type=float),
    _spec("--epochs", type=int),
    _spec("--seeds", default="0"),
    # hardware
    _spec("--device", default="auto"),
    _spec("--precision", default="fp32"),
    _spec("--threads", type=int),
    # bookkeeping
    _spec("--no-progress", dest="show_progress", action="store_false", default=True),
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


def add(parser, *options: str | Use, defaults: Mapping[str, Any] | None = None) -> None:
    """Add shared options to `parser` (or an argument group) by name, in the order given."""
    for item in options:
        one = item if isinstance(item, Use) else use(item)
        spec = SPECS[one.name]
        kwargs = {**spec.kwargs, **one.changes}
        if isinstance(defaults, Mapping) and "default" not in one.changes and not kwargs.get("required"):
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


def state_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: X)" to every option's help that does not state its default yet."""
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS) or action.dest == "help":
            continue
        if "default" in action.help.lower() or action.required:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) or action.nargs == 0:
            text = "off"
        else:
            text = _default_text(action, action.default)
        action.help = f"{action.help} (default: {text.replace('%', '%%')})"
