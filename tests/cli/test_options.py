"""Every command-line option is defined in the command layer, each shared option once (cli/options.py).

(a) nothing outside mirrorbert/cli builds a parser or adds an option; (b) no flag is written out in two
add_argument calls, nor in one when options.py defines it; (c) every command that takes a shared option
parses it as options.py says (type, action, dest, help wording first), apart from the few differences listed
here, and its --help states the real default. The trainers' flags come from their config fields
(tests/settings/test_fields.py); they are held to the same rules here.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import Counter
from pathlib import Path

import pytest

import mirrorbert
from mirrorbert.cli import options

PACKAGE = Path(mirrorbert.__file__).resolve().parent
CLI = PACKAGE / "cli"

# (command, flag) -> the argparse details that command parses differently, and why.
ALLOWED_DIFFERENCES = {
    ("pretrain-mlm", "--epochs"): {"type"},  # a budget: fractional epochs are allowed
    ("pretrain-mlm", "--corpus"): {"nargs", "metavar"},  # several text files
    ("eval", "--no-progress"): {"dest"},  # args.progress, shared with the hidden old --progress spelling
    ("eval", "--pooling"): {"choices"},  # refused by argparse, as it always was
    ("finetune-sts", "--pooling"): {"choices"},
    ("train", "--packing"): {"choices"},  # train checks it in TrainConfig (a --config file's value too)
}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            yield name, node


def _literal_flags(node: ast.Call) -> list[str]:
    return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            and a.value.startswith("--")]


def test_no_module_outside_cli_defines_options():
    offenders = [f"{path.relative_to(PACKAGE)}:{node.lineno} {name}"
                 for path in sorted(PACKAGE.rglob("*.py")) if CLI not in path.parents
                 for name, node in _calls(path) if name in ("ArgumentParser", "add_argument")]
    assert not offenders, f"options defined outside mirrorbert/cli: {offenders}"


def test_each_flag_is_written_out_once_and_shared_ones_only_in_options_py():
    seen = Counter()
    for path in sorted(CLI.rglob("*.py")):
        for name, node in _calls(path):
            if name == "add_argument":
                seen.update(_literal_flags(node))
    twice = sorted(flag for flag, n in seen.items() if n > 1)
    assert not twice, f"flags defined more than once (define them in cli/options.py): {twice}"
    shared = sorted(set(seen) & set(options.BY_FLAG))
    assert not shared, f"shared options defined outside cli/options.py: {shared}"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from mirrorbert.cli.app import build_parser
    from mirrorbert.cli.reference_mlm import build_parser as reference_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {**sub.choices, "reference-mlm": reference_parser()}


def _spec_action(spec: options.Spec) -> argparse.Action:
    """The action options.py's spec makes on its own (no command's changes)."""
    parser = argparse.ArgumentParser()
    options.add(parser, spec.name)
    return parser._actions[-1]


def test_shared_options_are_parsed_and_worded_alike_everywhere():
    users = Counter()
    for command, parser in _parsers().items():
        for action in parser._actions:
            spec = options.BY_FLAG.get(action.option_strings[0] if action.option_strings else None)
            if spec is None:
                continue
            users[spec.flag] += 1
            plain = _spec_action(spec)
            allowed = ALLOWED_DIFFERENCES.get((command, spec.flag), set())
            for attr in ("type", "dest", "nargs", "metavar", "choices"):
                if attr not in allowed:
                    assert getattr(action, attr) == getattr(plain, attr), f"{command} {spec.flag}: {attr}"
            assert type(action) is type(plain), f"{command} {spec.flag}: action"
            assert action.option_strings == plain.option_strings
            assert action.help.startswith(spec.help), f"{command} {spec.flag}: help {action.help!r}"
    unshared = sorted(flag for flag in options.BY_FLAG if users[flag] < 2)
    assert not unshared, f"options.py defines options only one command takes: {unshared}"


def _stated(help_text: str) -> str | None:
    """The X of the last "(default: X)" or "(default X)" in a help text (without what the presets set)."""
    found = re.findall(r"\(default:? ((?:[^()]|\([^()]*\))*)\)", help_text)
    return found[-1].split("; presets: ")[0] if found else None


def _trainer_fields(command: str) -> dict:
    """dest -> config field of a trainer's command (empty for the other commands)."""
    import dataclasses

    from mirrorbert.gloss.config import GlossPretrainConfig
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.mlm.config import PretrainConfig

    config = {"train": TrainConfig, "pretrain-mlm": PretrainConfig, "gloss-pretrain": GlossPretrainConfig}.get(command)
    return {f.name: f for f in dataclasses.fields(config)} if config else {}


def test_help_states_the_real_default_of_every_shared_option():
    from mirrorbert.settings.fields import field_default

    checked = 0
    for command, parser in _parsers().items():
        fields = _trainer_fields(command)
        for action in parser._actions:
            spec = options.BY_FLAG.get(action.option_strings[0] if action.option_strings else None)
            stated = _stated(action.help or "") if spec is not None else None
            if stated is None or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                continue
            field = fields.get(action.dest)
            value = field_default(field) if field is not None else action.default  # train's argparse ones are None
            unset = field.metadata.get("unset") if field is not None else spec.unset
            expected = unset if value is None and unset else "none" if value is None else str(value)
            assert stated.replace("%%", "%") == expected, f"{command} {spec.flag}: says {stated}, is {value!r}"
            checked += 1
    assert checked >= 50


@pytest.mark.parametrize("command", ["encode", "search", "index", "eval", "lexsub", "reproduce", "pretrain-mlm",
                                     "gloss-pretrain", "finetune-sts"])
def test_device_defaults_to_auto_except_where_a_config_fills_it(command):
    """One --device default: auto (train keeps None, so that its --config file or preset can set it)."""
    action = next(a for a in _parsers()[command]._actions if "--device" in a.option_strings)
    assert action.default == "auto" and action.help.endswith("(default: auto)")
    train = next(a for a in _parsers()["train"]._actions if "--device" in a.option_strings)
    assert train.default is None and train.help.endswith("(default: auto)")
