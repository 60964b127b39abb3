"""The one place command-line flags are made: `command` adds a subcommand with one flag per option field of its
options dataclasses (settings/fields.py), checked by the fields' own rules when `options_from_args` makes the
options. Every parser is a `Parser`: no abbreviations, and a mistake is one line naming the likely flag."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import field_default, flag_names, flag_of, option_fields
from mirrorbert.settings.typed import union_members


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations, whose errors are one line naming the option (did-you-mean included)."""

    def __init__(self, *args: Any, version: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        if version:
            self.add_argument("--version", action="version", version=version)

    def error(self, message: str) -> typing.NoReturn:
        """A UserError (one line, exit 2, as any user mistake), never argparse's usage dump and exit."""
        raise UserError(message.removeprefix("argument "))

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # this parser's own flags are the ones the user meant (a subcommand's, for a subcommand)
            self.error(unrecognized(self, extras))
        return namespace, extras


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """The first thing the parser did not take, and the flag most likely meant."""
    typed = next((item.split("=", 1)[0] for item in extras if item.startswith("-")), None)
    if typed is None:
        return f"unexpected argument {extras[0]!r} ({parser.prog} --help lists the options)"
    flags = [s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings]
    guess = likely_flag(typed, flags)
    return f"unrecognized option {typed}" + (f"; did you mean {guess}?" if guess else
                                               f" ({parser.prog} --help lists the options)")


def likely_flag(typed: str, flags: list[str]) -> str | None:
    """A flag the user probably meant: initials either way (`--learning-rate` for `--lr`, `--bs` for
    `--batch-size`), else the closest spelling (`--output-dir` for `--output`)."""
    def initials(name: str) -> str:
        return "".join(word[0] for word in name.lstrip("-").split("-") if word)

    name = typed.lstrip("-")
    for flag in flags:
        if len(name) > 1 and ("-" in name and initials(typed) == flag.lstrip("-")
                              or "-" in flag.lstrip("-") and initials(flag) == name):
            return flag
    close = difflib.get_close_matches(typed, flags, n=1, cutoff=0.7)
    return close[0] if close else None


def command(sub, name: str, run: Callable[[Any], int], *classes: type, summary: str, description: str | None = None,
            **how: Any) -> argparse.ArgumentParser:
    """The subcommand `name` with the flags of `classes` (`add_options`'s keywords in `how`); it runs `run(args)`
    with options named as flags in its messages."""
    parser = sub.add_parser(name, help=summary, description=description, allow_abbrev=False)
    add_options(parser, *classes, **how)
    parser.set_defaults(func=functools.partial(_with_flag_names, run))
    return parser


def _with_flag_names(run: Callable[[Any], int], args: Any) -> int:
    with flag_names():
        return run(args)


def add_options(parser: argparse.ArgumentParser, *classes: type, titles: Mapping[str, str] | None = None,
                leave_unset: bool = False, presets: Mapping[str, str] | None = None) -> None:
    """One flag per option field of `classes`, in their order. `titles`: --help group titles by the fields' `group`
    key, in order (fields without one come last). `leave_unset`: every argparse default None, so "not given" can
    be told from "given" (--help still states the field's default). `presets`: per field, what each preset sets
    it to ("word 0.2, phrase 0.04")."""
    hints = {cls: typing.get_type_hints(cls) for cls in classes}
    fields = [(cls, f) for cls in classes for f in option_fields(cls)]
    titles = titles or {}
    unknown = {f.metadata.get("group") for _, f in fields} - set(titles) - {None}
    if unknown:
        raise ValueError(f"{parser.prog}: no --help group titled for {sorted(unknown)}")
    groups = {title: parser.add_argument_group(title) for title in dict.fromkeys(titles.values())}
    for cls, f in sorted(fields, key=lambda pair: _group_order(titles, pair[1])):
        group = f.metadata.get("group")
        _add(groups[titles[group]] if group else parser, f, hints[cls][f.name], leave_unset,
             (presets or {}).get(f.name))


def _group_order(titles: Mapping[str, str], f: dataclasses.Field) -> int:
    ordered = list(dict.fromkeys(titles.values()))
    group = f.metadata.get("group")
    return ordered.index(titles[group]) if group else len(ordered)


def _add(parser, f: dataclasses.Field, hint: Any, leave_unset: bool, presets: str | None) -> None:
    meta, default = f.metadata, field_default(f)
    kind, item = _shape(hint)
    kwargs: dict[str, Any] = {"dest": f.name, "default": None if leave_unset or kind == "dict" else default}
    if kind == "bool":
        kwargs["action"] = "store_false" if default else "store_true"
    elif kind == "dict":
        kwargs.update(action="append", type=_key_value)
    elif kind == "list" and meta.get("nargs"):
        kwargs.update(nargs=meta["nargs"], type=_scalar(item))
    elif kind == "list" and meta.get("repeat"):
        kwargs.update(action="append", type=_scalar(item), default=None)
    elif kind == "list":
        kwargs["type"] = _comma_list(item)
    else:
        kwargs["type"] = _scalar(item)
    if kind != "bool":
        choices = meta.get("choices")
        kwargs["metavar"] = meta.get("metavar") or ("{" + ",".join(map(str, choices)) + "}" if choices else None)
    parser.add_argument(*meta.get("aliases", ()), flag_of(f), help=_help(meta, default, kind == "bool", presets),
                        **kwargs)
    for old, value in meta.get("old_flags", {}).items():  # hidden spellings of old scripts
        parser.add_argument(old, dest=f.name, action="store_const", const=value, help=argparse.SUPPRESS)


def _shape(hint: Any) -> tuple[str, Any]:
    """("bool" | "scalar" | "list" | "dict", the scalar or element type) of an annotation such as `int | None`."""
    one = union_members(hint)[0][0]
    origin = typing.get_origin(one)
    if origin in (list, tuple):
        return "list", typing.get_args(one)[0]
    if origin is dict:
        return "dict", None
    return ("bool" if one is bool else "scalar"), one


def _scalar(kind: Any) -> Callable[[str], Any] | None:
    return kind if kind in (int, float) else None


def _comma_list(item: Any) -> Callable[[str], list[Any]]:
    convert = _scalar(item) or str

    def comma_separated(text: str) -> list[Any]:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        try:
            return [convert(part) for part in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {'whole numbers' if convert is int else 'numbers'}, not {text!r}") from None

    return comma_separated


def _key_value(text: str) -> tuple[str, Any]:
    """KEY=VALUE; the value read as JSON where it parses (5e-5, true, [1, 2]), else as text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. lr=5e-5, not {text!r}")
    return key.strip().replace("-", "_"), json_or_text(value.strip())


def json_or_text(text: str) -> Any:
    """`text` read as JSON where it parses (5e-5, true, [1, 2]), else as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _help(meta: Mapping[str, Any], default: Any, switch: bool, presets: str | None) -> str:
    """The field's help, with "(default: X)" unless it words its default itself, or "(required)"."""
    text = meta["help"]
    if meta.get("required"):
        text += " (required)"
    elif "default" not in text.lower():
        if switch:
            stated = "off"
        elif default is None or default in ([], (), {}):
            stated = meta.get("unset") or "none"
        elif isinstance(default, (list, tuple)):
            stated = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in default)
        else:
            stated = str(default)
        text += f" (default: {stated}" + (f"; presets: {presets}" if presets else "") + ")"
    return text.replace("%", "%%")


def options_from_args(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """`cls` made from the parsed flags (those not given keep the field's default) and `given`, then validated:
    every value checked and every required option present, before the command does any work."""
    values: dict[str, Any] = {}
    for f in option_fields(cls):
        value = getattr(args, f.name, None)
        if f.name in given or value is None:
            continue
        values[f.name] = dict(value) if _shape(typing.get_type_hints(cls)[f.name])[0] == "dict" else value
    with flag_names():
        options = cls(**values, **given)
        options.validate()
    return options


__all__ = ["Parser", "add_options", "command", "json_or_text", "likely_flag", "options_from_args", "unrecognized"]
