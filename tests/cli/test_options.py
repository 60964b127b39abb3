"""Every command-line flag is made in one place, from an options field (cli/options.py), and reads alike everywhere.

(a) nothing but the generator adds a flag (argparse's own --version apart) and nothing outside mirrorbert/cli
builds a parser; (b) every shared option is worded as settings/option_help.py words it in every command that
takes it; (c) every option's --help states its real default (or says it is required); (d) one --device default.
The trainers' fields are held to the same rules in tests/settings/test_fields.py.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from pathlib import Path

import pytest

import mirrorbert
from mirrorbert.settings.fields import field_default, flag_of, option_fields
from mirrorbert.settings.option_help import SHARED

PACKAGE = Path(mirrorbert.__file__).resolve().parent
CLI = PACKAGE / "cli"
GENERATOR = CLI / "options.py"


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            yield name, node


def _literal_flags(node: ast.Call) -> list[str]:
    return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def test_flags_are_made_only_by_the_generator():
    """`add_argument` outside cli/options.py: none; no parser outside the cli."""
    outside = [f"{path.relative_to(PACKAGE)}:{node.lineno} {name}"
               for path in sorted(PACKAGE.rglob("*.py")) if CLI not in path.parents
               for name, node in _calls(path) if name in ("ArgumentParser", "add_argument", "add_parser")]
    assert not outside, f"options defined outside mirrorbert/cli: {outside}"
    calls = [(path, node) for path in sorted(CLI.rglob("*.py")) if path != GENERATOR
             for name, node in _calls(path) if name == "add_argument"]
    assert not calls, [f"{path.name}:{node.lineno} {_literal_flags(node)}" for path, node in calls]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from mirrorbert.cli.app import build_parser
    from mirrorbert.cli.reference_mlm import build_parser as reference_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {"mirrorbert": top, **sub.choices, "reference-mlm": reference_parser()}


def _classes() -> dict[str, tuple[type, ...]]:
    """Each command's options dataclasses, as it hands them to the generator."""
    from mirrorbert.cli import encode, eval, export, gloss, push, reference_mlm, search, train
    from mirrorbert.cli.app import AppOptions
    from mirrorbert.evaluation.lexsub import GenerationConfig
    from mirrorbert.gloss.config import GlossPretrainConfig
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mlm.config import PretrainConfig
    from mirrorbert.reproduce.results import ReproduceConfig

    return {"mirrorbert": (AppOptions,), "train": (TrainConfig, train.TrainRun), "encode": (encode.EncodeOptions,),
            "search": (search.SearchOptions,), "index": (search.IndexOptions,), "export": (export.ExportOptions,),
            "push": (push.PushOptions,), "eval": (eval.EvalOptions,), "pretrain-mlm": (PretrainConfig,),
            "gloss-pretrain": (GlossPretrainConfig,), "lexsub": (gloss.LexsubOptions, GenerationConfig),
            "finetune-sts": (FinetuneStsConfig, gloss.FinetuneStsOutput), "reproduce": (ReproduceConfig,),
            "reference-mlm": (reference_mlm.ReferenceOptions,)}


def test_every_flag_is_one_field_of_its_command():
    parsers, classes = _parsers(), _classes()
    assert set(parsers) == set(classes)
    for command, parser in parsers.items():
        fields = [f for cls in classes[command] for f in option_fields(cls)]
        flags = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
        expected = {flag_of(f) for f in fields} | {s for f in fields for s in f.metadata.get("aliases", ())}
        assert flags - {"-h", "--help", "--version"} == expected, command


def test_shared_options_are_worded_alike_everywhere():
    users = {name: 0 for name in SHARED}
    for command, parser in _parsers().items():
        for action in parser._actions:
            for name, wording in SHARED.items():
                flag = "--no-progress" if name == "no_progress" else "--" + name.replace("_", "-")
                if flag in action.option_strings and action.dest in (name, name.removeprefix("no_"), "show_progress"):
                    users[name] += 1
                    assert action.help.startswith(wording.help.replace("%", "%%")), f"{command} {flag}: {action.help}"
    assert not [name for name, n in users.items() if n < 2], f"shared wordings only one command uses: {users}"


def _stated(help_text: str) -> str | None:
    """The X of the last "(default: X)" or "(default X)" in a help text (without what the presets set)."""
    found = re.findall(r"\(default:? ((?:[^()]|\([^()]*\))*)\)", help_text)
    return found[-1].split("; presets: ")[0] if found else None


def test_help_states_the_real_default_of_every_option():
    checked = 0
    classes = _classes()
    for command, parser in _parsers().items():
        fields = {f.name: f for cls in classes[command] for f in option_fields(cls)}
        for action in parser._actions:
            f = fields.get(action.dest)
            if f is None or action.help == argparse.SUPPRESS:
                continue
            if f.metadata.get("required"):
                assert action.help.endswith("(required)"), f"{command} {flag_of(f)}"
                continue
            if "default" in f.metadata["help"].lower():  # the field words its default itself
                continue
            stated = _stated(action.help)
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                assert stated == "off", f"{command} {flag_of(f)}"
                continue
            value = field_default(f)
            if isinstance(value, (list, tuple)) and value:
                value = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in value)
            unset = f.metadata.get("unset")
            expected = unset if value in (None, [], (), {}) and unset else "none" if value in (None, [], (), {}) \
                else str(value)
            assert stated.replace("%%", "%") == expected, f"{command} {flag_of(f)}: says {stated}, is {value!r}"
            checked += 1
    assert checked >= 100


def test_every_parser_takes_no_abbreviation():
    for command, parser in _parsers().items():
        assert parser.allow_abbrev is False, command


@pytest.mark.parametrize("command", ["encode", "search", "index", "eval", "lexsub", "reproduce", "pretrain-mlm",
                                     "gloss-pretrain", "finetune-sts"])
def test_device_defaults_to_auto_except_where_a_config_fills_it(command):
    """One --device default: auto (train keeps None, so that its --config file or preset can set it)."""
    action = next(a for a in _parsers()[command]._actions if "--device" in a.option_strings)
    assert action.default == "auto" and action.help.endswith("(default: auto)")
    train = next(a for a in _parsers()["train"]._actions if "--device" in a.option_strings)
    assert train.default is None and train.help.endswith("(default: auto)")


def test_options_dataclasses_take_keywords_only():
    for classes in _classes().values():
        for cls in classes:
            assert all(f.kw_only for f in dataclasses.fields(cls)), cls.__name__
