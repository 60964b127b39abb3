"""Refuse before work, never silently wrong: one test per case of the issue's list (the broad table of bad
inputs is tests/cli/test_hostile_inputs.py; damaged `reproduce` caches and bad reproduce options are in
test_reproduce.py; blank corpus lines in test_search.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile_inputs as table
from mirrorbert.cli.app import main
from mirrorbert.errors import NonFiniteEmbeddings, UserError


def run(capsys, argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("mirrorbert: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def weights_trap(monkeypatch):
    """Loading weights fails the test: the refusal must come before."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("weights loaded before the input was checked")

    for name in ("AutoModel", "AutoModelForMaskedLM"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def damaged_copy(tiny_bert: Path, tmp_path: Path, damage: str) -> Path:
    folder = tmp_path / damage
    shutil.copytree(tiny_bert, folder)
    table.MODEL_DAMAGES[damage](folder)
    return folder


# ----------------------------------------------------------------------------- model folders
@pytest.mark.parametrize("damage, message", [
    # the text after our prefix is the library's: tokenizers 0.20 says "Model missing", transformers 4.x reads
    # the config and fails building the model
    ("tokenizer-json-empty-object",
     r"cannot read the tokenizer files in this folder: (no entry 'added_tokens'|Model missing)"),
    ("config-wrong-type", r"cannot read the model configuration \(config.json\).*hidden_size|"
                          r"config.json does not describe a model transformers can build: .*size|"
                          r"config.json has hidden_size = abc"),  # transformers 4.x reads it; our size check refuses
    ("config-disagrees-with-weights", r"config.json and the weights disagree: .*word_embeddings.weight is 168x32 in "
                                      r"the weights, config.json makes it 168x64"),
    ("config-more-layers", r"config.json asks for parameters the weights do not hold .*encoder.layer.2"),
    ("config-fewer-layers", r"the weights hold parameters config.json has no place for .*encoder.layer.1"),
    ("config-heads", r"config.json does not describe a model transformers can build"),
    ("mirrorbert-json-damaged", r"mirrorbert.json: damaged \(not valid JSON"),
])
def test_damaged_model_folder_is_one_line_before_the_weights(capsys, weights_trap, tiny_bert, tmp_path, strings_file,
                                                             damage, message):
    import re

    folder = damaged_copy(tiny_bert, tmp_path, damage)
    code, _, err = run(capsys, ["encode", "--model", folder, "--input", strings_file, "--output", tmp_path / "x.npy"])
    line = error_line(err)
    assert code == 2 and folder.name in line and re.search(message, line), line
    with pytest.raises(UserError, match=message):  # the same refusal in Python
        from mirrorbert.encoder.model import Encoder

        Encoder.load(folder)


def test_intact_model_passes_the_shape_check(tiny_bert, tiny_roberta):
    from mirrorbert.encoder.source import open_model

    for model in (tiny_bert, tiny_roberta):
        with open_model(model) as handle:
            assert handle.config().hidden_size > 0 and len(handle.tokenizer()) > 8


# ----------------------------------------------------------------------------- evaluation sets
def test_non_utf8_evaluation_set_is_refused_before_the_model_loads(capsys, weights_trap, tiny_bert, shared_data,
                                                                   tmp_path):
    data = tmp_path / "data"
    (data / "sts").mkdir(parents=True)
    shutil.copytree(shared_data / "sts" / "STSBenchmark", data / "sts" / "STSBenchmark")
    test_file = data / "sts" / "STSBenchmark" / "sts-test.csv"
    lines = test_file.read_bytes().split(b"\n")
    lines[3] = lines[3][:5] + b"\xff" + lines[3][5:]
    test_file.write_bytes(b"\n".join(lines))
    code, _, err = run(capsys, ["eval", "--model", tiny_bert, "--tasks", "sts", "--data-dir", data, "--no-progress"])
    assert code == 2 and f"{test_file}:4: not valid UTF-8" in error_line(err)


def test_evaluation_readers_take_any_line_ending(tmp_path):
    from mirrorbert.evaluation.wordsim import load_word_pairs

    for ending in (b"\n", b"\r\n", b"\r"):
        path = tmp_path / "pairs.txt"
        path.write_bytes(ending.join([b"cat\tdog\t7.5", b"car\tbus\t6", b""]))
        pairs = load_word_pairs(path)
        assert list(pairs.s1) == ["cat", "car"] and list(pairs.scores) == [7.5, 6.0], ending


# ----------------------------------------------------------------------------- NaN vectors
@pytest.fixture
def nan_model(tiny_bert, tmp_path) -> Path:
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nan-model"
    shutil.copytree(tiny_bert, folder)
    weights = load_file(folder / "model.safetensors")
    key = next(k for k in weights if k.endswith("embeddings.LayerNorm.weight"))  # NaN for every token
    weights[key][:] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_nan_vectors_are_an_error_naming_the_model_never_a_score(capsys, nan_model, shared_data, tmp_path,
                                                                 strings_file):
    code, out, err = run(capsys, ["eval", "--model", nan_model, "--tasks", "sts", "--data-dir", shared_data,
                                  "--no-progress", "--output", tmp_path / "scores.json"])
    line = error_line(err)
    assert code == 2 and "nan-model" in line and "NaN or infinite vectors" in line
    assert "nan" not in out.lower() and not (tmp_path / "scores.json").exists()
    code, _, err = run(capsys, ["encode", "--model", nan_model, "--input", strings_file, "--output", tmp_path / "x.npy"])
    assert code == 2 and "NaN" in error_line(err) and not (tmp_path / "x.npy").exists()
    from mirrorbert.encoder.model import Encoder

    with pytest.raises(NonFiniteEmbeddings, match="nan-model"):
        Encoder.load(nan_model).encode(["the cat sat"])


# ----------------------------------------------------------------------------- resume past the end
def test_resume_from_a_checkpoint_past_the_end_is_refused_and_one_at_the_end_keeps_its_loss(capsys, tiny_bert,
                                                                                              strings_file, tmp_path):
    base = ["train", "--model", tiny_bert, "--data", strings_file, "--batch-size", "4", "--no-progress"]
    assert run(capsys, base + ["--steps", "4", "--save-every", "4", "--output", tmp_path / "run"])[0] == 0
    checkpoint = tmp_path / "run.checkpoints" / "step-4"
    assert checkpoint.is_dir()
    code, _, err = run(capsys, base + ["--steps", "2", "--resume", checkpoint, "--output", tmp_path / "short"])
    line = error_line(err)
    assert code == 2 and "step 4, past the end of this run (step 2" in line and "--resume" in line
    assert not (tmp_path / "short").exists()
    code, out, _ = run(capsys, base + ["--steps", "4", "--resume", checkpoint, "--output", tmp_path / "same"])
    record = json.loads((tmp_path / "same" / "mirrorbert.json").read_text(encoding="utf-8"))["training"]
    first = json.loads((tmp_path / "run" / "mirrorbert.json").read_text(encoding="utf-8"))["training"]
    assert code == 0 and record["steps"] == 4 and record["final_loss"] == first["final_loss"] is not None


# ----------------------------------------------------------------------------- line endings and skipped lines
@pytest.mark.parametrize("content, texts", [
    (b"a\rb\nc\n", ["a\rb", "c"]),
    (b"a\r\nb\r\nc", ["a", "b", "c"]),
    (b"a\nb\r\nc\rd\n", ["a", "b", "c\rd"]),
    (b"\xef\xbb\xbfa\r\r\nb", ["a\r", "b"]),
])
def test_lines_end_at_lf_or_crlf_and_a_lone_cr_is_part_of_its_line(tmp_path, content, texts):
    """Row i of every output is line i+1 of its input, as `wc -l` and `sed` count lines: a CR inside a line
    does not start a row of its own."""
    from mirrorbert.data.strings import load_training_strings, read_rows

    path = tmp_path / "lines.txt"
    path.write_bytes(content)
    rows = read_rows(path)
    assert rows.texts == texts and rows.ids == list(range(len(texts)))
    assert load_training_strings(data=str(path)).strings == [t.strip() for t in texts if t.strip()]


def test_skipped_lines_keep_the_numbering_in_search_and_encode(capsys, tiny_bert, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"the cat sat on the mat\n\xff\xfe broken\n\nthe bank raised interest rates again\n")
    code, out, _ = run(capsys, ["search", "--model", tiny_bert, "--corpus", corpus, "--query",
                                "the bank raised interest rates again", "--top-k", "2", "--skip-bad-lines", "--no-progress"])
    hits = json.loads(out.splitlines()[0])["hits"]
    assert code == 0 and {h["id"]: h["text"] for h in hits} == {0: "the cat sat on the mat",
                                                               3: "the bank raised interest rates again"}
    output = tmp_path / "vectors.npy"
    code, out, _ = run(capsys, ["encode", "--model", tiny_bert, "--input", corpus, "--output", output,
                                "--skip-bad-lines", "--no-progress"])
    rows = json.loads((tmp_path / "vectors.rows.json").read_text(encoding="utf-8"))
    assert code == 0 and np.load(output).shape[0] == 3
    assert rows["skipped_lines"] == [2] and rows["row_ids"] == [0, 2, 3]
    assert json.loads(out)["skipped_lines"] == 1


def test_csv_row_ids_count_a_skipped_line_as_its_row(tmp_path):
    from mirrorbert.data.strings import read_rows

    path = tmp_path / "t.csv"
    path.write_bytes(b'text,x\nhello,1\n\xff,2\n"two\nlines",3\nlast,4\n')
    rows = read_rows(path, column="text", skip_bad_lines=True)
    assert rows.texts == ["hello", "two\nlines", "last"] and rows.ids == [0, 2, 3] and rows.skipped == [3]


# ----------------------------------------------------------------------------- the Python API
def test_python_api_refuses_bad_arguments_at_the_call(tiny_bert):
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(tiny_bert)
    for kwargs, message in [({"packing": "yes"}, "packing"), ({"normalize": "yes"}, "normalize"),
                            ({"batch_size": 2.5}, "batch_size"), ({"precision": "fp8"}, "precision")]:
        with pytest.raises(ValueError, match=message):
            encoder.encode(["the cat"], **kwargs)
    from mirrorbert.search import search

    for top_k in (2.5, "3", 0, True):
        with pytest.raises(ValueError, match="top-k"):
            search(encoder, ["the cat"], ["a dog", "the bank"], top_k=top_k)
    for kwargs, message in [({"model": 123}, "^model= "), ({"lr": "abc"}, "^lr= "), ({"batch_size": 1.5}, "^batch_size= "),
                            ({"temperature": -1.0}, "^temperature=-1.0: "), ({"preset": "bogus"}, "^preset='bogus': "),
                            ({"lr": float("inf")}, "^lr=inf: "), ({"data": 5}, "^data= ")]:
        with pytest.raises(ValueError, match=message):  # Python names the argument, as Python spells it
            TrainConfig(**{"model": "m", **kwargs})


def test_python_configs_of_the_other_commands_refuse_non_finite_numbers():
    from mirrorbert.evaluation.lexsub import GenerationConfig
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig
    from mirrorbert.gloss.pretrain import GlossPretrainConfig

    from mirrorbert.settings.fields import flag_names

    with pytest.raises(UserError, match="^lam=nan: must be a finite number$"):
        GlossPretrainConfig(model="m", output="o", lam=float("nan"))
    with flag_names(), pytest.raises(UserError, match="^--lambda nan: must be a finite number$"):
        GlossPretrainConfig(model="m", output="o", lam=float("nan"))
    with pytest.raises(UserError, match="^lr=nan"):
        FinetuneStsConfig(model="m", lr=float("nan"))
    with pytest.raises(UserError, match="^emb_weight=nan"):
        GenerationConfig(emb_weight=float("nan"))
    with pytest.raises(UserError, match="^valid_top=0: must be an integer >= 1$"):
        GenerationConfig(valid_top=0)


# ----------------------------------------------------------------------------- any value of any option
@pytest.fixture(scope="module")
def hostile_env(tmp_path_factory, shared_data):
    return table.make_environment(tmp_path_factory.mktemp("hostile-prop"), shared_data)


def _options():
    import argparse

    from mirrorbert.cli.app import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted((command, action.option_strings[0]) for command, parser in sub.choices.items()
                  for action in parser._actions
                  if action.option_strings and action.nargs != 0 and action.help != argparse.SUPPRESS)


VALUES = st.one_of(
    st.integers(-10**9, 10**9).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    st.sampled_from(["", "-", "0", "1", "auto", "none", "a=b", "sts.x=1", "1,2", "1e309", "-0", "nan"]),
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(_options()), value=VALUES)
def test_any_value_of_any_option_is_accepted_or_one_error_line(hostile_env, choice, value):
    """Whatever the value, the command either accepts it (and reaches its work) or refuses it with one line and
    exit 2 naming the option: never a traceback."""
    command, option = choice
    argv = table._with(table.base_commands(hostile_env)[command], option, value)
    outcome = table.run_case(table.Case(f"{command}:{option}={value!r}", argv, (option,)))
    assert outcome.kind in (table.REFUSED, table.UNNAMED, table.ACCEPTED), (argv, outcome.kind, outcome.err[-2000:])
    if outcome.kind == table.ACCEPTED:
        assert outcome.rc in (None, 0), (argv, outcome.rc, outcome.err[-2000:])  # None: reached the work


def test_encode_search_and_eval_options_are_typed_and_checked_at_construction():
    """The commands' options in Python name each option as Python does (`batch_size=0`)."""
    from mirrorbert.cli.encode import EncodeOptions
    from mirrorbert.cli.eval import EvalOptions
    from mirrorbert.cli.search import SearchOptions

    assert EncodeOptions(model="m", input="in.txt", output="out.npy").batch_size == 64
    for kwargs, message in [({"output": "out.txt"}, "output='out.txt': expected a .npy"),
                            ({"batch_size": 0}, "batch_size=0: must be an integer >= 1"),
                            ({"batch_size": "8"}, "batch_size= must be a whole number"),
                            ({"precision": "fp8"}, "precision='fp8': not one of fp32, bf16, fp16"),
                            ({"packing": "yes"}, "packing='yes'"), ({"pooling": "max"}, "pooling='max'"),
                            ({"normalize": "yes"}, "normalize= must be true or false")]:
        with pytest.raises(ValueError, match=message):
            EncodeOptions(**{"model": "m", "input": "in.txt", "output": "out.npy", **kwargs})
    with pytest.raises(ValueError, match="model= must not be empty"):
        EncodeOptions(model="", input="in.txt", output="out.npy").validate()
    for kwargs, message in [({"top_k": 2.5}, "top_k= must be a whole number"), ({"faiss": "maybe"}, "faiss='maybe'"),
                            ({"query": None}, "query="), ({"queries": "q.txt"}, "query=")]:
        with pytest.raises(ValueError, match=message):
            SearchOptions(**{"model": "m", "corpus": "c.txt", "query": ["a"], **kwargs})
    for kwargs, message in [({"tasks": ["bogus"]}, "--tasks: unknown task"), ({"tasks": []}, "tasks= must not be empty"),
                            ({"max_length": 0}, "max_length=0"), ({"backend": "onnx"}, "backend='onnx'")]:
        with pytest.raises(ValueError, match=message):
            EvalOptions(**{"model": "m", "tasks": ["sts"], **kwargs})


def _python_configs():
    from mirrorbert.cli.encode import EncodeOptions
    from mirrorbert.cli.eval import EvalOptions
    from mirrorbert.cli.search import SearchOptions
    from mirrorbert.mirror.config import TrainConfig
    from mirrorbert.evaluation.lexsub import GenerationConfig
    from mirrorbert.gloss.finetune_sts import FinetuneStsConfig
    from mirrorbert.gloss.pretrain import GlossPretrainConfig
    from mirrorbert.mlm.pretrain import PretrainConfig
    from mirrorbert.reproduce.results import ReproduceConfig

    def checked(cls):
        def build(**values):
            cls(**values).validate()
        return build

    base = {"model": "m", "output": "o.npy", "input": "i.txt"}
    return [(cls, checked(cls), required) for cls, required in [
        (TrainConfig, {"model": "m"}),
        (EncodeOptions, base),
        (SearchOptions, {"model": "m", "corpus": "c.txt", "query": ["q"]}),
        (EvalOptions, {"model": "m", "tasks": ["sts"]}),
        (GlossPretrainConfig, {"model": "m", "output": "o"}),
        (FinetuneStsConfig, {"model": "m"}),
        (GenerationConfig, {}),
        (PretrainConfig, {"corpus": ("c.txt",), "output": "o", "model": "m"}),
        (ReproduceConfig, {"model": "m", "output": "o"}),
    ]]


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                      st.text(max_size=8), st.lists(st.integers(), max_size=2), st.just({"a": 1}))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_python_configs_take_any_value_or_raise_a_value_error(data):
    """Every Python config of every command: any value of any field either builds a valid config or raises
    `UserError`/`TypeError`/`ValueError` at the call, never another exception."""
    import dataclasses

    cls, build, required = data.draw(st.sampled_from(_python_configs()))
    name = data.draw(st.sampled_from([f.name for f in dataclasses.fields(cls)]))
    values = {**required, name: data.draw(ANY_VALUE)}
    try:
        build(**values)
    except UserError:
        pass


@pytest.mark.parametrize("key, value, fragment", [
    ("num_hidden_layers", 300_000, "num_hidden_layers = 300000, outside"),
    ("hidden_size", 10**9, "hidden_size = 1000000000, outside"),
    ("vocab_size", 10**12, "vocab_size = 1000000000000, outside"),
    ("max_position_embeddings", 10**10, "max_position_embeddings = 10000000000, outside"),
    ("num_hidden_layers", 3, "3 layers, the weights hold 2"),
])
def test_absurd_config_sizes_are_refused_before_anything_is_built(capsys, weights_trap, tiny_bert, tmp_path,
                                                                  strings_file, monkeypatch, key, value, fragment):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built from config.json before its sizes were checked")

    monkeypatch.setattr(transformers.AutoModel, "from_config", refuse)
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    code, _, err = run(capsys, ["encode", "--model", folder, "--input", strings_file, "--output",
                                tmp_path / "v.npy", "--no-progress"])
    assert code == 2 and fragment in error_line(err) and str(folder) in err


@pytest.mark.parametrize("argv", [
    ["train", "--model", "m", "--data", "d.txt", "--output", "o"],
    ["pretrain-mlm", "--model", "m", "--corpus", "d.txt", "--output", "o"],
    ["gloss-pretrain", "--model", "m", "--output", "o"],
])
@pytest.mark.parametrize("seed", ["99999999999999999999", str(2**32)])
def test_seeds_beyond_what_the_generators_take_are_one_line(capsys, tmp_path, monkeypatch, argv, seed):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, [*argv, "--seed", seed])
    assert code == 2 and "--seed" in error_line(err) and "4294967295" in err
