"""Training-string readers and configuration resolution."""

import dataclasses
import json

import pytest

from mirrorbert.mirror.config import PRESETS, TrainConfig, resolve_config, resolve_pooling
from mirrorbert.data.strings import builtin_strings, load_training_strings, random_strings
from mirrorbert.errors import UserError


def test_txt_blanks_and_duplicates(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("one\n\n  two \none\nthree\r\n", encoding="utf-8")
    got = load_training_strings(data=str(p))
    assert got.strings == ["one", "two", "three"]
    assert (got.n_read, got.n_blank, got.n_duplicates) == (5, 1, 1)


def test_csv_tsv_jsonl(tmp_path):
    (tmp_path / "a.csv").write_text('id,text\n1,"hello, world"\n2,bye\n', encoding="utf-8")
    (tmp_path / "a.tsv").write_text("text\tid\nfoo\t1\nbar\t2\n", encoding="utf-8")
    (tmp_path / "a.jsonl").write_text('{"t": "x y"}\n\n{"t": "z"}\n', encoding="utf-8")
    assert load_training_strings(data=str(tmp_path / "a.csv"), column="text").strings == ["hello, world", "bye"]
    assert load_training_strings(data=str(tmp_path / "a.tsv"), column="text").strings == ["foo", "bar"]
    assert load_training_strings(data=str(tmp_path / "a.jsonl"), field="t").strings == ["x y", "z"]
    with pytest.raises(UserError, match="--column"):
        load_training_strings(data=str(tmp_path / "a.csv"))
    with pytest.raises(UserError, match=r"'nope' not in the header \(columns: id, text\)"):
        load_training_strings(data=str(tmp_path / "a.csv"), column="nope")
    (tmp_path / "b.jsonl").write_text('{"t": "ok"}\n{broken\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"b.jsonl:2: invalid JSON"):
        load_training_strings(data=str(tmp_path / "b.jsonl"), field="t")


def test_bad_utf8_names_file_and_line_or_is_skipped(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"good line\nalso good\nbad \xff\xfe line\nlast\n")
    with pytest.raises(UserError, match=r"bad.txt:3: not valid UTF-8.*--skip-bad-lines"):
        load_training_strings(data=str(p))
    got = load_training_strings(data=str(p), skip_bad_lines=True)
    assert got.strings == ["good line", "also good", "last"] and got.n_bad_lines == 1


def test_missing_empty_and_too_few(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_training_strings(data=str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UserError, match="empty"):
        load_training_strings(data=str(tmp_path / "empty.txt"))
    (tmp_path / "one.txt").write_text("same\nsame\n\n")
    with pytest.raises(UserError, match="at least 2 distinct"):
        load_training_strings(data=str(tmp_path / "one.txt"))


def test_limit_is_seeded_and_keeps_order(tmp_path):
    p = tmp_path / "n.txt"
    p.write_text("\n".join(f"s{i}" for i in range(100)))
    a = load_training_strings(data=str(p), limit=10, seed=1).strings
    b = load_training_strings(data=str(p), limit=10, seed=1).strings
    c = load_training_strings(data=str(p), limit=10, seed=2).strings
    assert a == b and a != c and len(a) == 10
    assert a == sorted(a, key=lambda s: int(s[1:]))


def test_builtin_sources():
    words = builtin_strings(words_top=50, lang="en").strings
    assert len(words) == 50 and "the" in words
    with pytest.raises(UserError, match="--lang"):
        builtin_strings(words_top=5, lang="xx-nope")
    rand = random_strings(20, seed=3)
    assert rand == random_strings(20, seed=3) and all(s.isalnum() and s.islower() or s.isdigit() for s in rand)


def test_presets_match_the_paper():
    word = resolve_config({"preset": "word"})
    assert (word.temperature, word.mask_span, word.epochs, word.max_length, word.pooling) == (0.2, 0, 2, 25, "cls")
    phrase = resolve_config({"preset": "phrase"})
    assert (phrase.temperature, phrase.mask_span, phrase.epochs, phrase.max_length) == (0.04, 2, 2, 25)
    sent = resolve_config({"preset": "sentence"})
    assert (sent.temperature, sent.mask_span, sent.epochs, sent.max_length) == (0.04, 5, 1, 50)
    # the paper's k counts characters (the authors' code): one mask token per span, strings > 30 chars
    assert (phrase.mask_unit, sent.mask_unit, sent.mask_min_chars, sent.loss) == ("char", "char", 30, "infonce")
    assert resolve_config({"preset": "sentence", "mask_unit": "token"}).mask_unit == "token"
    assert resolve_pooling(sent.pooling, "bert") == "mean" and resolve_pooling(sent.pooling, "roberta") == "cls"
    assert (sent.lr, sent.batch_size, sent.dropout, sent.weight_decay) == (2e-5, 200, 0.1, 0.01)
    assert set(PRESETS) == {"word", "phrase", "sentence"}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_python_config_applies_the_preset_like_the_cli(preset):
    """`TrainConfig(preset=...)` in Python resolves through the same code as the CLI and config files."""
    from mirrorbert.mirror.config import TrainConfig

    assert TrainConfig(preset=preset) == resolve_config({"preset": preset})
    for key, value in PRESETS[preset].items():
        assert getattr(TrainConfig(preset=preset), key) == value, key
    # explicit arguments win over the preset, as on the command line
    mine = TrainConfig(preset=preset, temperature=0.5, max_length=7, pooling="mean")
    assert (mine.temperature, mine.max_length, mine.pooling) == (0.5, 7, "mean")
    assert mine == resolve_config({"preset": preset, "temperature": 0.5, "max_length": 7, "pooling": "mean"})
    # keywords only (the shared run options come first in field order); a copy keeps what was resolved
    with pytest.raises(TypeError):
        TrainConfig("m", None, False, preset)
    assert dataclasses.replace(mine, seed=3).temperature == 0.5


def test_config_file_preset_resolves_like_python(tmp_path):
    from mirrorbert.mirror.config import TrainConfig

    yml = tmp_path / "c.yaml"
    yml.write_text("preset: word\nmax-length: 12\n")
    assert resolve_config({}, config_file=yml) == TrainConfig(preset="word", max_length=12)
    assert resolve_config({"preset": "phrase"}, config_file=yml) == TrainConfig(preset="phrase", max_length=12)


def test_config_file_and_overrides_precedence(tmp_path):
    yml = tmp_path / "c.yaml"
    yml.write_text("preset: word\ntemperature: 0.5\nbatch-size: 64\n")
    cfg = resolve_config({"batch_size": 32}, config_file=yml)
    assert (cfg.temperature, cfg.batch_size, cfg.epochs) == (0.5, 32, 2)
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"preset": "phrase", "mask_span": 3}))
    assert resolve_config({}, config_file=js).mask_span == 3
    (tmp_path / "bad.yaml").write_text("nonsense_option: 1\n")
    with pytest.raises(UserError, match="unknown option 'nonsense_option'"):
        resolve_config({}, config_file=tmp_path / "bad.yaml")


@pytest.mark.parametrize("overrides,message", [
    ({"preset": "huge"}, "preset='huge': not one of word, phrase, sentence"),
    ({"pooling": "max"}, "pooling='max': not one of cls, mean, first-last"),
    ({"precision": "fp8"}, "precision='fp8': not one of auto, fp32, bf16, fp16"),
    ({"temperature": 0}, "temperature=0.0: must be > 0"),
    ({"dropout": 1.5}, r"dropout=1.5: outside \[0, 1\)"),
    ({"batch_size": 1}, r"batch_size=1: must be an integer >= 2 \(the loss needs in-batch negatives\)"),
    ({"data": "a.txt", "words_top": 3}, "data= and words_top=: give one of them, not both"),
    ({"mask_unit": "word"}, "mask_unit='word': not one of char, token"),
    ({"mask_min_chars": -1}, "mask_min_chars=-1: must be an integer >= 0"),
    ({"loss": "triplet"}, "loss='triplet': not one of infonce, ms"),
    ({"lr": 2e5}, r"lr=200000.0: outside \(0, 1\]; did you mean 2e-05\?"),
    ({"seed": 2**32}, "seed=4294967296: must be a whole number from 0 to 4294967295"),
    ({"lr": float("nan")}, "lr=nan: must be a finite number"),
])
def test_invalid_values_name_the_option_in_pythons_words(overrides, message):
    with pytest.raises(UserError, match="^" + message):
        resolve_config(overrides)


def test_invalid_values_name_the_flag_on_the_command_line():
    from mirrorbert.settings.fields import flag_names

    with flag_names():
        with pytest.raises(UserError, match=r"^--lr 200000.0: outside \(0, 1\]; did you mean 2e-05\?$"):
            resolve_config({"lr": 2e5})
        with pytest.raises(UserError, match="^--pooling max: not one of cls, mean, first-last$"):
            resolve_config({"pooling": "max"})
        with pytest.raises(UserError, match="^--column and --field: give one of them, not both$"):
            resolve_config({"column": "a", "field": "b"})
        with pytest.raises(UserError, match=r"^--output is required \(the trained model's folder\)$"):
            TrainConfig().validate()


def test_required_output_is_asked_in_the_apis_words():
    """`mirrorbert.train(TrainConfig(...))` without output: `output= is required`, before anything is read."""
    import mirrorbert

    with pytest.raises(UserError, match=r"^output= is required \(the trained model's folder\)$"):
        mirrorbert.train(mirrorbert.TrainConfig(model="m", data="/nonexistent/strings.txt"))


@pytest.mark.parametrize("name, text", [
    ("run.yaml", "steps: 1\nlr: 1e-4\nsteps: 2\n"),
    ("run.yaml", "{steps: 1, steps: 2}\n"),
    ("run.json", '{"steps": 1, "lr": 1e-4, "steps": 2}'),
])
def test_a_config_file_naming_a_key_twice_is_refused(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        resolve_config({}, config_file=path)
    message = str(info.value)
    assert message.startswith(f"--config {path}: key 'steps' appears twice") and "\n" not in message


def test_a_config_file_naming_an_option_twice_in_two_spellings_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("batch-size: 8\nbatch_size: 16\n", encoding="utf-8")
    with pytest.raises(UserError, match="'batch_size' and 'batch_size' name the same option|name the same option"):
        resolve_config({}, config_file=path)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    from mirrorbert.mirror.config import load_config_file

    path = tmp_path / "run.yaml"
    path.write_text("steps: 3\n", encoding="utf-8")
    assert load_config_file(path) == {"steps": 3}
    import yaml

    from mirrorbert.mirror.config import _yaml_loader

    assert yaml.load("a: &x {steps: 1}\nb: {<<: *x, steps: 2}\n", Loader=_yaml_loader())["b"] == {"steps": 2}


@pytest.mark.parametrize("name, text", [("run.json", '{"steps": 3, "lr": 1e-4}'), ("run.yaml", "steps: 3\nlr: 1e-4\n")])
def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    cfg = resolve_config({}, config_file=path)
    assert (cfg.steps, cfg.lr) == (3, 1e-4)


def test_checkpoint_dir_defaults_beside_output():
    assert str(TrainConfig(output="runs/m/").resolved_checkpoint_dir()) == "runs/m.checkpoints"


def test_strings_that_give_no_tokens_are_skipped_with_a_count(tiny_bert, caplog):
    from transformers import AutoTokenizer

    from mirrorbert.data.strings import training_strings
    from mirrorbert.errors import UserError
    from mirrorbert.mirror.train import training_store
    from mirrorbert.mirror.views import tokenize_once

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    strings = training_strings(["a real sentence", "\u200b\u200b", "\x01\x02", "another one"], "t.txt", 0, None, 0)
    assert len(strings.strings) == 4  # strip() keeps zero-width and control characters
    store = training_store(strings, tok, 16)
    assert list(strings.strings) == ["a real sentence", "another one"] and len(store) == 2
    assert store.token_ids([0, 1]) == tokenize_once(tok, list(strings.strings), 16)
    assert "2 string(s) give no tokens" in caplog.text
    lonely = training_strings(["one sentence", "\u200b"], "u.txt", 0, None, 0)
    with pytest.raises(UserError, match="u.txt: needs at least 2 distinct strings that give tokens"):
        training_store(lonely, tok, 16)


# ----------------------------------------------------------------------------- checked once, where it enters
def _count_checks(monkeypatch) -> list[int]:
    import mirrorbert.settings.validation as validation

    calls, real = [], validation.check

    def counting(instance):
        calls.append(1)
        return real(instance)

    monkeypatch.setattr(validation, "check", counting)
    return calls


def test_a_config_is_checked_once_when_made(monkeypatch, tmp_path):
    calls = _count_checks(monkeypatch)
    TrainConfig(model="m", preset="word")
    assert len(calls) == 1
    calls.clear()
    file = tmp_path / "run.yaml"
    file.write_text("temperature: 0.1\n", encoding="utf-8")
    cfg = resolve_config({"model": "m", "preset": "phrase", "lr": 1e-4}, config_file=file)
    assert len(calls) == 1 and cfg.temperature == 0.1 and cfg.mask_span == 2 and cfg.lr == 1e-4


def test_setting_a_bad_value_is_refused_and_the_config_stays_valid():
    cfg = TrainConfig(model="m", lr=1e-4)
    with pytest.raises(UserError, match=r"^lr=-1.0: outside \(0, 1\]"):
        cfg.lr = -1.0
    assert cfg.lr == 1e-4
    cfg.lr = 3e-5
    assert cfg.lr == 3e-5
    with pytest.raises(UserError, match="^data= and words_top=: give one of them, not both$"):
        cfg.words_top, cfg.data = 5, "strings.txt"  # the second breaks a rule between options
    assert (cfg.words_top, cfg.data) == (5, None)


def test_the_init_is_the_dataclass_own_and_presets_fill_only_what_was_not_given():
    import dataclasses
    import inspect

    from mirrorbert.mirror.config import PRESETS, UNPRESET_DEFAULTS

    assert TrainConfig.__init__.__qualname__ == "TrainConfig.__init__"  # no replaced __init__
    assert list(inspect.signature(TrainConfig).parameters) == [f.name for f in dataclasses.fields(TrainConfig)]
    plain = TrainConfig(model="m")
    assert {key: getattr(plain, key) for key in UNPRESET_DEFAULTS} == UNPRESET_DEFAULTS
    word = TrainConfig(model="m", preset="word", max_length=40)
    assert word.max_length == 40 and word.temperature == PRESETS["word"]["temperature"]
    assert TrainConfig(**word.to_dict()) == word  # a recorded config makes the same run
