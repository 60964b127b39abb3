"""An option is declared once, on its config field: its flag, its --help, its checks, whether a resume may change
it, whether a preset sets it and whether the model card shows it all come from that field (settings/fields.py).

The expected sets below are written out: a change to what a resume, a preset or the card takes shows here.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from mirrorbert.gloss.config import GlossPretrainConfig
from mirrorbert.mirror.config import PRESETS, UNPRESET_DEFAULTS, TrainConfig
from mirrorbert.mlm.config import PretrainConfig
from mirrorbert.errors import UserError
from mirrorbert.settings.fields import (FROM_PRESET, field_default, field_defaults, flag_names, flag_of, names_with,
                                        option, option_fields)
from mirrorbert.settings.run_options import RunOptions

CONFIGS = {"train": TrainConfig, "pretrain-mlm": PretrainConfig, "gloss-pretrain": GlossPretrainConfig}
# Flags a trainer takes besides its config's fields.
EXTRA_FLAGS = {"train": {"--push-to-hub", "--config"}, "pretrain-mlm": set(), "gloss-pretrain": set()}

# What a resume could change before the options were declared on their fields (the three RESUME_HARMLESS
# tuples), plus `threads` in Mirror-BERT (a thread count changes no result) and gloss-pretrain's new
# `threads` and `log_every`, and train's new `header`.
RUN_SAFE = {"output", "overwrite", "resume", "checkpoint_dir", "keep_checkpoints", "save_every", "log_dir",
            "log_every", "show_progress", "device", "threads", "trust_remote_code"}
RESUME_SAFE = {
    "train": RUN_SAFE | {"steps", "epochs", "model", "data", "column", "field", "header", "words_top", "lang",
                         "random_strings", "limit", "skip_bad_lines", "eval_after", "data_dir"},
    "pretrain-mlm": RUN_SAFE | {"corpus", "model", "tokenizer", "cache_dir", "epochs", "max_tokens", "eval_every",
                                "eval_sequences", "stop_after_steps", "prefetch_batches"},
    "gloss-pretrain": RUN_SAFE | {"model", "triplets", "data_dir", "limit", "export_triplets", "epochs", "steps",
                                  "eval_batch_size"},
}
# The model card's settings, in the card's order.
CARD = ("preset", "temperature", "loss", "mask_span", "mask_unit", "mask_min_chars", "dropout", "drophead",
        "controlled_dropout", "pooling", "max_length", "lr", "weight_decay", "schedule", "warmup_steps",
        "max_grad_norm", "batch_size", "epochs", "steps", "seed", "precision")
# Every field name each config had before they shared RunOptions (gloss-pretrain gained threads and log_every,
# train header: --no-header).
FIELD_NAMES = {
    "train": {"model", "output", "overwrite", "preset", "data", "column", "field", "header", "words_top", "lang",
              "random_strings", "limit", "skip_bad_lines", "temperature", "mask_span", "dropout", "drophead",
              "controlled_dropout", "pooling", "max_length", "mask_unit", "mask_min_chars", "loss", "lr",
              "weight_decay", "schedule", "warmup_steps", "max_grad_norm", "batch_size", "epochs", "steps", "seed",
              "device", "precision", "packing", "threads", "compile", "gradient_checkpointing", "grad_cache_chunk",
              "save_every", "checkpoint_dir", "keep_checkpoints", "resume", "log_dir", "log_every", "show_progress",
              "eval_after", "data_dir", "trust_remote_code"},
    "pretrain-mlm": {"corpus", "output", "overwrite", "model", "architecture", "tokenizer", "seq_length",
                     "mlm_probability", "whole_word_mask", "eval_fraction", "cache_dir", "lr", "weight_decay",
                     "warmup_steps", "max_grad_norm", "batch_size", "grad_accum", "max_tokens", "epochs", "seed",
                     "device", "precision", "threads", "eval_every", "eval_sequences", "save_every",
                     "checkpoint_dir", "keep_checkpoints", "resume", "stop_after_steps", "log_dir", "log_every",
                     "show_progress", "prefetch_batches", "trust_remote_code"},
    "gloss-pretrain": {"model", "output", "triplets", "data_dir", "overwrite", "holdout", "limit", "export_triplets",
                       "arch", "lam", "tau", "mlm_prob", "hard_negatives", "max_length", "max_gloss_length", "lr",
                       "weight_decay", "warmup", "batch_size", "epochs", "steps", "max_grad_norm", "seed", "device",
                       "precision", "eval_batch_size", "save_every", "checkpoint_dir", "keep_checkpoints", "resume",
                       "log_dir", "show_progress", "trust_remote_code", "threads", "log_every"},
}


def _command(name: str) -> argparse.ArgumentParser:
    from mirrorbert.cli.app import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_every_field_is_one_flag_with_the_fields_help(command):
    config, parser = CONFIGS[command], _command(command)
    actions = {flag: action for action in parser._actions for flag in action.option_strings}
    fields = dataclasses.fields(config)
    assert {f.name for f in fields} == FIELD_NAMES[command]  # every field name kept
    for f in fields:
        action = actions.get(flag_of(f))
        assert action is not None, f"{command}: no flag for {f.name}"
        assert action.dest == f.name
        assert action.help.replace("%%", "%").startswith(f.metadata["help"]), f"{command} {flag_of(f)}"
        assert "default" in action.help.lower() or action.help.endswith("(required)"), \
            f"{command} {flag_of(f)}: no default stated"
    by_dest = [a.dest for a in parser._actions if a.option_strings and a.dest != "help"]
    assert sorted(by_dest) == sorted({f.name for f in fields} | {"config_file" if x == "--config" else
                                                                  x.lstrip("-").replace("-", "_")
                                                                  for x in EXTRA_FLAGS[command]})


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_cli_defaults_are_the_fields(command):
    """pretrain-mlm and gloss-pretrain parse to the fields' defaults; train leaves each at None (a --config file
    or preset fills it) and --help states the field's."""
    parser = _command(command)
    for f in dataclasses.fields(CONFIGS[command]):
        action = next(a for a in parser._actions if flag_of(f) in a.option_strings)
        assert action.default == (None if command == "train" else field_default(f)), f"{command} {f.name}"


def test_resume_safe_names_are_the_old_lists():
    for command, config in CONFIGS.items():
        assert set(names_with(config, "resume_safe")) == RESUME_SAFE[command], command


def test_the_run_options_are_shared_and_redeclared_only_where_they_differ():
    run = {f.name for f in dataclasses.fields(RunOptions)}
    for config in CONFIGS.values():
        assert run <= {f.name for f in dataclasses.fields(config)}
        assert issubclass(config, RunOptions)
    assert (TrainConfig().precision, TrainConfig().log_every) == ("auto", 10)
    assert (PretrainConfig().precision, PretrainConfig().log_every) == ("fp32", 50)
    assert (GlossPretrainConfig().precision, GlossPretrainConfig().log_every) == ("auto", 1)
    assert names_with(TrainConfig, "command_line_only") == ("trust_remote_code",)


def test_presets_set_only_preset_fields_and_help_states_their_values():
    assert set(names_with(TrainConfig, "preset")) == {key for values in PRESETS.values() for key in values}
    assert UNPRESET_DEFAULTS == {name: getattr(TrainConfig(), name) for name in names_with(TrainConfig, "preset")}
    actions = {a.dest: a for a in _command("train")._actions}
    for name in names_with(TrainConfig, "preset"):
        text = " ".join(actions[name].help.split())
        for preset, values in PRESETS.items():
            if name in values and values[name] is not None:
                assert f"{preset} {values[name]}" in text, f"--{name}: {preset} preset's value"
    pooling = " ".join(actions["pooling"].help.split())
    assert "sentence mean (BERT models) or cls (others)" in pooling  # the preset's None, in words
    assert "--preset sets its own" not in _command("train").format_help()


def test_card_names_are_the_cards_settings():
    assert names_with(TrainConfig, "card") == CARD


def test_adding_an_option_is_one_field(tmp_path):
    """A new field with its facts, and nothing else edited: its flag with its help and default, its range checked
    (in the command line's words and in Python's), a config file's key, resume-safe, shown in the card, set by no
    preset."""
    from mirrorbert.cli.options import add_options
    from mirrorbert.cli.train import GROUPS
    from mirrorbert.mirror.config import load_config_file

    @dataclasses.dataclass(kw_only=True)
    class WithNewOption(TrainConfig):
        view_noise: float = option(0.0, help="noise added to the second view", range="[0, 1)", group="method",
                                   resume_safe=True, card=True)

    parser = argparse.ArgumentParser()
    add_options(parser, WithNewOption, titles=GROUPS, leave_unset=True)
    action = next(a for a in parser._actions if "--view-noise" in a.option_strings)
    assert (action.type, action.default, action.help) == (float, None, "noise added to the second view (default: 0.0)")
    assert parser.parse_args(["--view-noise", "0.5"]).view_noise == 0.5
    assert WithNewOption(view_noise=0.25).to_dict()["view_noise"] == 0.25
    with pytest.raises(UserError, match=r"^view_noise=1.5: outside \[0, 1\)$"):
        WithNewOption(view_noise=1.5)
    with flag_names(), pytest.raises(UserError, match=r"^--view-noise 1.5: outside \[0, 1\)$"):
        WithNewOption(view_noise=1.5)
    config = tmp_path / "run.yaml"
    config.write_text("view-noise: 0.125\n", encoding="utf-8")
    assert load_config_file(config, WithNewOption) == {"view_noise": 0.125}
    assert "view_noise" in names_with(WithNewOption, "resume_safe")
    assert "view_noise" in names_with(WithNewOption, "card")
    assert "view_noise" not in names_with(WithNewOption, "preset")


def test_own_options_come_before_the_shared_run_options():
    names = [f.name for f in option_fields(PretrainConfig)]
    run = [f.name for f in dataclasses.fields(RunOptions)]
    assert names[-len(run):] == run and names[0] == "corpus"


def test_preset_fields_are_unfilled_until_the_config_is_made():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert fields["temperature"].default is FROM_PRESET
    assert field_defaults(TrainConfig)["temperature"] == 0.04
    assert TrainConfig(preset="word").temperature == PRESETS["word"]["temperature"]


def test_option_refuses_a_field_without_help_an_unknown_fact_or_a_malformed_range():
    with pytest.raises(ValueError, match="exactly one"):
        option(1)
    with pytest.raises(ValueError, match="unknown"):
        option(1, help="x", resumable=True)
    with pytest.raises(ValueError, match="not an interval"):
        option(1, help="x", range="0..1")


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_help_imports_nothing_heavy(command):
    from support import heavy_modules_after

    code = f"from mirrorbert.cli.app import main\ntry:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
    assert heavy_modules_after(code) == []


def test_the_sentence_transformers_loss_and_collator_take_their_defaults_from_the_fields():
    import inspect

    pytest.importorskip("sentence_transformers")
    from mirrorbert.integrations.sentence_transformers import MirrorBertDataCollator, MirrorBertLoss

    sentence = TrainConfig(preset="sentence")
    defaults = {name: p.default for fn in (MirrorBertLoss.__init__, MirrorBertDataCollator)
                for name, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty}
    assert {name: defaults[name] for name in ("temperature", "loss", "mask_span", "mask_min_chars", "seed",
                                              "mask_unit")} == \
        {name: getattr(sentence, name) for name in ("temperature", "loss", "mask_span", "mask_min_chars", "seed",
                                                    "mask_unit")}
