"""Every value of every command's options checked from its field's declared facts, by one function (`check`);
`Options`, the base of each command's options, is checked when made and whenever a field is set (a refused value
leaves the old one). Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import NO_VALUE, field_default, field_of, option_fields, say
from mirrorbert.settings.typed import check_types


def _blank(value: Any) -> bool:
    return (isinstance(value, str) and not value.strip()) or (isinstance(value, (list, tuple)) and not value)


def check_value(f: dataclasses.Field, value: Any) -> None:
    """One option's value against its field's facts (after its type was checked); UserError naming it."""
    facts, default = f.metadata, field_default(f)
    if value is None:
        return
    if _blank(value) and default is not None and not _blank(default):
        raise UserError(f"{say(f)} must not be empty")
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(item, float) and not math.isfinite(item):
            raise UserError(f"{say(f, item)}: must be a finite number")
        why = f" ({facts['why']})" if facts.get("why") else ""
        choices = facts.get("choices")
        if choices is not None and item not in choices:
            raise UserError(f"{say(f, item)}: not one of {', '.join(map(str, choices))}{why}")
        interval = facts.get("range")
        if interval is not None and isinstance(item, (int, float)) and not interval.holds(item):
            raise UserError(f"{say(f, item)}: {interval.rule(item)}{why}")


def check(instance: Any) -> None:
    """Types, then every option's facts (`excludes`: options it cannot be given with), then `rules()`."""
    check_types(instance)
    fields = option_fields(type(instance))
    for f in fields:
        check_value(f, getattr(instance, f.name))
    for f in fields:
        for other in f.metadata.get("excludes", ()):
            if getattr(instance, f.name) and getattr(instance, other):
                raise UserError(f"{say(f)} and {instance.say(other)}: give one of them, not both")
    instance.rules()


def require(instance: Any) -> None:
    """Every `required` option given (`--output is required` / `output= is required`) and not blank."""
    for f in option_fields(type(instance)):
        value = getattr(instance, f.name)
        if f.metadata.get("required") and value is None:
            note = f.metadata.get("note")
            raise UserError(f"{say(f)} is required" + (f" ({note})" if note else ""))
        if f.metadata.get("required") and _blank(value):
            raise UserError(f"{say(f)} must not be empty")


@dataclasses.dataclass(kw_only=True)
class Options:
    """The base of a command's options (keywords only): checked when made and when a field is set."""

    def __post_init__(self) -> None:
        check(self)
        object.__setattr__(self, "_checked", True)

    def __setattr__(self, key: str, value: Any) -> None:
        if not getattr(self, "_checked", False) or key not in {f.name for f in dataclasses.fields(self)}:
            object.__setattr__(self, key, value)  # the dataclass __init__ filling the fields
            return
        before = getattr(self, key)
        object.__setattr__(self, key, value)
        try:
            check(self)
        except UserError:
            object.__setattr__(self, key, before)
            raise

    def rules(self) -> None:
        """The rules between options (none here); each subclass with some says them in `say`'s words."""

    def validate(self) -> None:
        """Ready to run: every value checked again and every required option given."""
        check(self)
        require(self)

    def say(self, name: str, value: Any = NO_VALUE) -> str:
        """The option `name` as the user wrote it (`--column` / `column=`), for `rules()`' messages."""
        return say(field_of(type(self), name), value)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


__all__ = ["Options", "check", "check_value", "require"]
