"""Hostile model folders, generated: every file a loader opens x every way to make it hostile; ids `mf-`.

* every file of a saved mirrorbert folder (plus a `vocab.txt`) replaced by a FIFO, a symlink out of the folder,
  a hard link to a copy outside (which must still load: its content is the model's), a 100,000-deep JSON, a
  1 GB sparse file, invalid UTF-8; each through `mirrorbert encode` and through `Encoder.load`;
* every path modules.json names, made `..`, absolute, or a symlink out of the folder;
* parsers' own failures: a tokenizer whose pattern exhausts its match budget (a panic inside tokenizers),
  `max_seq_length` beyond the model's positions, a pooling config naming an unknown mode, a
  `model_max_length` that is no length (negative, zero, a string, a bool, a float, null: the model decides);
* the sentence-transformers backend: a module folder whose config.json has an `auto_map`, a module type that
  names a function of sentence-transformers (`sentence_transformers.util.misc.import_from_string`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hostile_files.harness import REFUSED, WORKS, Context, FileCase, Result

WHAT_FOLDER = "confined model folder"
WHAT_NAMED = "path named inside a model file"
WHAT_PARSER = "parser failure of a model file"
WHAT_ST = "sentence-transformers backend"

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors", "modules.json",
         "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json",
         "mirrorbert.json", "README.md", "vocab.txt")
ATTACKS = ("fifo", "symlink-out", "hardlink", "deep-json", "huge", "bad-utf8")
# Files no loader reads: only a FIFO or a link out of the folder is refused there.
UNREAD = ("README.md",)


def saved_model(ctx: Context, name: str = "model") -> Path:
    """A fresh copy of a saved mirrorbert folder (built once per table), with a vocab.txt beside it."""
    cached = ctx.env["root"] / "saved-model"
    if not cached.exists():
        from mirrorbert.encoder.model import Encoder

        Encoder.load(ctx.env["tiny"], pooling="mean", device="cpu").save(cached)
        from tiny_models import bert_vocab

        (cached / "vocab.txt").write_text("\n".join(bert_vocab()) + "\n", encoding="utf-8")
    dest = ctx.folder / name
    shutil.copytree(cached, dest, symlinks=True)
    return dest


def _deep_json(file: str) -> bytes:
    if file.endswith(".safetensors"):
        header = b"[" * 100_000
        return len(header).to_bytes(8, "little") + header
    return b"[" * 100_000


def _bad_utf8(file: str) -> bytes:
    if file.endswith(".safetensors"):
        header = b'{"a\xff\xfe": 1}'
        return len(header).to_bytes(8, "little") + header
    return b'{"vocab": "\xff\xfe\xfd"}' if file.endswith(".json") else b"[PAD]\n\xff\xfe\n"


def _attack(file: str, how: str):
    def setup(ctx: Context) -> None:
        folder = saved_model(ctx)
        path = folder / file
        if how == "fifo":
            path.unlink()
            os.mkfifo(path)
        elif how in ("symlink-out", "hardlink"):
            outside = ctx.victim(ctx.folder / "outside" / path.name, path.read_bytes())
            path.unlink()
            (os.symlink if how == "symlink-out" else os.link)(outside, path)
        elif how == "deep-json":
            path.write_bytes(_deep_json(file))
        elif how == "huge":
            with open(path, "wb") as fh:
                fh.truncate(1 << 30)  # sparse: 1 GB of zeros without writing them
        elif how == "bad-utf8":
            path.write_bytes(_bad_utf8(file))

    return setup


def _expect(file: str, how: str) -> str:
    if how in ("fifo", "symlink-out"):
        return REFUSED
    if how == "hardlink" or file in UNREAD:
        return WORKS
    return REFUSED


def _encode_command(ctx: Context) -> list[str]:
    return ["encode", "--model", ctx.folder / "model", "--input", ctx.env["data"], "--output", ctx.folder / "v.npy",
            "--device", "cpu"]


def _encode_worked(ctx: Context, result: Result) -> str | None:
    import numpy as np

    out = ctx.folder / "v.npy"
    if not out.is_file():
        return "encode wrote no vectors"
    rows = np.load(out).shape[0]
    want = sum(1 for line in ctx.env["data"].read_text(encoding="utf-8").splitlines() if line.strip())
    return None if rows == want else f"{rows} rows for {want} strings"


def _load(ctx: Context):
    from mirrorbert.encoder.model import Encoder

    return Encoder.load(ctx.folder / "model", device="cpu")


def _loaded(ctx: Context, result: Result) -> str | None:
    vectors = result.value.encode(["a heart attack", "the bank"])
    return None if vectors.shape[0] == 2 else f"shape {vectors.shape}"


def _matrix() -> list[FileCase]:
    found = []
    for file in FILES:
        for how in ATTACKS:
            if file == "vocab.txt" and how == "deep-json":
                continue  # not JSON: brackets are valid text there; its damage is bad-utf8
            expect = _expect(file, how)
            names = (Path(file).name,)
            slug = file.replace("/", "-")
            found.append(FileCase(f"mf-encode-{slug}-{how}", WHAT_FOLDER, _attack(file, how), _encode_command,
                                  expect, names, _encode_worked, timeout=60))
            found.append(FileCase(f"mf-load-{slug}-{how}", WHAT_FOLDER, _attack(file, how), _load,
                                  expect, names, _loaded, timeout=60))
    return found


# ----------------------------------------------------------------------------- paths named in modules.json
def _module_path(how: str):
    def setup(ctx: Context) -> None:
        folder = saved_model(ctx)
        outside = ctx.folder / "outside-pooling"
        shutil.copytree(folder / "1_Pooling", outside)
        ctx.victim(outside / "config.json", None)
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        pooling = next(m for m in modules if m["type"].endswith(".Pooling"))
        if how == "dotdot":
            pooling["path"] = "../outside-pooling"
        elif how == "absolute":
            pooling["path"] = str(outside)
        else:
            shutil.rmtree(folder / "1_Pooling")
            os.symlink(outside, folder / "1_Pooling")
        (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")

    return setup


def _named_paths() -> list[FileCase]:
    found = []
    for how in ("dotdot", "absolute", "symlink-out"):
        names = ("modules.json", "1_Pooling", "outside-pooling")
        found.append(FileCase(f"mf-encode-modules-path-{how}", WHAT_NAMED, _module_path(how), _encode_command,
                              REFUSED, names, timeout=60))
        found.append(FileCase(f"mf-load-modules-path-{how}", WHAT_NAMED, _module_path(how), _load,
                              REFUSED, names, timeout=60))
    return found


# ----------------------------------------------------------------------------- parsers' own failures
def _panicking_tokenizer(ctx: Context) -> None:
    """A pre-tokenizer pattern that backtracks without end on a run of one letter: tokenizers panics."""
    folder = saved_model(ctx)
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(?:a|aa)+$x"}, "behavior": "Isolated",
                             "invert": False}
    path.write_text(json.dumps(spec), encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json as written, not rebuilt from a vocab
    config_path.write_text(json.dumps(config), encoding="utf-8")


def _long_max_seq_length(ctx: Context) -> None:
    folder = saved_model(ctx)
    path = folder / "sentence_bert_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["max_seq_length"] = 100_000
    path.write_text(json.dumps(cfg), encoding="utf-8")


def _unknown_pooling(ctx: Context) -> None:
    folder = saved_model(ctx)
    path = folder / "1_Pooling" / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["pooling_mode"] = "telepathy"
    path.write_text(json.dumps(cfg), encoding="utf-8")


def _bool_pooling_flag(ctx: Context) -> None:
    folder = saved_model(ctx)
    path = folder / "1_Pooling" / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["pooling_mode_mean_tokens"] = {"nested": [1, 2]}
    path.write_text(json.dumps(cfg), encoding="utf-8")


def _tokenizer_max_length(value):
    """tokenizer_config.json's model_max_length set to something that is no length: the model's positions
    decide, as for a tokenizer that sets none."""
    def setup(ctx: Context) -> None:
        folder = saved_model(ctx)
        path = folder / "tokenizer_config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config["model_max_length"] = value
        path.write_text(json.dumps(config), encoding="utf-8")
    return setup


def _same_vectors(ctx: Context, result: Result) -> str | None:
    """The load gives the untouched model's vectors, up to its own maximum length."""
    import numpy as np

    from mirrorbert.encoder.model import Encoder

    texts = ["a heart attack", " ".join(["the bank"] * 300)]
    intact = Encoder.load(ctx.env["root"] / "saved-model", device="cpu")
    if result.value.max_length != intact.max_length:
        return f"max_length {result.value.max_length}, the untouched model's {intact.max_length}"
    same = np.allclose(result.value.encode(texts), intact.encode(texts), atol=1e-5)
    return None if same else "other vectors than the untouched model's"


NO_LENGTH = {"negative": -1, "zero": 0, "string": "512", "bool": True, "float": 3.5, "null": None}


def _train_command(ctx: Context) -> list[str]:
    return ["train", "--model", ctx.folder / "model", "--data", ctx.env["data"], "--output", ctx.folder / "out",
            "--steps", "1", "--batch-size", "4", "--device", "cpu"]


def _api_train(ctx: Context):
    import mirrorbert

    return mirrorbert.train(mirrorbert.TrainConfig(
        model=str(ctx.folder / "model"), data=str(ctx.env["data"]), output=str(ctx.folder / "out"), steps=1,
        batch_size=4, max_length=16, device="cpu", show_progress=False))


def _parsers() -> list[FileCase]:
    found = []
    for slug, setup, names in (("tokenizer-panic", _panicking_tokenizer, ("tokenizer",)),
                               ("max-seq-length-beyond-positions", _long_max_seq_length,
                                ("max_seq_length", "sentence_bert_config.json")),
                               ("unknown-pooling-mode", _unknown_pooling, ("1_Pooling", "pooling")),
                               ("pooling-flag-not-bool", _bool_pooling_flag, ("1_Pooling", "pooling_mode"))):
        found.append(FileCase(f"mf-encode-{slug}", WHAT_PARSER, setup, _encode_command, REFUSED, names, timeout=60))
        found.append(FileCase(f"mf-load-{slug}", WHAT_PARSER, setup, _load, REFUSED, names, timeout=60))
    for slug, value in NO_LENGTH.items():
        found.append(FileCase(f"mf-encode-model-max-length-{slug}", WHAT_PARSER, _tokenizer_max_length(value),
                              _encode_command, WORKS, check=_encode_worked, timeout=60))
        found.append(FileCase(f"mf-load-model-max-length-{slug}", WHAT_PARSER, _tokenizer_max_length(value), _load,
                              WORKS, check=_same_vectors, timeout=60))
    found.append(FileCase("mf-train-tokenizer-panic", WHAT_PARSER, _panicking_tokenizer, _train_command, REFUSED,
                          ("tokenizer",), timeout=90))
    found.append(FileCase("mf-api-train-tokenizer-panic", WHAT_PARSER, _panicking_tokenizer, _api_train, REFUSED,
                          ("tokenizer",), timeout=90))
    return found


# ----------------------------------------------------------------------------- the sentence-transformers backend
def _st_layout(ctx: Context, auto_map: bool = False, module_type: str | None = None) -> Path:
    """A sentence-transformers folder with the transformer in `0_Transformer/`."""
    folder = ctx.folder / "model"
    folder.mkdir()
    shutil.copytree(ctx.env["tiny"], folder / "0_Transformer")
    (folder / "0_Transformer" / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    if auto_map:
        cfg = json.loads((folder / "0_Transformer" / "config.json").read_text(encoding="utf-8"))
        cfg["auto_map"] = {"AutoModel": "evil.EvilModel"}
        (folder / "0_Transformer" / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        (folder / "0_Transformer" / "evil.py").write_text(
            f"open({str(ctx.canary)!r}, 'w').write('module code ran')\n", encoding="utf-8")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                 "pooling_mode_mean_tokens": True}))
    modules = [{"idx": 0, "name": "0", "path": "0_Transformer",
                "type": module_type or "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    return folder


def _st_backend(ctx: Context):
    from mirrorbert.evaluation.baselines import SentenceTransformerEncoder

    return SentenceTransformerEncoder(ctx.folder / "model", device="cpu")


def _st_backend_works(ctx: Context, result: Result) -> str | None:
    vectors = result.value.encode(["a heart attack", "the bank"])
    return None if vectors.shape == (2, 32) else f"shape {vectors.shape}"


def _st_cases() -> list[FileCase]:
    return [
        FileCase("mf-st-backend-module-auto-map", WHAT_ST, lambda ctx: _st_layout(ctx, auto_map=True), _st_backend,
                 REFUSED, ("0_Transformer/config.json", "auto_map")),
        FileCase("mf-st-backend-import-from-string", WHAT_ST,
                 lambda ctx: _st_layout(ctx, module_type="sentence_transformers.util.misc.import_from_string"),
                 _st_backend, REFUSED, ("modules.json",)),
        FileCase("mf-st-backend-module-outside-models", WHAT_ST,
                 lambda ctx: _st_layout(ctx, module_type="sentence_transformers.SentenceTransformer"),
                 _st_backend, REFUSED, ("modules.json",)),
        FileCase("mf-encode-module-auto-map", WHAT_ST, lambda ctx: _st_layout(ctx, auto_map=True), _encode_command,
                 REFUSED, ("0_Transformer/config.json", "auto_map")),
        FileCase("mf-st-backend-plain-layout-works", WHAT_ST, lambda ctx: _st_layout(ctx), _st_backend, WORKS,
                 check=_st_backend_works),
    ]


def cases(env) -> list[FileCase]:
    return _matrix() + _named_paths() + _parsers() + _st_cases()
