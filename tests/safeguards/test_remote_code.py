"""No code from files: remote code only with --trust-remote-code, never a prompt; pickle weights read
without running anything; encoder/source.py the one place that loads configs, tokenizers and models."""

from __future__ import annotations

import ast
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import mirrorbert
from mirrorbert.errors import UserError

SRC = Path(mirrorbert.__file__).resolve().parent


class Payload:
    """A pickle that writes `canary` when unpickled."""

    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('ran')",))


def _remote_folder(tiny: Path, dest: Path, where: str = "config.json") -> Path:
    shutil.copytree(tiny, dest)
    (dest / "evil.py").write_text(
        f"open({str(dest.parent / 'CANARY')!r}, 'w').write('remote')\n"
        "from transformers import BertConfig, BertModel\n"
        "class EvilConfig(BertConfig):\n    model_type = 'mirrorbert-evil'\n"
        "class EvilModel(BertModel):\n    config_class = EvilConfig\n", encoding="utf-8")
    path = dest / where
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if where == "config.json":
        data.update(model_type="mirrorbert-evil", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    else:
        data.update(auto_map={"AutoTokenizer": [None, "evil.EvilTokenizer"]}, tokenizer_class="EvilTokenizer")
    path.write_text(json.dumps(data), encoding="utf-8")
    return dest


def _pickle_folder(tiny: Path, dest: Path, payload: bool = True) -> Path:
    from safetensors.torch import load_file

    shutil.copytree(tiny, dest)
    state = load_file(str(dest / "model.safetensors"))
    (dest / "model.safetensors").unlink()
    if payload:
        state["payload"] = Payload(dest.parent / "CANARY")
    torch.save(state, dest / "pytorch_model.bin")
    return dest


# --------------------------------------------------------------------------- one place
LOADERS = {"from_pretrained", "from_config", "for_model"}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            yield node, name, owner


def test_only_model_loading_calls_the_transformers_loaders():
    """A new `from_pretrained` elsewhere would bypass the remote-code rule and the pickle scan."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).as_posix() == "encoder/source.py":
            continue
        for node, name, owner in _calls(path):
            if name in LOADERS or name == "SentenceTransformer":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert offenders == []


def test_mirrorbert_itself_never_calls_torch_load():
    """No pickle is read by mirrorbert's own code (training state is safetensors + JSON); a model's pickled
    weights go only through the one loader's scan."""
    found = [f"{path.relative_to(SRC)}:{node.lineno}" for path in sorted(SRC.rglob("*.py"))
             for node, name, owner in _calls(path) if name == "load" and owner == "torch"]
    assert found == []


# --------------------------------------------------------------------------- remote code
@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_folder_asking_for_its_own_code_is_refused_even_when_stdin_says_yes(tiny_bert, tmp_path, monkeypatch,
                                                                              where):
    from mirrorbert.encoder.model import Encoder

    folder = _remote_folder(tiny_bert, tmp_path / "model", where)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    with pytest.raises(UserError) as info:
        Encoder.load(folder, device="cpu")
    message = str(info.value)
    assert "\n" not in message and where in message and "auto_map" in message
    assert "trust_remote_code=True" in message  # Python callers are told the argument, not the option
    assert not (tmp_path / "CANARY").exists()


def test_the_cli_names_the_option(tiny_bert, tmp_path, monkeypatch, capsys):
    from mirrorbert.cli.app import main

    folder = _remote_folder(tiny_bert, tmp_path / "model")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    (tmp_path / "in.txt").write_text("a cat\n", encoding="utf-8")
    rc = main(["encode", "--model", str(folder), "--input", str(tmp_path / "in.txt"),
               "--output", str(tmp_path / "x.npy"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"mirrorbert: error: --model {folder}: its config.json asks to run code")
    assert err[-1].endswith("pass --trust-remote-code if you trust its author")
    assert not (tmp_path / "CANARY").exists() and not (tmp_path / "x.npy").exists()


def test_trusted_remote_code_runs_and_untrusted_never_prompts(tiny_bert, tmp_path, monkeypatch):
    from mirrorbert.encoder.source import open_model
    from mirrorbert.safeguards import model_files

    folder = _remote_folder(tiny_bert, tmp_path / "model")
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("transformers asked on standard input"))
    with pytest.raises(UserError):
        open_model(folder)
    # past our own check, transformers itself is told False explicitly: it refuses rather than asks
    monkeypatch.setattr(model_files, "_check_remote_code", lambda *a, **k: None)
    with open_model(folder) as handle, pytest.raises(UserError, match="needs to run code|auto_map"):
        handle.config()
    assert not (tmp_path / "CANARY").exists()
    monkeypatch.undo()
    with open_model(folder, trust_remote_code=True) as handle:  # the user's explicit choice
        config = handle.config()
    assert type(config).__name__ == "EvilConfig" and (tmp_path / "CANARY").exists()
    from mirrorbert.encoder.model import Encoder

    encoder = Encoder.load(folder, device="cpu", trust_remote_code=True)
    assert type(encoder.model).__name__ == "EvilModel" and encoder.encode(["a cat"]).shape == (1, 32)


def test_trust_remote_code_on_a_plain_folder_changes_nothing(tiny_bert):
    from mirrorbert.encoder.model import Encoder

    plain = Encoder.load(tiny_bert, device="cpu").encode(["a cat"])
    trusted = Encoder.load(tiny_bert, device="cpu", trust_remote_code=True).encode(["a cat"])
    assert (plain == trusted).all()
    with pytest.raises(UserError, match="trust_remote_code"):
        Encoder.load(tiny_bert, device="cpu", trust_remote_code="yes")


def test_every_command_that_loads_a_model_has_the_option_once():
    from mirrorbert.cli.app import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    with_model = {name for name, sub in commands.items() if any("--model" in a.option_strings for a in sub._actions)}
    trusting = {name for name, sub in commands.items()
                if any("--trust-remote-code" in a.option_strings for a in sub._actions)}
    assert trusting == with_model - {"push"}  # push uploads the files and never loads them
    assert {"train", "encode", "search", "index", "export", "eval", "pretrain-mlm", "gloss-pretrain", "lexsub",
            "finetune-sts", "reproduce"} <= trusting
    assert build_parser().parse_args(["encode", "--model", "m", "--input", "i", "--output", "o.npy"]).trust_remote_code is False


def test_a_config_file_cannot_grant_trust(tmp_path):
    from mirrorbert.mirror.config import resolve_config

    path = tmp_path / "run.yaml"
    path.write_text("trust_remote_code: true\n", encoding="utf-8")
    with pytest.raises(UserError, match="run.yaml.*command line"):
        resolve_config({}, config_file=path)
    assert resolve_config({"trust_remote_code": True}).trust_remote_code is True  # the command line may


def test_modules_json_naming_a_foreign_module_is_refused(tiny_bert, tmp_path):
    from mirrorbert.encoder.model import Encoder

    folder = Encoder.load(tiny_bert, device="cpu").save(tmp_path / "saved")
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    modules[-1]["type"] = "evilpkg.Pooling"
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    with pytest.raises(UserError, match="modules.json.*evilpkg.Pooling"):
        Encoder.load(folder, device="cpu")
    from mirrorbert.safeguards.model_files import check_model_folder

    with pytest.raises(UserError, match="--trust-remote-code"):
        check_model_folder(folder)
    check_model_folder(folder, trust_remote_code=True).close()


# --------------------------------------------------------------------------- pickle weights
def test_pickle_weights_with_a_payload_are_refused_before_any_work(tiny_bert, tmp_path):
    from mirrorbert.encoder.model import Encoder

    folder = _pickle_folder(tiny_bert, tmp_path / "model")
    with pytest.raises(UserError) as info:
        Encoder.load(folder, device="cpu")
    assert "pytorch_model.bin" in str(info.value) and "builtins.exec" in str(info.value)
    assert not (tmp_path / "CANARY").exists()


def test_the_weights_only_load_is_a_second_line_of_defence(tiny_bert, tmp_path, monkeypatch):
    """Without the up-front scan, transformers' weights-only unpickler still refuses, in one line."""
    from mirrorbert.encoder.source import open_model
    from mirrorbert.safeguards import model_files

    folder = _pickle_folder(tiny_bert, tmp_path / "model")
    monkeypatch.setattr(model_files, "_check_pickle", lambda *a, **k: None)
    with open_model(folder) as handle, pytest.raises(UserError) as info:
        handle.load()
    assert "pytorch_model.bin" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "CANARY").exists()


def test_clean_pickle_weights_still_load(tiny_bert, tmp_path):
    from mirrorbert.encoder.model import Encoder

    folder = _pickle_folder(tiny_bert, tmp_path / "model", payload=False)
    assert (Encoder.load(folder, device="cpu").encode(["a cat"]) ==
            Encoder.load(tiny_bert, device="cpu").encode(["a cat"])).all()
