"""Config values checked against the dataclass field types, so `overwrite: "false"` never means true.

YAML and JSON give strings, lists and booleans where a user may not expect them (PyYAML reads `2e-5`
as a string and `no` as False). Each value is checked against its field's annotation once, at the edge:
booleans must be booleans, integers integers, numbers numbers (a numeric string such as `2e-5` is
accepted for a float), text text; lists and mappings are refused wherever a single value is expected.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import flag_of

_NONE = type(None)


def _allowed_types(annotation: Any) -> tuple[set[type], bool]:
    """(scalar types allowed, whether None is allowed) for an annotation such as `int | None`."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, _union_type()) else ()
    members = args or (annotation,)
    return {m for m in members if m is not _NONE}, _NONE in members


def _union_type():
    import types

    return getattr(types, "UnionType", typing.Union)


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


def _subject(where: str | None, key: str) -> str:
    """`--config run.yaml: lr` for a config file; `--lr:` for values given in Python (no file to name)."""
    return f"{where}: {key}" if where else f"--{key.replace('_', '-')}:"


def coerce_value(key: str, value: Any, annotation: Any, where: str | None) -> Any:
    """The value converted to the field's type, or a UserError naming the key and `where` it came from."""
    types_, nullable = _allowed_types(annotation)
    if value is None:
        if nullable:
            return None
        raise UserError(f"{_subject(where, key)} must not be empty")
    containers = [t for t in types_ if typing.get_origin(t) in (list, tuple, dict)]
    if containers:
        return _coerce_container(key, value, containers[0], where)
    if bool in types_:
        if isinstance(value, bool):
            return value
        raise UserError(f"{_subject(where, key)} must be true or false, not {_describe(value)}")
    if float in types_:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())  # PyYAML reads `2e-5` (no dot) as text
            except ValueError:
                pass
        raise UserError(f"{_subject(where, key)} must be a number, not {_describe(value)}")
    if int in types_:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UserError(f"{_subject(where, key)} must be a whole number, not {_describe(value)}")
    if str in types_:
        if isinstance(value, str):
            return value
        hint = "; put it in quotes" if where else ""
        raise UserError(f"{_subject(where, key)} must be text, not {_describe(value)}{hint}")
    return value  # a field type this module does not know: left to the validator


def _coerce_container(key: str, value: Any, annotation: Any, where: str | None) -> Any:
    """list[X] / tuple[X, ...] (each element checked as X) and dict[...] (a mapping)."""
    origin = typing.get_origin(annotation)
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{_subject(where, key)} must be a mapping of names to values, not {_describe(value)}")
        return value
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
        raise UserError(f"{_subject(where, key)} must be a list, not {_describe(value)}")
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    if len(args) == 1:
        value = [coerce_value(key, item, args[0], where) for item in value]
    return tuple(value) if origin is tuple else list(value)


def field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce_mapping(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Every value of a config file checked against the dataclass `cls`; keys must already be field names."""
    types_ = field_types(cls)
    return {key: coerce_value(key, value, types_[key], where) for key, value in values.items()}


def check_types(instance, where: str | None = None) -> None:
    """The same check on a constructed dataclass (library callers bypass the config file reader)."""
    for key, annotation in field_types(type(instance)).items():
        value = getattr(instance, key)
        checked = coerce_value(key, value, annotation, where)
        if checked is not value and (type(checked) is not type(value) or checked != value):
            setattr(instance, key, checked)


def check_finite_numbers(instance) -> None:
    """Every number of a config finite: `--lr nan` parses as a float and would train to NaN without a word.
    The message names the option as typed (a field's `flag`, such as `--lambda` for `lam`)."""
    import math

    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{flag_of(f)}: must be a finite number, not {value}")


__all__ = ["check_finite_numbers", "check_types", "coerce_mapping", "coerce_value"]
