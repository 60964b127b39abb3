"""One resolution path: a command's Python entry point and its CLI give the same settings for the same inputs.

`train` resolves presets in `TrainConfig` itself (tests/mirror/test_config.py); the other commands with a
Python config dataclass must not keep a second set of defaults in argparse that could drift from it.
"""

from __future__ import annotations

import dataclasses

import pytest

from mirrorbert.cli.app import build_parser

REQUIRED = {"pretrain-mlm": ["--corpus", "c.txt", "--output", "o"],
            "gloss-pretrain": ["--model", "m", "--output", "o"]}


def _config_class(command: str):
    if command == "pretrain-mlm":
        from mirrorbert.mlm.pretrain import PretrainConfig

        return PretrainConfig
    from mirrorbert.gloss.pretrain import GlossPretrainConfig

    return GlossPretrainConfig


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_cli_defaults_are_the_python_defaults(command):
    args = build_parser().parse_args([command, *REQUIRED[command]])
    given = {opt.lstrip("-").replace("-", "_") for opt in REQUIRED[command][::2]}
    checked = 0
    for f in dataclasses.fields(_config_class(command)):
        if f.name in given or not hasattr(args, f.name):
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(args, f.name) == default, f"{command} --{f.name.replace('_', '-')}"
        checked += 1
    assert checked >= 10  # the comparison really covered the options
