"""A table of bad inputs for every command, and the harness that throws them at `mirrorbert.cli.app.main`.

Each case is one command line with exactly one thing wrong (a damaged model folder, a bad data file, an
impossible option value, an output path that would lose data). The promise under test: every one ends in
exactly one `mirrorbert...: error:` line naming the option or file, exit 2, no traceback, and before the
long work starts (loading weights or running the training engine is "long work" and is trapped here).

`tests/cli/test_hostile_inputs.py` runs every case as a test; run this file to get the counts:

    .venv/bin/python tests/hostile_inputs.py [--data-dir ../shared/data] [--json counts.json]
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

REFUSED, TRACEBACK, ACCEPTED, UNNAMED = "refused", "traceback", "accepted", "refused without naming"


@dataclass
class Case:
    id: str
    argv: list[str]
    names: tuple[str, ...]  # one of these must appear in the error line (the option or the file)
    setup: object = None  # optional callable run before the case (e.g. to create a file to collide with)


@dataclass
class Outcome:
    kind: str
    rc: int | None
    error_line: str = ""
    detail: str = ""
    err: str = field(default="", repr=False)


class ReachedWork(BaseException):
    """Raised where the long work would start: a BaseException so that no `except Exception` hides it."""


# ----------------------------------------------------------------------------- fixtures on disk
TRIPLETS = ("bank\tthe bank raised interest rates again\ta financial institution that accepts deposits\n"
            "cat\tthe cat sat on the mat\ta small domesticated feline animal\n"
            "dog\ta dog ran in the park\ta domesticated carnivorous mammal kept as a pet\n"
            "fox\tthe quick brown fox jumps over the lazy dog\ta wild animal of the dog family\n")


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")


def _damage_weights(folder: Path, how: str) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else b"\x00garbage" * 8)


MODEL_DAMAGES = {
    "empty-folder": lambda f: [p.unlink() for p in list(f.iterdir())],
    "no-config": lambda f: (f / "config.json").unlink(),
    "config-not-json": lambda f: (f / "config.json").write_text("{bad", encoding="utf-8"),
    "config-a-list": lambda f: (f / "config.json").write_text("[1, 2]", encoding="utf-8"),
    "config-wrong-type": lambda f: _edit_config(f, hidden_size="abc"),
    "config-disagrees-with-weights": lambda f: _edit_config(f, hidden_size=64, intermediate_size=128),
    "config-more-layers": lambda f: _edit_config(f, num_hidden_layers=5),
    "config-fewer-layers": lambda f: _edit_config(f, num_hidden_layers=1),
    "config-vocab-size": lambda f: _edit_config(f, vocab_size=10),
    "config-heads": lambda f: _edit_config(f, num_attention_heads=3),
    "tokenizer-json-empty-object": lambda f: (f / "tokenizer.json").write_text("{}", encoding="utf-8"),
    "tokenizer-json-not-json": lambda f: (f / "tokenizer.json").write_text("{oops", encoding="utf-8"),
    "no-tokenizer-files": lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")
                                      if (f / n).exists()],
    "weights-truncated": lambda f: _damage_weights(f, "truncate"),
    "weights-garbage": lambda f: _damage_weights(f, "garbage"),
    "mirrorbert-json-damaged": lambda f: (f / "mirrorbert.json").write_text("{bad", encoding="utf-8"),
    "modules-json-damaged": lambda f: (f / "modules.json").write_text('{"a": 1}', encoding="utf-8"),
}

DATA_DAMAGES = {
    "missing.txt": None,
    "empty.txt": b"",
    "not-utf8.txt": b"the cat sat\n\xff\xfe broken\nthe dog ran\n",
    "only-blank.txt": b"\n\n   \n",
    "no-column.csv": b"text,label\nthe cat,1\nthe dog,0\n",
    "bad-json.jsonl": b'{"text": "the cat"}\n{oops\n',
    "no-field.jsonl": b'{"other": "the cat"}\n{"other": "the dog"}\n',
    "number-field.jsonl": b'{"text": 5}\n{"text": 6}\n',
    "a-folder": "dir",
    "damaged.parquet": b"PAR1\x15\xff\xfe not a parquet file PAR1",
    "damaged.arrow": b"ARROW1\x00\x00\xff\xff\xff\xff garbage",
}


def make_environment(root: Path, data_dir: Path) -> dict[str, Path]:
    """The tiny model, its damaged copies, the data files and the bad data files under `root`."""
    from tiny_models import CORPUS, make_tiny_bert

    env = {"root": root, "shared": data_dir, "tiny": make_tiny_bert(root / "tiny")}
    for name, damage in MODEL_DAMAGES.items():
        folder = root / "models" / name
        shutil.copytree(env["tiny"], folder)
        damage(folder)
        env[f"model:{name}"] = folder
    env["model:a-file"] = root / "models" / "a-file"
    env["model:a-file"].write_text("not a model\n", encoding="utf-8")
    env["data"] = root / "strings.txt"
    env["data"].write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    env["triplets"] = root / "triplets.tsv"
    env["triplets"].write_text(TRIPLETS, encoding="utf-8")
    (root / "bad").mkdir()
    for name, content in DATA_DAMAGES.items():
        path = root / "bad" / name
        if content == "dir":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        env[f"data:{name}"] = path
    env["foreign"] = root / "foreign"  # an existing folder of the user's: never to be overwritten
    env["foreign"].mkdir()
    (env["foreign"] / "thesis.tex").write_text("precious\n", encoding="utf-8")
    env["foreign-file"] = root / "notes.npy"
    env["foreign-file"].write_bytes(b"precious")
    env["a-file"] = root / "plain-file"
    env["a-file"].write_text("x\n", encoding="utf-8")
    return env


# ----------------------------------------------------------------------------- the table
def base_commands(env: dict[str, Path]) -> dict[str, list[str]]:
    """A valid command line per command (with one bad input added or substituted, a case)."""
    r, tiny, data, shared = env["root"], str(env["tiny"]), str(env["data"]), str(env["shared"])
    return {
        "train": ["train", "--model", tiny, "--data", data, "--output", f"{r}/out/train", "--steps", "1",
                  "--batch-size", "4", "--no-progress"],
        "encode": ["encode", "--model", tiny, "--input", data, "--output", f"{r}/out/x.npy", "--no-progress"],
        "search": ["search", "--model", tiny, "--corpus", data, "--query", "the cat", "--no-progress"],
        "index": ["index", "--model", tiny, "--corpus", data, "--output", f"{r}/out/index", "--no-progress"],
        "push": ["push", "--model", tiny, "--repo", "user/name", "--dry-run", "--output", f"{r}/out/push"],
        "export": ["export", "--model", tiny, "--output", f"{r}/out/export"],
        "eval": ["eval", "--model", tiny, "--tasks", "sts", "--data-dir", shared, "--no-progress"],
        "pretrain-mlm": ["pretrain-mlm", "--corpus", data, "--output", f"{r}/out/mlm", "--model", tiny,
                         "--max-tokens", "2000", "--seq-length", "32", "--no-progress"],
        "gloss-pretrain": ["gloss-pretrain", "--model", tiny, "--triplets", str(env["triplets"]), "--output",
                           f"{r}/out/gr", "--steps", "1", "--no-progress"],
        "lexsub": ["lexsub", "--model", tiny, "--data-dir", shared, "--limit", "2", "--no-progress"],
        "finetune-sts": ["finetune-sts", "--model", tiny, "--data-dir", shared, "--fractions", "0.01", "--seeds", "0",
                         "--epochs", "1", "--no-progress"],
        "reproduce": ["reproduce", "--model", tiny, "--output", f"{r}/out/rep", "--data-dir", shared,
                      "--experiments", "sts", "--quick"],
    }


MODEL_OPTION = {"pretrain-mlm": "--model"}  # every command names its model --model


def _with(argv: list[str], option: str, value: str | None) -> list[str]:
    """argv with `option` set to `value` (replacing a value already there), or removed where value is None."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == option:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out if value is None else out + [option, value]


# Values no option of that kind accepts; each case names the option.
BAD_INT = ["abc", "2.5", "-3"]
BAD_FLOAT = ["abc", "nan", "-1"]
# Per command: option -> bad values (beyond the generic ones for its type, taken from the parser).
EXTRA_BAD: dict[str, dict[str, list[str]]] = {
    "train": {"--preset": ["bogus"], "--loss": ["bogus"], "--mask-unit": ["bogus"], "--pooling": ["max"],
              "--schedule": ["bogus"], "--device": ["gpu9", "cuda:x"], "--precision": ["fp8"],
              "--packing": ["yes"], "--lang": ["", "not a language"], "--config": ["@missing"],
              "--column": ["text"], "--field": ["text"], "--resume": ["@missing"], "--eval-after": ["bogus"],
              "--data-dir": ["@missing"], "--temperature": ["0", "inf"], "--dropout": ["1", "1.5"],
              "--drophead": ["1"], "--batch-size": ["1", "0"], "--max-length": ["2", "100000"], "--epochs": ["0"],
              "--steps": ["0"], "--keep-checkpoints": ["0"], "--log-every": ["0"], "--threads": ["0"],
              "--lr": ["0", "inf"], "--max-grad-norm": ["0"], "--words-top": ["0"], "--random-strings": ["0"],
              "--limit": ["0"], "--checkpoint-dir": ["@a-file"], "--log-dir": ["@a-file"], "--model": ["", "@missing"]},
    "encode": {"--pooling": ["max"], "--quantize": ["int4", ""], "--device": ["gpu9"], "--precision": ["fp8"], "--batch-size": ["0"],
               "--max-length": ["0", "100000"], "--column": ["text"], "--field": ["text"],
               "--output": ["@x.txt", "@a-file", "@in-missing-folder", "@foreign-file", "@input"], "--model": ["", "@missing"]},
    "search": {"--pooling": ["max"], "--quantize": ["uint8", "binary", "int4"], "--device": ["gpu9"], "--top-k": ["0"], "--batch-size": ["0"],
               "--max-length": ["0", "100000"], "--faiss": ["maybe"], "--queries": ["@missing"], "--column": ["text"],
               "--field": ["text"], "--model": ["", "@missing"], "--index": ["@missing", "@foreign", "@a-file"],
               "--nprobe": ["0", "-3", "many"]},
    "index": {"--pooling": ["max"], "--device": ["gpu9"], "--batch-size": ["0"], "--max-length": ["0", "100000"],
              "--column": ["text"], "--field": ["text"], "--output": ["@foreign", "@a-file"],
              "--model": ["", "@missing"], "--index-type": ["hnsw", ""], "--nprobe": ["0", "-3", "many"]},
    "export": {"--format": ["tflite", "", "onnx,"], "--opset": ["9", "99"], "--pooling": ["max"],
               "--max-length": ["0", "100000"], "--output": ["@foreign", "@a-file", "@input"],
               "--model": ["", "@missing"]},
    "push": {"--repo": ["bad/id/x", "", "me/x--y"], "--output": ["@foreign", "@a-file", "@input"],
             "--model": ["", "@missing"]},
    "eval": {"--tasks": ["bogus", "sts,bogus"], "--data-dir": ["@missing", "@a-file"], "--device": ["gpu9"],
             "--batch-size": ["0"], "--max-length": ["0", "100000"], "--reference-model": ["@missing"],
             "--sts-sets": ["bogus"], "--wordsim-languages": ["xx"], "--xling-pairs": ["bogus"],
             "--option": ["sts.bogus=1", "noequals", "bogus.x=1"], "--output": ["@a-file-in-data", "@foreign-file"],
             "--report": ["@a-file-in-model"], "--plot-dir": ["@foreign"], "--model": ["", "@missing"]},
    "pretrain-mlm": {"--architecture": ["bogus"], "--tokenizer": ["@missing"], "--device": ["gpu9"],
                     "--precision": ["fp8"], "--seq-length": ["0", "100000"], "--mlm-probability": ["0", "1.5"],
                     "--eval-fraction": ["1", "1.5"], "--batch-size": ["0"], "--grad-accum": ["0"],
                     "--max-tokens": ["0"], "--epochs": ["0"], "--lr": ["0"], "--cache-dir": ["@a-file"],
                     "--output": ["@foreign", "@a-file"], "--resume": ["@missing"], "--corpus": ["@missing"],
                     "--model": ["", "@missing"]},
    "gloss-pretrain": {"--triplets": ["@missing"], "--device": ["gpu9"], "--precision": ["fp8"],
                       "--holdout": ["1", "1.5"], "--lambda": ["-1"], "--tau": ["0"], "--mlm-prob": ["1", "1.5"],
                       "--max-length": ["0", "100000"], "--batch-size": ["0", "1"], "--epochs": ["0"],
                       "--steps": ["0"], "--lr": ["0"], "--eval-batch-size": ["0"], "--output": ["@foreign"],
                       "--resume": ["@missing"], "--data-dir": ["@missing"], "--model": ["", "@missing"]},
    "lexsub": {"--dataset": ["bogus"], "--post": ["bogus"], "--data-dir": ["@missing"], "--device": ["gpu9"],
               "--batch-size": ["0"], "--max-length": ["0", "100000"], "--limit": ["0"], "--valid-top": ["0"],
               "--output": ["@foreign", "@a-file"], "--model": ["", "@missing"]},
    "finetune-sts": {"--fractions": ["2", "0", "abc", ""], "--seeds": ["a,b", ""], "--epochs": ["0"],
                     "--batch-size": ["0", "1"], "--lr": ["0"], "--warmup": ["-1", "1.5"], "--max-length": ["0", "100000"],
                     "--device": ["gpu9"], "--precision": ["fp8"], "--data-dir": ["@missing"],
                     "--output": ["@foreign-file", "@a-file-in-data"], "--model": ["", "@missing"]},
    "reproduce": {"--experiments": ["bogus"], "--seeds": ["a", ""], "--train-option": ["lr=abc", "bogus=1", "noequals",
                  "lr=-1", "max_length=100000"], "--gr-option": ["bogus=1", "noequals"], "--device": ["gpu9"],
                  "--eval-batch-size": ["0"], "--data-dir": ["@missing"], "--output": ["@foreign", "@a-file"],
                  "--model": ["", "@missing"]},
}
# Cases that are not mistakes after all, each with the reason (kept in the table so it stays honest).
NOT_MISTAKES = {
    ("lexsub", "--emb-weight", "-1"): "a weight of any sign is a valid interpolation",
    ("lexsub", "--valid-weight", "-1"): "a weight of any sign is a valid interpolation",
    ("lexsub", "--emb-temperature", "-1"): "refused, but by the same check as 0 (kept once)",
    ("train", "--lang", "not a language"): "--lang only applies with --words-top; the base command reads --data",
    ("train", "--data-dir", "@missing"): "--data-dir only applies with --eval-after (not in the base command)",
    ("gloss-pretrain", "--data-dir", "@missing"): "--data-dir is only read without --triplets",
    ("eval", "--reference-model", "@missing"): "only the isotropy task reads it; sts warns that it is unused",
    ("lexsub", "--max-length", "100000"): "capped at the model's positions (documented in --help)",
    ("gloss-pretrain", "--max-length", "100000"): "capped at the model's positions (documented in --help)",
    ("finetune-sts", "--max-length", "100000"): "capped at the model's positions (documented in --help)",
}
# pretrain-mlm reads any UTF-8 text: a .csv or .jsonl corpus is text to it, not a table
NOT_MISTAKES_DATA = {("pretrain-mlm", name) for name in ("no-column.csv", "bad-json.jsonl", "no-field.jsonl",
                                                         "number-field.jsonl")}
# Model files a command does not read: a damaged copy of them is not its input.
NOT_READ = {("gloss-pretrain", "mirrorbert-json-damaged"), ("gloss-pretrain", "modules-json-damaged"),
            ("lexsub", "mirrorbert-json-damaged"), ("lexsub", "modules-json-damaged"),
            ("pretrain-mlm", "mirrorbert-json-damaged"), ("pretrain-mlm", "modules-json-damaged")}


def _value(env: dict[str, Path], command: str, value: str, argv: list[str]) -> tuple[str, str | None]:
    """Placeholders: @missing, @a-file, @foreign, ... -> a path (and the name the error must give)."""
    root = env["root"]
    if not value.startswith("@"):
        return value, None
    key = value[1:]
    paths = {
        "missing": root / "no-such-thing", "a-file": env["a-file"], "foreign": env["foreign"],
        "foreign-file": env["foreign-file"], "x.txt": root / "out" / "vectors.txt",
        "in-missing-folder": env["a-file"] / "x.npy", "input": env["data"],
        "a-file-in-data": env["shared"] / "results.json", "a-file-in-model": env["tiny"] / "report.md",
    }
    path = paths[key]
    return str(path), path.name


def build_cases(env: dict[str, Path]) -> list[Case]:
    import argparse

    from mirrorbert.cli.app import build_parser

    bases = base_commands(env)
    cases: list[Case] = []
    # 1. damaged model folders, for every command that takes a model
    for command, argv in bases.items():
        for damage in [*MODEL_DAMAGES, "a-file"]:
            if (command, damage) in NOT_READ:
                continue
            folder = env[f"model:{damage}"]
            cases.append(Case(f"{command}:model:{damage}", _with(argv, "--model", str(folder)),
                              (folder.name, "--model")))
    # 2. bad data files, for every option that reads strings
    readers = [("train", "--data"), ("encode", "--input"), ("search", "--corpus"), ("search", "--queries"),
               ("index", "--corpus"),
               ("pretrain-mlm", "--corpus"), ("gloss-pretrain", "--triplets")]
    for command, option in readers:
        for name in DATA_DAMAGES:
            if (command, name) in NOT_MISTAKES_DATA:
                continue
            argv = bases[command]
            if option == "--queries":
                argv = _with(argv, "--query", None)
            path = env[f"data:{name}"]
            cases.append(Case(f"{command}:{option}:{name}", _with(argv, option, str(path)),
                              (path.name, option)))
    # 3. option values: the generic bad values of each option's type, and the per-command ones
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, argv in bases.items():
        for action in sub.choices[command]._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue
            option = action.option_strings[0]
            values: list[str] = []
            if action.type is int:
                values += BAD_INT
            elif action.type is float:
                values += BAD_FLOAT
            elif action.choices or (action.metavar or "").startswith("{"):  # choices checked by the options
                values.append("bogus-choice")
            for value in dict.fromkeys(values + EXTRA_BAD.get(command, {}).get(option, [])):  # each once
                if (command, option, value) in NOT_MISTAKES:
                    continue
                concrete, name = _value(env, command, value, argv)
                if option in ("--column",) and command in ("train", "encode", "search"):
                    names = (option, "--column/--field")
                elif option in ("--field",):
                    names = (option, "--column/--field")
                elif option == "--train-option" and "=" in value:
                    names = (option, "--" + value.split("=")[0].replace("_", "-"))
                else:
                    names = (option,) + ((name,) if name else ())
                case_argv = _with(argv, option, concrete)
                if option == "--overwrite":
                    continue
                cases.append(Case(f"{command}:{option}={value or '(empty)'}", case_argv, names))
    # 4. combinations that are each valid alone
    b = bases
    cases += [
        Case("train:data+words-top", b["train"] + ["--words-top", "100"], ("--data", "--words-top")),
        Case("train:column+field", _with(b["train"], "--data", str(env["data:no-column.csv"])) +
             ["--column", "text", "--field", "text"], ("--column", "--field")),
        Case("train:grad-cache+controlled-dropout", b["train"] + ["--grad-cache-chunk", "2", "--controlled-dropout"],
             ("--grad-cache-chunk",)),
        Case("search:query+queries", b["search"] + ["--queries", str(env["data"])], ("--query", "--queries")),
        Case("search:neither-query", _with(b["search"], "--query", None), ("--query", "--queries")),
        Case("eval:output=report", b["eval"] + ["--output", f"{env['root']}/out/r.json", "--report",
                                                f"{env['root']}/out/r.json"], ("--output", "--report", "r.json")),
        Case("encode:output-inside-model", _with(b["encode"], "--output", str(env["tiny"] / "x.npy")),
             ("--output", "x.npy")),
        Case("pretrain-mlm:no-model-no-architecture", _with(b["pretrain-mlm"], "--model", None),
             ("--model", "--architecture")),
        Case("pretrain-mlm:architecture-without-tokenizer",
             _with(b["pretrain-mlm"], "--model", None) + ["--architecture", "bert-mini"], ("--tokenizer",)),
    ]
    return cases


# ----------------------------------------------------------------------------- running a case
@contextlib.contextmanager
def work_trapped():
    """Loading weights or starting the training engine raises ReachedWork: the checks come before that."""
    import transformers

    from mirrorbert.training import engine

    def trap(*args, **kwargs):
        raise ReachedWork("long work started")

    saved = [(getattr(transformers, n), "from_pretrained", getattr(getattr(transformers, n), "from_pretrained"))
             for n in ("AutoModel", "AutoModelForMaskedLM")]
    saved.append((engine.Engine, "run", engine.Engine.run))
    for owner, attr, _ in saved:
        setattr(owner, attr, trap)
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def run_case(case: Case) -> Outcome:
    from mirrorbert.cli.app import main

    err = io.StringIO()
    root_logger = logging.getLogger()
    handlers = root_logger.handlers[:]
    rc: int | None = None
    previous_cwd = os.getcwd()
    # A fresh scratch cwd per case: a value taken as a relative output path (a fuzzed "-32" given to an option
    # that writes) lands there, never in the directory the tests were started from (it once reached a commit)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), work_trapped(), \
            tempfile.TemporaryDirectory(prefix="hostile-cwd-") as scratch:
        root_logger.handlers = []  # main() installs a handler writing to the redirected stderr
        os.chdir(scratch)
        try:
            rc = main(case.argv)
        except ReachedWork:
            rc = None
        except SystemExit as exc:  # argparse's own errors
            rc = exc.code if isinstance(exc.code, int) else 2
        except Exception:  # noqa: BLE001  what the harness exists to find
            import traceback

            traceback.print_exc(file=err)
            rc = -1
        finally:
            root_logger.handlers = handlers
            os.chdir(previous_cwd)
    text = err.getvalue()
    errors = [line for line in text.splitlines() if line.startswith("mirrorbert") and ": error: " in line]
    if "Traceback (most recent call last)" in text or rc == -1:
        return Outcome(TRACEBACK, rc, errors[-1] if errors else "", text.strip().splitlines()[-1] if text.strip() else "", text)
    if rc != 2 or len(errors) != 1:
        return Outcome(ACCEPTED, rc, errors[-1] if errors else "", "no error line" if not errors else "rc != 2", text)
    if not any(name and name in errors[0] for name in case.names):
        return Outcome(UNNAMED, rc, errors[0], f"expected one of {case.names}", text)
    return Outcome(REFUSED, rc, errors[0], "", text)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA",
                                                            str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    parser.add_argument("--json", help="write the counts and every non-refused case here")
    parser.add_argument("-k", help="only cases whose id contains this text")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # every case runs in a scratch cwd (run_case): a relative data directory must not change meaning there
    args.data_dir = str(Path(args.data_dir).resolve())
    if os.environ.get("MIRRORBERT_DATA"):
        os.environ["MIRRORBERT_DATA"] = str(Path(os.environ["MIRRORBERT_DATA"]).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        env = make_environment(Path(tmp), Path(args.data_dir))
        cases = [c for c in build_cases(env) if not args.k or args.k in c.id]
        counts = {REFUSED: 0, TRACEBACK: 0, ACCEPTED: 0, UNNAMED: 0}
        bad = []
        for case in cases:
            outcome = run_case(case)
            counts[outcome.kind] += 1
            if outcome.kind != REFUSED:
                bad.append({"case": case.id, "kind": outcome.kind, "rc": outcome.rc, "error": outcome.error_line,
                            "detail": outcome.detail})
                print(f"{outcome.kind:>22}  {case.id}: {outcome.error_line or outcome.detail}", file=sys.stderr)
    report = {"tried": len(cases), **counts, "not_refused": bad}
    print(json.dumps({k: v for k, v in report.items() if k != "not_refused"}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0 if counts[REFUSED] == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
