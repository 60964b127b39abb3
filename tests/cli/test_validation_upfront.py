"""Every user mistake of issue 11 (sections 2-3) ends in one `mirrorbert: error:` line, exit 2, raised
before any model weights are loaded (the `no_weights` fixture makes loading weights fail the test)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mirrorbert.cli.app import build_parser, main
from mirrorbert.compat import installed_version
from mirrorbert.errors import UserError

REPO = Path(__file__).resolve().parents[2]


class WeightsLoaded(AssertionError):
    pass


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to load model weights fails the test: the error must come before."""
    import transformers

    def refuse(*args, **kwargs):
        raise WeightsLoaded(f"weights loaded: {args[:1]}")

    for name in ("AutoModel", "AutoModelForMaskedLM"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def run_cli(capsys, argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def truncated_bert(tiny_bert, tmp_path) -> Path:
    folder = copy_model(tiny_bert, tmp_path / "truncated")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return folder


# --------------------------------------------------------------------------- max length
def test_train_max_length_beyond_positions(capsys, no_weights, tiny_bert, strings_file, tmp_path):
    code, err = run_cli(capsys, ["train", "--model", tiny_bert, "--data", strings_file, "--output",
                                 tmp_path / "out", "--max-length", 600, "--no-progress"])
    assert code == 2
    line = one_error_line(err)
    assert "--max-length 600" in line and "at most 64" in line


@pytest.mark.parametrize("value, expected", [("600", "at most 64"), ("-5", "must be an integer >= 1")])
def test_encode_max_length(capsys, no_weights, tiny_bert, strings_file, tmp_path, value, expected):
    code, err = run_cli(capsys, ["encode", "--model", tiny_bert, "--input", strings_file, "--output",
                                 tmp_path / "v.npy", "--max-length", value])
    assert code == 2
    assert expected in one_error_line(err)
    assert not (tmp_path / "v.npy").exists()


def test_eval_max_length(capsys, no_weights, tiny_bert, tmp_path):
    code, err = run_cli(capsys, ["eval", "--model", tiny_bert, "--tasks", "sts", "--data-dir", tmp_path,
                                 "--max-length", 600])
    assert code == 2
    assert "--max-length 600" in one_error_line(err)


def test_roberta_padding_offset(tiny_roberta):
    from mirrorbert.encoder.source import open_model

    with open_model(tiny_roberta) as handle:
        handle.check_max_length(62)  # 64 positions, pad id 1: 62 usable
        with pytest.raises(UserError, match="at most 62"):
            handle.check_max_length(63)


# --------------------------------------------------------------------------- languages, types, files
@pytest.mark.parametrize("lang", ["5", "", "xx"])
def test_words_top_bad_language(capsys, lang, tmp_path):
    code, err = run_cli(capsys, ["train", "--words-top", 10, "--lang", lang, "--output", tmp_path / "o"])
    assert code == 2
    assert "--lang" in one_error_line(err)


@pytest.mark.parametrize("values, message", [({"preset": ["word"]}, "preset= must be text, not a list"),
                                             ({"model": 123}, "model= must be text, not 123 (int)"),
                                             ({"lang": 5}, "lang= must be text, not 5 (int)"),
                                             ({"pooling": ["cls"]}, "pooling= must be text, not a list")])
def test_wrong_types_passed_programmatically(values, message):
    """Named as Python names them (`preset=`), whether through resolve_config or TrainConfig itself."""
    from mirrorbert.mirror.config import TrainConfig, resolve_config

    with pytest.raises(UserError) as info:
        resolve_config(values)
    assert str(info.value) == message
    with pytest.raises(UserError) as info:
        TrainConfig(**values)
    assert str(info.value) == message


def test_unreadable_data_file(capsys, monkeypatch, strings_file, tmp_path, tiny_bert):
    real_open = os.open

    def guarded(path, *args, **kwargs):  # root reads any file: an unreadable one is simulated
        if os.fspath(path) == str(strings_file):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)
    code, err = run_cli(capsys, ["train", "--data", strings_file, "--output", tmp_path / "o", "--model", tiny_bert])
    assert code == 2
    line = one_error_line(err)
    assert "permission denied" in line and str(strings_file) in line


def test_unreadable_config_file_is_one_line(capsys, monkeypatch, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("lr: 0.1\n", encoding="utf-8")
    real_open = os.open

    def denied(path, *args, **kwargs):  # root reads any file: an unreadable one is simulated
        if os.fspath(path) == str(config):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    code, err = run_cli(capsys, ["train", "--config", config, "--random-strings", 10, "--output", tmp_path / "o"])
    assert code == 2
    assert str(config) in one_error_line(err) and "permission denied" in err


# --------------------------------------------------------------------------- broken model folders
@pytest.mark.parametrize("command", ["train", "encode", "eval", "finetune-sts"])
def test_truncated_weights_encoder_commands(capsys, truncated_bert, strings_file, tmp_path, command, request):
    data_dir = request.getfixturevalue("shared_data") if command == "finetune-sts" else tmp_path
    argv = {
        "train": ["train", "--model", truncated_bert, "--data", strings_file, "--output", tmp_path / "o",
                  "--no-progress"],
        "encode": ["encode", "--model", truncated_bert, "--input", strings_file, "--output", tmp_path / "v.npy"],
        "eval": ["eval", "--model", truncated_bert, "--tasks", "sts", "--data-dir", tmp_path],
        "finetune-sts": ["finetune-sts", "--model", truncated_bert, "--data-dir", data_dir, "--no-progress"],
    }[command]
    code, err = run_cli(capsys, argv)
    assert code == 2
    line = one_error_line(err)
    assert "model.safetensors" in line and "truncated" in line


def test_truncated_weights_pretrain_mlm(capsys, truncated_bert, strings_file, tmp_path):
    code, err = run_cli(capsys, ["pretrain-mlm", "--model", truncated_bert, "--corpus", strings_file,
                                 "--output", tmp_path / "o", "--seq-length", 32, "--no-progress"])
    assert code == 2
    assert "model.safetensors" in one_error_line(err)


def test_truncated_weights_gloss(truncated_bert):
    from mirrorbert.encoder.masked_lm import load_masked_lm  # the loader gloss-pretrain starts from

    with pytest.raises(UserError, match="model.safetensors"):
        load_masked_lm(str(truncated_bert))


def test_truncated_weights_lexsub(truncated_bert, shared_data):
    from mirrorbert.evaluation.lexsub import evaluate_lexsub

    with pytest.raises(UserError, match="model.safetensors"):
        evaluate_lexsub(str(truncated_bert), "LS07", shared_data, limit=2)


def test_loader_error_of_damaged_weights_is_one_line(truncated_bert, monkeypatch):
    """The header check is skipped here, so safetensors' own error reaches the loading helper."""
    import mirrorbert.encoder.source as source
    import mirrorbert.safeguards.model_files as model_files
    from mirrorbert.encoder.model import Encoder

    monkeypatch.setattr(model_files, "_keep_weights", lambda model, rel, fd: None)
    monkeypatch.setattr(source, "_check_weights_match", lambda handle, config: None)
    with pytest.raises(UserError, match="cannot read the weights"):
        Encoder.load(str(truncated_bert))


def test_model_without_tokenizer_files_is_refused(capsys, no_weights, tiny_bert, strings_file, tmp_path):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert / name, folder / name)
    code, err = run_cli(capsys, ["train", "--model", folder, "--data", strings_file, "--output", tmp_path / "o"])
    assert code == 2
    assert "tokenizer" in one_error_line(err)


def test_empty_tokenizer_is_refused(tiny_bert):
    from transformers import AutoTokenizer

    from mirrorbert.encoder.source import _check_tokenizer

    def check_tokenizer(tokenizer, name):
        _check_tokenizer(tokenizer, name, "--model")

    check_tokenizer(AutoTokenizer.from_pretrained(str(tiny_bert)), "ok")
    empty = tiny_bert.parent / "empty-tokenizer"
    empty.mkdir(exist_ok=True)
    shutil.copy(tiny_bert / "config.json", empty / "config.json")
    if installed_version("transformers") < (5,):  # 4.x refuses a folder without tokenizer files itself
        with pytest.raises(OSError):
            AutoTokenizer.from_pretrained(str(empty))
        return
    with pytest.raises(UserError, match="tokenizer is empty"):
        check_tokenizer(AutoTokenizer.from_pretrained(str(empty)), str(empty))


def test_mask_span_needs_mask_token_before_weights(capsys, no_weights, tiny_bert, strings_file, tmp_path):
    from transformers import AutoTokenizer

    folder = copy_model(tiny_bert, tmp_path / "no-mask")
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.mask_token = None
    tok.save_pretrained(folder)
    assert AutoTokenizer.from_pretrained(str(folder)).mask_token_id is None
    code, err = run_cli(capsys, ["train", "--model", folder, "--data", strings_file, "--output", tmp_path / "o",
                                 "--mask-span", 2])
    assert code == 2
    assert "mask token" in one_error_line(err)


def test_causal_lm_warns_once(tiny_bert, tmp_path, caplog):
    from transformers import GPT2Config

    from mirrorbert.encoder.source import open_model
    from mirrorbert.safeguards.preflight import is_decoder_config

    assert is_decoder_config(GPT2Config())
    folder = copy_model(tiny_bert, tmp_path / "decoder")
    config = json.loads((folder / "config.json").read_text())
    config["is_decoder"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="mirrorbert.encoder.source"):
        for model in (folder, tiny_bert):
            with open_model(model) as handle:
                handle.warn_if_decoder()
    warnings = [r for r in caplog.records if "decoder" in r.getMessage()]
    assert len(warnings) == 1


def test_mask_span_that_never_applies_warns(caplog, tiny_bert):
    from transformers import AutoTokenizer

    from mirrorbert.mirror.views import SecondViews, special_token_ids, tokenize_once, valid_span_starts

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    strings = ["the dog", "the dog runs"]
    ids = tokenize_once(tok, strings, 16)
    special = special_token_ids(tok)
    longest = max(sum(1 for t in s if t not in special) for s in ids)

    def warns(k: int) -> bool:
        return SecondViews.from_lists(tok, strings, ids, "token", k, 30, 16).warn_if_never_applies()

    with caplog.at_level(logging.WARNING, logger="mirrorbert.mirror.views"):
        assert warns(longest)
        assert not warns(longest - 1)
        assert not warns(0)
    assert len([r for r in caplog.records if "never applies" in r.getMessage()]) == 1
    # the warning agrees with the masking rule itself
    assert not any(valid_span_starts(s, longest, special) for s in ids)
    assert any(valid_span_starts(s, 2, special) for s in ids)


# --------------------------------------------------------------------------- pretrain-mlm, gloss
def test_pretrain_seq_length_beyond_positions(capsys, no_weights, tiny_bert, strings_file, tmp_path):
    code, err = run_cli(capsys, ["pretrain-mlm", "--model", tiny_bert, "--corpus", strings_file,
                                 "--output", tmp_path / "o", "--seq-length", 100000])
    assert code == 2
    assert "--seq-length 100000" in one_error_line(err)


def test_pretrain_seq_length_architecture_before_allocating(capsys, monkeypatch, tiny_bert, strings_file, tmp_path):
    import transformers

    def refuse(*args, **kwargs):
        raise WeightsLoaded("model allocated")

    monkeypatch.setattr(transformers.AutoModelForMaskedLM, "from_config", refuse)
    code, err = run_cli(capsys, ["pretrain-mlm", "--architecture", "bert-tiny", "--tokenizer", tiny_bert,
                                 "--corpus", strings_file, "--output", tmp_path / "o", "--seq-length", 100000])
    assert code == 2
    assert "--seq-length 100000" in one_error_line(err)


def test_pretrain_binary_corpus_refused_like_train(capsys, no_weights, tiny_bert, tmp_path):
    corpus = tmp_path / "binary.txt"
    corpus.write_bytes(b"a fine line\n" + bytes(range(128, 256)) * 4 + b"\n")
    code, err = run_cli(capsys, ["pretrain-mlm", "--model", tiny_bert, "--corpus", corpus,
                                 "--output", tmp_path / "o", "--seq-length", 32])
    assert code == 2
    assert f"{corpus}:2: not valid UTF-8" in one_error_line(err)
    code, err = run_cli(capsys, ["train", "--model", tiny_bert, "--data", corpus, "--output", tmp_path / "o"])
    assert code == 2
    assert f"{corpus}:2: not valid UTF-8" in one_error_line(err)


def test_gloss_triplets_binary(tmp_path):
    from mirrorbert.gloss.triplets import load_triplets_tsv

    path = tmp_path / "triplets.tsv"
    path.write_bytes(b"bank\tthe bank\ta river side\n\xff\xfe\x00binary\n")
    with pytest.raises(UserError, match="triplets.tsv:2: not valid UTF-8"):
        load_triplets_tsv(path)


# --------------------------------------------------------------------------- eval
def test_eval_every_set_missing_exits_non_zero(capsys, tiny_bert, tmp_path):
    code = main(["eval", "--model", str(tiny_bert), "--tasks", "sts,wordsim", "--data-dir", str(tmp_path)])
    assert code == 2
    assert "nothing was evaluated" in one_error_line(capsys.readouterr().err)


def test_eval_unknown_task_option(capsys, no_weights, tiny_bert, tmp_path):
    code, err = run_cli(capsys, ["eval", "--model", tiny_bert, "--tasks", "sts", "--data-dir", tmp_path,
                                 "--option", "sts.bogus=1"])
    assert code == 2
    line = one_error_line(err)
    assert "sts.bogus" in line and "include_dev" in line


def test_eval_known_task_option_accepted():
    from mirrorbert.evaluation.runner import check_task_options

    check_task_options({"sts": {"include_dev": False, "sets": ["stsb"]}})
    with pytest.raises(UserError, match="unknown task"):
        check_task_options({"nope": {"x": 1}})


def test_eval_reference_model_blamed(capsys, no_weights, tiny_bert, tmp_path):
    code, err = run_cli(capsys, ["eval", "--model", tiny_bert, "--tasks", "isotropy", "--data-dir", tmp_path,
                                 "--reference-model", tmp_path / "nope"])
    assert code == 2
    line = one_error_line(err)
    assert "--reference-model" in line and "--model " not in line.replace("--reference-model", "")


def test_eval_refuses_existing_output_unless_overwrite(capsys, no_weights, tiny_bert, tmp_path):
    data = tmp_path / "data"  # outputs may not lie inside the data directory
    data.mkdir()
    for option in ("--output", "--report"):
        existing = tmp_path / f"existing{option[2:]}.txt"
        existing.write_text("keep me", encoding="utf-8")
        code, err = run_cli(capsys, ["eval", "--model", tiny_bert, "--tasks", "sts", "--data-dir", data,
                                     option, existing])
        assert code == 2
        assert "--overwrite" in one_error_line(err)
        assert existing.read_text(encoding="utf-8") == "keep me"
    with pytest.raises(WeightsLoaded):  # with --overwrite it goes on to load the model
        main(["eval", "--model", str(tiny_bert), "--tasks", "sts", "--data-dir", str(data),
              "--output", str(existing), "--overwrite"])


def test_sts_absent_sets_one_info_line(tmp_path, caplog):
    from mirrorbert.errors import DatasetMissing
    from mirrorbert.evaluation.sts import evaluate_sts

    with caplog.at_level(logging.INFO, logger="mirrorbert.evaluation"):
        with pytest.raises(DatasetMissing):
            evaluate_sts(object(), tmp_path)
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "absent" in infos[0].getMessage()


# --------------------------------------------------------------------------- CLI surface
def test_unknown_subcommand_option_is_one_line_naming_where_the_options_are(capsys):
    assert main(["train", "--bogus"]) == 2
    assert capsys.readouterr().err == ("mirrorbert: error: unrecognized option --bogus (mirrorbert train --help "
                                       "lists the options)\n")


def test_every_option_states_its_default():
    import argparse

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.dest == "help" or (action.help or "").endswith("(required)"):
                continue
            if action.help == argparse.SUPPRESS:  # hidden spellings kept for old scripts: not in --help
                continue
            text = (action.help or "") % {"default": action.default, "prog": name}
            if "default" not in text.lower():
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing


def test_pretrain_help_percent(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain-mlm", "--help"])
    out = capsys.readouterr().out
    assert "15% of tokens" in out and "%%" not in out


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_cli_validation_does_not_import_torch(tmp_path):
    run = _run_python(
        "import sys; from mirrorbert.cli.app import main\n"
        f"rc = main(['train', '--lr', '-1', '--random-strings', '10', '--output', {str(tmp_path / 'o')!r}])\n"
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    assert run.stdout.split() == ["2", "False", "False"], run.stderr
    assert "--lr" in run.stderr


def test_python_dash_m_mirrorbert():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run([sys.executable, "-m", "mirrorbert", "--version"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("mirrorbert ")


def test_progress_bar_quiet_off_a_tty(monkeypatch):
    import io

    from mirrorbert.reporting import progress

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = progress.progress_bar(range(3), show=True)  # off a terminal: plain lines at a steady interval
    assert isinstance(bar, progress.LogProgress) and bar.interval == progress.progress_interval()
    bar.close()
    assert progress.progress_bar(range(3), show=False).disable


# --------------------------------------------------------------------------- mean loss
def test_mean_loss_of_last_epoch(tiny_bert, tmp_path, corpus, monkeypatch):
    import mirrorbert.mirror.loss as loss_module
    import mirrorbert.mirror.train as trainer_module
    from mirrorbert.mirror.config import TrainConfig

    losses = []
    real = loss_module.MirrorInfoNCE.forward

    def recording(self, embeddings):
        loss = real(self, embeddings)
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(loss_module.MirrorInfoNCE, "forward", recording)
    data = tmp_path / "d.txt"
    data.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    cfg = TrainConfig(model=str(tiny_bert), data=str(data), output=str(tmp_path / "out"), batch_size=4,
                      epochs=2, max_length=16, show_progress=False, device="cpu")
    result = trainer_module.train(cfg)
    per_epoch = 3  # 12 strings / 4
    assert len(losses) == 2 * per_epoch
    expected = sum(losses[per_epoch:]) / per_epoch
    assert result.info["mean_loss_last_epoch"] == pytest.approx(expected)
    # final_loss: the mean of the last min(50, steps per epoch) steps, here the last epoch; the last batch apart
    assert result.final_loss == pytest.approx(expected) and result.final_loss_window_steps == per_epoch
    assert result.last_batch_loss == pytest.approx(losses[-1])
    saved = json.loads((tmp_path / "out" / "mirrorbert.json").read_text())
    assert saved["training"]["mean_loss_last_epoch"] == pytest.approx(expected)


def test_quickstart_blames_the_data_directory_not_the_model(tmp_path):
    """Checked before setup_env.sh or any model: a missing data directory gets its own message."""
    env = {**os.environ, "MIRRORBERT_DATA": str(tmp_path / "missing"), "MODEL": "some-model"}
    run = subprocess.run(["bash", str(REPO / "scripts" / "quickstart.sh")], capture_output=True, text=True,
                         env=env, timeout=60)
    assert run.returncode == 2
    assert "data directory" in run.stderr and "could not load --model" not in run.stderr
