"""No traceback for any user mistake: random bytes, Unicode, CSV/TSV/JSONL content, config files and option
values thrown at every reader and validator end in their result or in a `UserError`, never another
exception. Deterministic (derandomize) and bounded (max_examples) so CI is stable and fast."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirrorbert.errors import UserError

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# --------------------------------------------------------------------------- content strategies
LINES = st.lists(st.text(max_size=40), max_size=12)
BINARY = st.binary(max_size=400)


def _csv_text(delimiter: str):
    cell = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=10)
    row = st.lists(cell, min_size=1, max_size=4).map(delimiter.join)
    return st.lists(row, max_size=8).map("\n".join)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
JSONL = st.lists(
    st.one_of(st.dictionaries(st.sampled_from(["text", "t", "x", ""]), JSON_VALUES, max_size=3).map(json.dumps),
              st.text(max_size=20)),
    max_size=8,
).map("\n".join)
FILE_CONTENT = st.one_of(
    BINARY,
    LINES.map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
    _csv_text(",").map(lambda t: t.encode("utf-8", "surrogatepass")),
    _csv_text("\t").map(lambda t: t.encode("utf-8", "surrogatepass")),
    JSONL.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\xef\xbb\xbftext\r\nmore\r\n", b"a\x00b\n", b"\n\n\n", b"text,other\n\"unclosed\n"]),
)
SUFFIXES = st.sampled_from([".txt", ".csv", ".tsv", ".jsonl", ".ndjson", "", ".json", ".dat"])
NAMES = st.one_of(st.none(), st.sampled_from(["text", "t", "x", ""]), st.text(max_size=6))


@contextlib.contextmanager
def written(content: bytes, suffix: str):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"input{suffix}"
        path.write_bytes(content)
        yield path


# --------------------------------------------------------------------------- data readers
@FUZZ
@given(content=FILE_CONTENT, suffix=SUFFIXES, column=NAMES, field=NAMES, skip=st.booleans(),
       limit=st.one_of(st.none(), st.integers(1, 20)))
def test_training_data_readers(content, suffix, column, field, skip, limit):
    from mirrorbert.data.strings import TrainingStrings, load_training_strings, read_rows

    with written(content, suffix) as path:
        try:
            rows = read_rows(path, column=column, field=field, skip_bad_lines=skip)
            assert all(isinstance(s, str) for s in rows.texts) and len(rows.texts) == len(rows.ids)
        except UserError:
            pass
        try:
            result = load_training_strings(data=str(path), column=column, field=field, skip_bad_lines=skip,
                                           limit=limit)
            assert isinstance(result, TrainingStrings) and len(result.strings) >= 2
        except UserError:
            pass


# --------------------------------------------------------------------------- config files and values
def _yaml_like(values):
    import yaml

    return yaml.safe_dump(values, allow_unicode=True)


CONFIG_KEYS = st.sampled_from(["lr", "preset", "model", "batch_size", "batch-size", "temperature", "overwrite",
                               "max_length", "mask_span", "lang", "pooling", "steps", "words_top", "dropout",
                               "seed", "schedule", "precision", "output", "data", "bogus", "column"])
CONFIG_MAPPINGS = st.dictionaries(CONFIG_KEYS, JSON_VALUES, max_size=5)
CONFIG_TEXT = st.one_of(
    CONFIG_MAPPINGS.map(lambda d: json.dumps(d).encode()),
    CONFIG_MAPPINGS.map(lambda d: _yaml_like(d).encode("utf-8", "surrogatepass")),
    BINARY,
    st.text(max_size=80).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"lr: 2e-5\n", b"overwrite: 'false'\n", b"- a\n- b\n", b"{", b"a: [1, 2\n", b"!!python/object:os.system x"]),
)


@FUZZ
@given(content=CONFIG_TEXT, suffix=st.sampled_from([".yaml", ".yml", ".json", ".txt"]))
def test_config_files(content, suffix):
    from mirrorbert.mirror.config import TrainConfig, load_config_file, resolve_config

    with written(content, suffix) as path:
        try:
            assert isinstance(load_config_file(path), dict)
        except UserError:
            pass
        try:
            assert isinstance(resolve_config({}, config_file=path), TrainConfig)
        except UserError:
            pass


@FUZZ
@given(values=CONFIG_MAPPINGS)
def test_config_values_passed_programmatically(values):
    from mirrorbert.mirror.config import TrainConfig, resolve_config

    overrides = {k.replace("-", "_"): v for k, v in values.items()}
    try:
        assert isinstance(resolve_config(overrides), TrainConfig)
    except UserError:
        pass


# --------------------------------------------------------------------------- eval options
@FUZZ
@given(texts=st.lists(st.one_of(st.text(max_size=30),
                                st.tuples(st.sampled_from(["sts", "wordsim", "bel", "qnli", "bli", "isotropy", "x"]),
                                          st.text(max_size=12), st.text(max_size=12))
                                .map(lambda t: f"{t[0]}.{t[1]}={t[2]}")), max_size=4))
def test_eval_option_parser(texts):
    from mirrorbert.cli.eval import _parse_option
    from mirrorbert.evaluation.runner import check_task_options

    try:
        options: dict = {}
        for text in texts:
            task, key, value = _parse_option(text)
            options.setdefault(task, {})[key] = value
        check_task_options(options)
    except UserError:
        pass


# --------------------------------------------------------------------------- triplets and MLM corpus
TRIPLET_CONTENT = st.one_of(
    FILE_CONTENT,
    st.lists(st.tuples(st.text(max_size=8), st.text(max_size=30), st.text(max_size=20)).map("\t".join), max_size=6)
    .map(lambda rows: "\n".join(rows).encode("utf-8", "surrogatepass")),
    st.just(b"bank\tthe bank was closed\ta financial institution\n"),
)


@FUZZ
@given(content=TRIPLET_CONTENT)
def test_triplet_reader(content):
    from mirrorbert.gloss.triplets import Triplet, load_triplets_tsv

    with written(content, ".tsv") as path:
        try:
            triplets = load_triplets_tsv(path)
            assert triplets and all(isinstance(t, Triplet) for t in triplets)
        except UserError:
            pass


@FUZZ
@given(content=FILE_CONTENT)
def test_mlm_corpus_reader(content):
    from mirrorbert.data.token_stream import check_corpus_files, iter_sentences

    with written(content, ".txt") as path:
        try:
            (checked,) = check_corpus_files([path])
        except UserError:
            return
        for text, _, size in iter_sentences(checked):
            assert isinstance(text, str) and text and size > 0


# --------------------------------------------------------------------------- `train` command line
class ReachedModel(Exception):
    """Raised where `train` would start reading the model: everything before it accepted the input."""


TRAIN_OPTIONS = {
    "--model": "text", "--preset": "choice", "--data": "path", "--column": "text", "--field": "text",
    "--words-top": "int", "--lang": "text", "--random-strings": "int", "--limit": "int", "--temperature": "float",
    "--mask-span": "int", "--dropout": "float", "--drophead": "float", "--pooling": "choice",
    "--max-length": "int", "--lr": "float", "--weight-decay": "float", "--schedule": "choice",
    "--warmup-steps": "int", "--max-grad-norm": "float", "--batch-size": "int", "--epochs": "int",
    "--steps": "int", "--seed": "int", "--device": "choice", "--precision": "choice", "--save-every": "int",
    "--keep-checkpoints": "int", "--log-every": "int", "--overwrite": "flag", "--skip-bad-lines": "flag",
    "--controlled-dropout": "flag", "--bogus": "flag",
}
SAFE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\~\x00"),
                    max_size=10).filter(lambda t: ".." not in t and not t.startswith("-"))
VALUES = {
    "text": SAFE_TEXT,
    "path": st.sampled_from(["data.txt", "data.csv", "data.jsonl", "missing.txt", "binary.txt", "."]),
    "choice": st.sampled_from(["word", "phrase", "sentence", "cls", "mean", "linear", "constant", "cpu", "auto",
                               "cuda:7", "fp32", "bf16", "fp16", "", "nope", "tpu"]),
    "int": st.integers(-3, 40).map(str) | st.sampled_from(["1e3", "x", "", "3.5"]),
    "float": st.sampled_from(["0.1", "2e-5", "-1", "0", "nan", "inf", "-inf", "1e309", "x", "", "0.99", "1"]),
}


@st.composite
def train_argv(draw):
    argv = ["train", "--output", "out", "--no-progress"]
    for option in draw(st.lists(st.sampled_from(sorted(TRAIN_OPTIONS)), max_size=6, unique=True)):
        kind = TRAIN_OPTIONS[option]
        argv += [option] if kind == "flag" else [option, draw(VALUES[kind])]
    return argv


@pytest.fixture(scope="module")
def fuzz_cwd(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-cwd")
    (folder / "data.txt").write_text("alpha\nbeta\ngamma\n", encoding="utf-8")
    (folder / "data.csv").write_text("text,other\nalpha,1\nbeta,2\n", encoding="utf-8")
    (folder / "data.jsonl").write_text('{"text": "alpha"}\n{"text": "beta"}\n', encoding="utf-8")
    (folder / "binary.txt").write_bytes(bytes(range(128, 256)))
    return folder


@FUZZ
@given(argv=train_argv())
def test_train_command_line_up_to_the_model(argv, fuzz_cwd):
    from mirrorbert.cli.app import main

    def reached(*args, **kwargs):
        raise ReachedModel

    previous = os.getcwd()
    os.chdir(fuzz_cwd)
    try:
        with mock.patch("mirrorbert.mirror.train.open_start_model", reached), \
                contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
                assert code == 2, argv  # a UserError printed as one line
            except SystemExit as exc:  # argparse: unknown option or a value of the wrong type
                assert exc.code == 2, argv
            except ReachedModel:
                pass
    finally:
        os.chdir(previous)
