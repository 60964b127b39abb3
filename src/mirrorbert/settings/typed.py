"""Config values checked against the dataclass field types (`overwrite: "false"` never means true); a float also
takes a numeric string (YAML reads `2e-5` as text); a list or mapping only where the type is one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import say

_NONE = type(None)


def union_members(annotation: Any) -> tuple[tuple[Any, ...], bool]:
    """(the types an annotation such as `int | None` allows besides None, whether None is allowed)."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    members = args or (annotation,)
    return tuple(m for m in members if m is not _NONE), _NONE in members


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{value!r} (text)"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{value!r} ({type(value).__name__})"


def coerce_value(subject: str, value: Any, annotation: Any, in_file: bool = False) -> Any:
    """The value converted to the field's type, or a UserError naming `subject` ("--config run.yaml: lr" for a
    config file's key, `say(field)` for a value given in Python or on the command line)."""
    types_, nullable = union_members(annotation)
    if value is None:
        if nullable:
            return None
        raise UserError(f"{subject} must not be empty")
    containers = [t for t in types_ if typing.get_origin(t) in (list, tuple, dict)]
    if containers:
        return _coerce_container(subject, value, containers[0], in_file)
    if bool in types_:
        if isinstance(value, bool):
            return value
        raise UserError(f"{subject} must be true or false, not {_describe(value)}")
    if float in types_:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())  # PyYAML reads `2e-5` (no dot) as text
            except ValueError:
                pass
        raise UserError(f"{subject} must be a number, not {_describe(value)}")
    if int in types_:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UserError(f"{subject} must be a whole number, not {_describe(value)}")
    if str in types_:
        if isinstance(value, str):
            return value
        hint = "; put it in quotes" if in_file else ""
        raise UserError(f"{subject} must be text, not {_describe(value)}{hint}")
    return value  # a field type this module does not know: left to the validator


def _coerce_container(subject: str, value: Any, annotation: Any, in_file: bool) -> Any:
    """list[X] / tuple[X, ...] (each element checked as X) and dict[...] (a mapping)."""
    origin = typing.get_origin(annotation)
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{subject} must be a mapping of names to values, not {_describe(value)}")
        return value
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
        raise UserError(f"{subject} must be a list, not {_describe(value)}")
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    if len(args) == 1:
        value = [coerce_value(subject, item, args[0], in_file) for item in value]
    return tuple(value) if origin is tuple else list(value)


def coerce_mapping(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Every value of a config file checked against the dataclass `cls`; keys must already be field names."""
    types_ = typing.get_type_hints(cls)
    return {key: coerce_value(f"{where}: {key}", value, types_[key], in_file=True) for key, value in values.items()}


def check_types(instance) -> None:
    """The same check on a constructed dataclass, naming each field as `say` does; converts in place."""
    types_ = typing.get_type_hints(type(instance))
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        checked = coerce_value(say(f), value, types_[f.name])
        if checked is not value and (type(checked) is not type(value) or checked != value):
            object.__setattr__(instance, f.name, checked)


__all__ = ["check_types", "coerce_mapping", "coerce_value", "union_members"]
