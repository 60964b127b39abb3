"""Options declared once, on their dataclass field (docs/development.md, "How to add an option"), and the readers
that derive everything else from them: `option(...)` is a `dataclasses.field` whose metadata holds the option's
facts (all optional but `help`):

    help, note         the --help text (a shared wording from `option_help` plus the `note` this field adds)
    unset              what a None value means, for --help ("(default: <unset>)")
    required           must be given before the command runs; a config may be made without it
    choices, range     the allowed values and the plausible interval ("(0, 1]", "[1, inf)"), of each element
                       for a list; `why` says why, when a value is refused
    excludes           the options it cannot be given with
    resume_safe        may change on --resume without changing the result
    preset             a preset sets it: the dataclass default is FROM_PRESET, `default` the value without one
    card               shown in the model card's settings
    command_line_only  never taken from a config file
    flag, aliases      the flag as typed when not `--` + the name with dashes (`--no-progress`); other spellings
    old_flags          hidden spellings kept for old scripts: {flag: the value it sets}
    group              the --help group it is listed in (a key each command titles)
    nargs, repeat      a list given as several values after the flag, or by repeating the flag (else one
                       comma-separated value)
    metavar            argparse's, for --help only

Standard library only.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import re
import shlex
from collections.abc import Callable, Iterator
from typing import Any

from mirrorbert.settings.option_help import SHARED


class _FromPreset:
    """The dataclass default of a preset field: "not given", filled from the preset or the field's `default`."""

    def __repr__(self) -> str:
        return "<from preset>"


FROM_PRESET: Any = _FromPreset()
_MISSING: Any = dataclasses.MISSING
NO_VALUE: Any = object()  # `say(field)` without a value


@dataclasses.dataclass(frozen=True)
class Interval:
    """A `range` fact: "(0, 1]", "[1, inf)", "[14, 23]"."""

    text: str
    low: float
    high: float
    low_open: bool
    high_open: bool

    @classmethod
    def parse(cls, text: str) -> "Interval":
        match = re.fullmatch(r"([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])", text)
        if match is None:
            raise ValueError(f"option(): range {text!r} is not an interval such as '(0, 1]' or '[1, inf)'")
        low, high = float(match[2]), float(match[3])
        return cls(text, low, high, match[1] == "(", match[4] == ")")

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (value < self.high if self.high_open else value <= self.high)

    def rule(self, value: float) -> str:
        """What a value outside must be, in words; a float's likely intended value when there is one."""
        low, high = _number(self.low), _number(self.high)
        if isinstance(value, int):
            if math.isinf(self.high) and not self.low_open:
                return f"must be an integer >= {low}"
            if not (self.low_open or self.high_open):
                return f"must be a whole number from {low} to {high}"
        if math.isinf(self.high):
            return f"must be {'>' if self.low_open else '>='} {low}"
        guess = _flip_exponent(value)
        return f"outside {self.text}" + (f"; did you mean {guess!r}?" if guess != value and self.holds(guess) else "")


def _number(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e16 else repr(x)


def _flip_exponent(value: float) -> float:
    """2e5 for 2e-5: the value with its decimal exponent's sign flipped (the usual slip in a learning rate)."""
    mantissa, exponent = f"{value:e}".split("e")
    return float(f"{mantissa}e{-int(exponent)}")


def option(default: Any = _MISSING, *, help: str | None = None, shared: str | None = None, note: str | None = None,
           default_factory: Callable[[], Any] | Any = _MISSING, **facts: Any) -> Any:
    """A dataclass field with its option's facts (the module docstring lists them): `help` its own wording, or
    `shared` a wording several commands use (settings/option_help.py, with its `unset` and facts unless given
    here); `note` is appended to either. A malformed fact fails here, when the class is defined."""
    if (help is None) == (shared is None):
        raise ValueError("option(): give exactly one of help or shared")
    unknown = set(facts) - _FACTS
    if unknown:
        raise ValueError(f"option(): unknown facts {sorted(unknown)}")
    if shared is not None:
        common = SHARED[shared]
        facts = {**common.facts, **({"unset": common.unset} if common.unset else {}), **facts}
        help = common.help
    if isinstance(facts.get("range"), str):
        facts["range"] = Interval.parse(facts["range"])
    metadata = {**facts, "help": help + (f"; {note}" if note else ""), "note": note}
    if facts.get("preset"):
        metadata["default"] = default
        return dataclasses.field(default=FROM_PRESET, metadata=metadata)
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_FACTS = frozenset({"unset", "required", "choices", "range", "why", "excludes", "resume_safe", "preset", "card",
                    "command_line_only", "flag", "aliases", "old_flags", "group", "nargs", "repeat", "metavar"})


def redeclare(config_class: type, name: str, *, default: Any = _MISSING, note: str | None = None,
              **facts: Any) -> Any:
    """`config_class`'s field `name` again, with only what a subclass changes (its default, note or facts):
    `precision: str = redeclare(RunOptions, "precision", default="fp32")`."""
    base = field_of(config_class, name)
    metadata = {**base.metadata, **facts}
    if isinstance(metadata.get("range"), str):
        metadata["range"] = Interval.parse(metadata["range"])
    if note is not None:
        old = base.metadata.get("note")
        text = base.metadata["help"][: -len(f"; {old}")] if old else base.metadata["help"]
        metadata.update(help=f"{text}; {note}", note=note)
    if default is _MISSING:
        default = field_default(base)
    return dataclasses.field(default=default, metadata=metadata)


def field_of(config_class: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(config_class):
        if f.name == name:
            return f
    raise KeyError(f"{config_class.__name__} has no field {name!r}")


_FLAGS: contextvars.ContextVar[bool] = contextvars.ContextVar("mirrorbert_flag_names", default=False)


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """Inside, messages name an option as the command line spells it (`--lr 2e5`); outside, as Python does
    (`lr=200000.0`). The command line runs every command inside."""
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def say(f: dataclasses.Field, value: Any = NO_VALUE) -> str:
    """The option (with its value) as the user wrote it: `--lr 200000.0` on the command line, `lr=200000.0`
    in Python; without a value `--output` / `output=`."""
    if not _FLAGS.get():
        return f"{f.name}=" + ("" if value is NO_VALUE else repr(value))
    if value is NO_VALUE:
        return flag_of(f)
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return f"{flag_of(f)} {shlex.quote(value) if isinstance(value, str) else value}"


def option_fields(config_class: type) -> list[dataclasses.Field]:
    """The class's options (fields declared with `option`) in declaration order, those its bases declare last."""
    fields = [f for f in dataclasses.fields(config_class) if "help" in f.metadata]
    inherited = {f.name for base in config_class.__mro__[1:] if dataclasses.is_dataclass(base)
                 for f in dataclasses.fields(base)}
    return [f for f in fields if f.name not in inherited] + [f for f in fields if f.name in inherited]


def field_default(f: dataclasses.Field) -> Any:
    """What the field is when not given (a preset field's value without a preset; a factory's product)."""
    if f.metadata.get("preset"):
        return f.metadata["default"]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def field_defaults(config_class: type) -> dict[str, Any]:
    return {f.name: field_default(f) for f in dataclasses.fields(config_class)}


def flag_of(f: dataclasses.Field) -> str:
    """The option as typed on the command line."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def names_with(config_class: type, fact: str) -> tuple[str, ...]:
    """The options whose `fact` is true ("resume_safe", "preset", "card", ...), in --help order (the card's)."""
    return tuple(f.name for f in option_fields(config_class) if f.metadata.get(fact))


def fill_presets(instance: Any, preset: dict[str, Any]) -> None:
    """Every preset field not given: the preset's value, else the field's own default (in `__post_init__`)."""
    for f in dataclasses.fields(instance):
        if f.metadata.get("preset") and getattr(instance, f.name) is FROM_PRESET:
            object.__setattr__(instance, f.name, preset.get(f.name, f.metadata["default"]))


__all__ = ["FROM_PRESET", "Interval", "NO_VALUE", "field_default", "field_defaults", "field_of", "fill_presets",
           "flag_names", "flag_of", "names_with", "option", "option_fields", "redeclare", "say"]
