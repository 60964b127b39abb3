"""A trainer's flags made from its config dataclass's fields, so that an option is declared once, on its field.

    add_config_options(parser, TrainConfig, {"output": "model and output", ...}, leave_unset=True)

adds one flag per field (settings/fields.py): its spelling (`flag`, else `--` + the name with dashes), its help
with the default it states, argparse's type from the annotation (`int`, `float`; text as typed), store_true
for a bool that defaults to False and store_false for one that defaults to True (`--no-progress`), and the
argparse details the field names (`required`, `choices`, `nargs`, `metavar`). Each field's `group` key is
titled by the command; groups appear in the order of `titles`, each listing the config's own options before
the run options it shares. A field without a group is listed with --help, after every group.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from mirrorbert.settings.fields import field_default, flag_of, ordered_fields


def add_config_options(parser: argparse.ArgumentParser, config_class: type, titles: Mapping[str, str], *,
                       leave_unset: bool = False, preset_values: Mapping[str, str] | None = None,
                       after: Mapping[str, Callable[[Any], None]] | None = None) -> None:
    """One flag per field of `config_class` (see the module docstring).

    `leave_unset`: every argparse default None, so that "not given" can be told from "given" (`train`: a
    --config file and a --preset fill the rest); --help still states the field's default. `preset_values`:
    per field, what each preset sets it to ("word 0.2, phrase 0.04"), stated after its default. `after`:
    per group key, a function adding the command's own flags to that group, after its fields.
    """
    hints = typing.get_type_hints(config_class)
    fields = ordered_fields(config_class)
    for title in dict.fromkeys(titles.values()):
        group = parser.add_argument_group(title)
        keys = [key for key, named in titles.items() if named == title]
        for f in fields:
            if f.metadata.get("group") in keys:
                _add(group, f, hints[f.name], leave_unset, (preset_values or {}).get(f.name))
        for key in keys:
            if after and key in after:
                after[key](group)
    unknown = {f.metadata.get("group") for f in fields} - set(titles) - {None}
    if unknown:
        raise ValueError(f"{config_class.__name__}: no --help group titled for {sorted(unknown)}")
    for f in fields:
        if f.metadata.get("group") is None:
            _add(parser, f, hints[f.name], leave_unset, None)


def _add(parser, f: dataclasses.Field, hint: Any, leave_unset: bool, presets: str | None) -> None:
    meta, default = f.metadata, field_default(f)
    kwargs: dict[str, Any] = {"dest": f.name}
    scalar = _scalar_type(hint)
    if scalar is bool:
        kwargs["action"] = "store_false" if default else "store_true"
    else:
        if scalar in (int, float):
            kwargs["type"] = scalar
        kwargs.update({key: meta[key] for key in ("choices", "nargs", "metavar") if meta.get(key) is not None})
    if meta.get("required"):
        kwargs["required"] = True
    else:
        kwargs["default"] = None if leave_unset else default
    parser.add_argument(flag_of(f), help=_help(meta, default, scalar is bool, presets), **kwargs)


def _scalar_type(hint: Any) -> Any:
    """`int | None` -> int; `list[str]` -> list; a plain type as it is."""
    union = typing.get_origin(hint) in (typing.Union, getattr(types, "UnionType", typing.Union))
    members = [m for m in typing.get_args(hint) if m is not type(None)] if union else [hint]
    scalar = members[0] if len(members) == 1 else None
    return typing.get_origin(scalar) or scalar


def _help(meta: Mapping[str, Any], default: Any, switch: bool, presets: str | None) -> str:
    """The field's help, with "(default: X)" unless it words its default itself or the option is required."""
    text = meta["help"]
    if "default" not in text.lower() and not meta.get("required"):
        if switch:
            stated = "off"
        elif default is None or default == []:
            stated = meta.get("unset") or "none"
        else:
            stated = str(default)
        text += f" (default: {stated}" + (f"; presets: {presets}" if presets else "") + ")"
    return text.replace("%", "%%")
