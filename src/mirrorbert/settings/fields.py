"""Options declared once, on their dataclass field, and the readers that derive everything else from them.

A config dataclass declares each option with `option(...)`, which returns a `dataclasses.field` carrying the
option's facts in its metadata, as SimCSE's `HfArgumentParser` reads `field(metadata={"help": ...})`:

    temperature: float = option(0.04, help="InfoNCE temperature tau", preset=True, card=True)

The command line builds its flags and --help from them (cli/field_options.py); a resume is refused when an
option changed that is not `resume_safe` (`resume_safe_names`); a preset fills the `preset` fields
(`preset_names`); the model card lists the `card` fields (`card_names`); a config file may not set a
`command_line_only` field. Metadata keys (all optional but `help`):

    help               the full --help text (a shared wording from `option_help` plus its `note`)
    note               the part of `help` this field adds to a shared wording
    unset              what a None value means, for --help ("(default: <unset>)")
    resume_safe        True: may change on --resume without changing the result
    preset             True: a preset sets it; the dataclass default is FROM_PRESET and `default` holds the
                       value without a preset
    default            (preset fields) the value without a preset
    card               True: shown in the model card's settings
    command_line_only  True: never taken from a config file
    flag               the option as typed, when not `--` + the name with dashes (`--lambda`, `--no-progress`)
    group              the --help group it is listed in (a key each command titles: "output", "data", ...)
    required, metavar, choices, nargs   argparse's, for the command line only

Standard library only: no torch, no argparse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mirrorbert.settings.option_help import wording


class _FromPreset:
    """The dataclass default of a preset field: "not given", filled from the preset or the field's `default`."""

    def __repr__(self) -> str:
        return "<from preset>"


FROM_PRESET: Any = _FromPreset()
_MISSING: Any = dataclasses.MISSING


def option(default: Any = _MISSING, *, help: str | None = None, shared: str | None = None, note: str | None = None,
           default_factory: Callable[[], Any] | Any = _MISSING, **facts: Any) -> Any:
    """A dataclass field with its option's facts (the module docstring lists them).

    `help` is the field's own wording; `shared` names a wording several commands use (settings/option_help.py),
    whose `unset` text comes along; `note` is appended to either ("; " + note), as one command's meaning.
    """
    if (help is None) == (shared is None):
        raise ValueError("option(): give exactly one of help or shared")
    unknown = set(facts) - _FACTS
    if unknown:
        raise ValueError(f"option(): unknown facts {sorted(unknown)}")
    base = help if help is not None else wording(shared).help
    if shared is not None and wording(shared).unset and "unset" not in facts:
        facts["unset"] = wording(shared).unset
    metadata = {**facts, "help": base + (f"; {note}" if note else ""), "note": note}
    if facts.get("preset"):
        metadata["default"] = default
        return dataclasses.field(default=FROM_PRESET, metadata=metadata)
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_FACTS = frozenset({"unset", "resume_safe", "preset", "card", "command_line_only", "flag", "group", "required",
                    "metavar", "choices", "nargs"})


def redeclare(config_class: type, name: str, *, default: Any = _MISSING, note: str | None = None,
              **facts: Any) -> Any:
    """`config_class`'s field `name` again, with only what a subclass changes (its default, note or facts).

    `precision: str = redeclare(RunOptions, "precision", default="fp32")` keeps the help, group and resume
    safety of the shared field, so they stay declared once.
    """
    base = _field(config_class, name)
    metadata = {**base.metadata, **facts}
    if note is not None:
        old = base.metadata.get("note")
        text = base.metadata["help"][: -len(f"; {old}")] if old else base.metadata["help"]
        metadata.update(help=f"{text}; {note}", note=note)
    if default is _MISSING:
        default = field_default(base)
    return dataclasses.field(default=default, metadata=metadata)


def _field(config_class: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(config_class):
        if f.name == name:
            return f
    raise KeyError(f"{config_class.__name__} has no field {name!r}")


# ----------------------------------------------------------------------------- readers
def ordered_fields(config_class: type) -> list[dataclasses.Field]:
    """The class's own fields in declaration order, then those its bases declare (a command's own options
    before the run options every trainer shares): the order of its --help and of the model card."""
    fields = dataclasses.fields(config_class)
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


def _names(config_class: type, fact: str) -> tuple[str, ...]:
    return tuple(f.name for f in ordered_fields(config_class) if f.metadata.get(fact))


def resume_safe_names(config_class: type) -> frozenset[str]:
    """Fields that may change on --resume without changing the result (bookkeeping, budgets, inputs whose
    content the trainer checks by fingerprint)."""
    return frozenset(_names(config_class, "resume_safe"))


def preset_names(config_class: type) -> tuple[str, ...]:
    """Fields a preset sets (each `FROM_PRESET` until `fill_presets`)."""
    return _names(config_class, "preset")


def card_names(config_class: type) -> tuple[str, ...]:
    """Fields the model card lists, in the card's order."""
    return _names(config_class, "card")


def command_line_only_names(config_class: type) -> frozenset[str]:
    """Fields a config file may not set (a shared file must not be able to grant them)."""
    return frozenset(_names(config_class, "command_line_only"))


def fill_presets(instance: Any, preset: dict[str, Any]) -> None:
    """Every preset field not given: the preset's value, else the field's own default (in `__post_init__`)."""
    for f in dataclasses.fields(instance):
        if f.metadata.get("preset") and getattr(instance, f.name) is FROM_PRESET:
            object.__setattr__(instance, f.name, preset.get(f.name, f.metadata["default"]))


__all__ = ["FROM_PRESET", "card_names", "command_line_only_names", "field_default", "field_defaults", "fill_presets",
           "flag_of", "option", "ordered_fields", "preset_names", "redeclare", "resume_safe_names"]
