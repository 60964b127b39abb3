"""Hostile files that try to run code (issue 26, "no code from files, ever"); ids start with `code:`.

* crafted pickles (`__reduce__` payloads: exec, open, os.system, eval) in a checkpoint's `training_state.pt`
  or `gloss_encoder.pt` in place of the safetensors state (manifest removed, or recomputed to match: refused
  as incomplete, never read), and as a pickle-only `pytorch_model.bin` for every command that loads a model
  and for `Encoder.load`;
* an `auto_map` in `config.json` / `tokenizer_config.json` naming the folder's own `.py` (which writes the
  canary when imported), with standard input answering "y" to transformers' prompt, for every command, for
  `Encoder.load` and `mirrorbert.train`; `trust_remote_code` from a config file; a `modules.json` naming a
  module type from outside sentence-transformers;
* what must keep working: `--trust-remote-code` on a folder without `auto_map`, a planted `training_state.pt`
  beside the safetensors state (never read), a pickle folder pushed with `push --dry-run` (never loaded).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hostile_files.harness import REFUSED, WORKS, Context, FileCase

WHAT_PICKLE = "crafted pickle"
WHAT_REMOTE = "remote code"
WHAT_ST = "foreign sentence-transformers module"

TRIPLETS = ("bank\tthe bank raised interest rates again\ta financial institution that accepts deposits\n"
            "cat\tthe cat sat on the mat\ta small domesticated feline animal\n"
            "dog\ta dog ran in the park\ta domesticated carnivorous mammal kept as a pet\n"
            "fox\tthe quick brown fox jumps over the lazy dog\ta wild animal of the dog family\n"
            "tree\ta tree grew beside the river\ta tall perennial woody plant\n")


# ----------------------------------------------------------------------------- payloads
class _Exec:
    """Unpickling this runs `exec`, which writes the canary."""

    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('exec from a pickle')",))


class _Open(_Exec):
    """Unpickling this calls `builtins.open(canary, 'w')`: the file appears."""

    def __reduce__(self):
        return (open, (self.canary, "w"))


class _System(_Exec):
    """Unpickling this runs a shell command."""

    def __reduce__(self):
        import shlex

        return (os.system, (f"echo system > {shlex.quote(self.canary)}",))


class _Eval(_Exec):
    def __reduce__(self):
        return (eval, (f"__import__('pathlib').Path({self.canary!r}).write_text('eval')",))


PAYLOADS = {"exec": _Exec, "open": _Open, "system": _System, "eval": _Eval}


def _payload(ctx: Context, kind: str):
    return PAYLOADS[kind](ctx.canary)


# ----------------------------------------------------------------------------- crafted model folders
def pickle_model(ctx: Context, kind: str = "exec", name: str = "model", mlm: bool = False) -> Path:
    """The tiny model with its weights as a pickle-only pytorch_model.bin carrying a payload."""
    import torch
    from safetensors.torch import load_file

    folder = ctx.copy_model(name)
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    state["zzz.payload"] = _payload(ctx, kind)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def _evil_module(ctx: Context, folder: Path, module: str = "evil") -> None:
    (folder / f"{module}.py").write_text(
        f"open({str(ctx.canary)!r}, 'w').write('remote code ran')\n"
        "from transformers import BertConfig, BertModel, BertForMaskedLM, BertTokenizerFast\n"
        "class EvilConfig(BertConfig):\n    model_type = 'mirrorbert-evil'\n"
        "class EvilModel(BertModel):\n    config_class = EvilConfig\n"
        "class EvilForMaskedLM(BertForMaskedLM):\n    config_class = EvilConfig\n"
        "class EvilTokenizer(BertTokenizerFast):\n    pass\n", encoding="utf-8")


def remote_model(ctx: Context, where: str = "config", name: str = "model", model_type: str = "mirrorbert-evil") -> Path:
    """The tiny model whose config.json (or tokenizer_config.json) maps to its own evil.py."""
    folder = ctx.copy_model(name)
    _evil_module(ctx, folder)
    if where in ("config", "both"):
        path = folder / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config["model_type"] = model_type
        config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel",
                              "AutoModelForMaskedLM": "evil.EvilForMaskedLM"}
        path.write_text(json.dumps(config), encoding="utf-8")
    if where in ("tokenizer", "both"):
        path = folder / "tokenizer_config.json"
        config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        config["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
        config["tokenizer_class"] = "EvilTokenizer"
        path.write_text(json.dumps(config), encoding="utf-8")
    return folder


def foreign_modules_model(ctx: Context, name: str = "model") -> Path:
    """A sentence-transformers folder whose modules.json names a Pooling class from another package."""
    from mirrorbert.encoder.model import Encoder

    folder = Encoder.load(ctx.env["tiny"], pooling="mean", device="cpu").save(ctx.folder / name)
    path = folder / "modules.json"
    modules = json.loads(path.read_text(encoding="utf-8"))
    modules[-1]["type"] = "evilpkg.models.Pooling"
    path.write_text(json.dumps(modules), encoding="utf-8")
    return folder


def say_yes() -> None:
    """transformers asks on standard input before running a folder's code: answer yes, as `yes |` would."""
    sys.stdin = io.StringIO("y\n" * 20)


# ----------------------------------------------------------------------------- command lines
def commands(ctx: Context, model: Path | str) -> dict[str, list[str]]:
    """A valid, small command line per command that loads --model (outputs in the case's folder)."""
    f, data, m = ctx.folder, str(ctx.env["data"]), str(model)
    shared = str(ctx.env.get("shared", ""))
    triplets = ctx.write("triplets.tsv", TRIPLETS)
    return {
        "train": ["train", "--model", m, "--data", data, "--output", f"{f}/out/train", "--steps", "1",
                  "--batch-size", "4", "--max-length", "16", "--no-progress", "--device", "cpu"],
        "encode": ["encode", "--model", m, "--input", data, "--output", f"{f}/out/x.npy", "--no-progress"],
        "search": ["search", "--model", m, "--corpus", data, "--query", "the cat", "--no-progress"],
        "index": ["index", "--model", m, "--corpus", data, "--output", f"{f}/out/index", "--no-progress"],
        "export": ["export", "--model", m, "--output", f"{f}/out/export"],
        "eval": ["eval", "--model", m, "--tasks", "sts", "--sts-sets", "sts12", "--data-dir", shared,
                 "--no-progress"],
        "eval-st": ["eval", "--model", m, "--tasks", "sts", "--sts-sets", "sts12", "--data-dir", shared,
                    "--no-progress", "--backend", "sentence-transformers"],
        "eval-reference": ["eval", "--model", str(ctx.env["tiny"]), "--reference-model", m, "--tasks", "isotropy",
                           "--data-dir", shared, "--no-progress"],
        "pretrain-mlm": ["pretrain-mlm", "--corpus", data, "--output", f"{f}/out/mlm", "--model", m,
                         "--max-tokens", "2000", "--seq-length", "32", "--batch-size", "4", "--no-progress",
                         "--device", "cpu"],
        "gloss-pretrain": ["gloss-pretrain", "--model", m, "--triplets", str(triplets), "--output", f"{f}/out/gr",
                           "--steps", "1", "--batch-size", "2", "--no-progress", "--device", "cpu"],
        "lexsub": ["lexsub", "--model", m, "--data-dir", shared, "--limit", "2", "--no-progress"],
        "finetune-sts": ["finetune-sts", "--model", m, "--data-dir", shared, "--fractions", "0.01", "--seeds", "0",
                         "--epochs", "1", "--no-progress", "--device", "cpu"],
        "reproduce": ["reproduce", "--model", m, "--output", f"{f}/out/rep", "--data-dir", shared,
                      "--experiments", "sts", "--quick"],
    }


NEEDS_SHARED = ("eval", "eval-st", "eval-reference", "lexsub", "finetune-sts", "reproduce")
MODEL_COMMANDS = ("train", "encode", "search", "index", "export", "eval", "eval-st", "eval-reference",
                  "pretrain-mlm", "gloss-pretrain", "lexsub", "finetune-sts", "reproduce")


def _command(name: str, yes: bool = False):
    def action(ctx: Context) -> list[str]:
        if yes:
            say_yes()
        return commands(ctx, ctx.folder / "model")[name]

    return action


def _api_encoder_load(yes: bool = False, **kwargs):
    def action(ctx: Context):
        from mirrorbert.encoder.model import Encoder

        if yes:
            say_yes()
        return Encoder.load(ctx.folder / "model", device="cpu", **kwargs)

    return action


def _api_train(yes: bool = False):
    def action(ctx: Context):
        import mirrorbert

        if yes:
            say_yes()
        return mirrorbert.train(mirrorbert.TrainConfig(
            model=str(ctx.folder / "model"), data=str(ctx.env["data"]), output=str(ctx.folder / "out" / "api"),
            steps=1, batch_size=4, max_length=16, device="cpu", show_progress=False))

    return action


def _api_mteb(yes: bool = False):
    def action(ctx: Context):
        from mirrorbert.integrations.mteb import MirrorBertMTEB

        if yes:
            say_yes()
        return MirrorBertMTEB(str(ctx.folder / "model"), device="cpu")

    return action


# ----------------------------------------------------------------------------- checkpoints of real runs
_REFERENCE: dict[tuple[str, str], Path] = {}


def _reference_argv(kind: str, env: dict[str, Path], out: Path) -> list[str]:
    tiny, data = str(env["tiny"]), str(env["data"])
    if kind == "train":
        return ["train", "--model", tiny, "--data", data, "--output", str(out), "--steps", "2", "--batch-size", "4",
                "--max-length", "16", "--no-progress", "--device", "cpu", "--seed", "7"]
    if kind == "mlm":
        return ["pretrain-mlm", "--corpus", data, "--output", str(out), "--model", tiny, "--max-tokens", "1000",
                "--seq-length", "32", "--batch-size", "4", "--no-progress", "--device", "cpu"]
    triplets = env["root"] / "code-triplets.tsv"
    triplets.write_text(TRIPLETS, encoding="utf-8")
    return ["gloss-pretrain", "--model", tiny, "--triplets", str(triplets), "--output", str(out), "--steps", "2",
            "--batch-size", "2", "--no-progress", "--device", "cpu"]


def reference_checkpoint(env: dict[str, Path], kind: str) -> Path:
    """A `step-1` checkpoint of a real tiny run (made once per table), in the current format."""
    key = (str(env["root"]), kind)
    if key not in _REFERENCE:
        from mirrorbert.cli.app import main

        base = env["root"] / f"code-reference-{kind}"
        shutil.rmtree(base, ignore_errors=True)
        argv = _reference_argv(kind, env, base / "out")
        argv += ["--stop-after-steps", "1"] if kind == "mlm" else ["--save-every", "1"]
        import contextlib

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        step = base / "out.checkpoints" / "step-1"
        if rc not in (0, 130) or not step.is_dir():
            raise RuntimeError(f"the reference run for {kind} checkpoints failed (rc {rc})")
        _REFERENCE[key] = step
    return _REFERENCE[key]


def resume_argv(ctx: Context, kind: str, resume: Path) -> list[str]:
    return _reference_argv(kind, ctx.env, ctx.folder / "out" / "resumed") + ["--resume", str(resume)]


def copy_checkpoint(ctx: Context, kind: str) -> Path:
    dest = ctx.folder / "ck" / "step-1"
    shutil.copytree(reference_checkpoint(ctx.env, kind), dest)
    return dest


def pickled_state(step: Path, payload: Any, manifest: str = "removed") -> None:
    """Put the checkpoint's training state in a pickle (training_state.pt) with a payload, in place of the
    safetensors state; its manifest removed or recomputed to match the crafted files."""
    import torch

    from mirrorbert.training.checkpoints import MANIFEST, read_training_state, write_manifest

    state = read_training_state(step)
    state["extra"]["note"] = payload
    torch.save(state, step / "training_state.pt")
    for name in ("training_state.safetensors", "training_state.json"):
        (step / name).unlink()
    (step / MANIFEST).unlink()
    if manifest == "recomputed":
        write_manifest(step)


def pickled_gloss_encoder(step: Path, payload: Any, manifest: str = "removed") -> None:
    import torch
    from safetensors.torch import load_file

    from mirrorbert.training.checkpoints import MANIFEST, write_manifest

    parts = step / "model"
    state: dict[str, Any] = dict(load_file(str(parts / "gloss_encoder.safetensors")))
    state["payload"] = payload
    torch.save(state, parts / "gloss_encoder.pt")
    (parts / "gloss_encoder.safetensors").unlink()
    (step / MANIFEST).unlink()
    if manifest == "recomputed":
        write_manifest(step)


# ----------------------------------------------------------------------------- checks
def _worked_without_code(ctx: Context, result) -> str | None:
    return None


def _resumed(kind: str):
    def check(ctx: Context, result) -> str | None:
        out = ctx.folder / "out" / "resumed"
        if not (out / "config.json").is_file():
            return f"the resumed {kind} run wrote no model to {out}"
        return None

    return check


def _has_vectors(ctx: Context, result) -> str | None:
    path = ctx.folder / "out" / "x.npy"
    if not path.is_file():
        return f"{path} was not written"
    import numpy as np

    rows = np.load(path)
    lines = [line for line in ctx.env["data"].read_text(encoding="utf-8").splitlines() if line.strip()]
    return None if rows.shape[0] == len(lines) else f"{rows.shape[0]} rows for {len(lines)} lines"


def _is_encoder(ctx: Context, result) -> str | None:
    from mirrorbert.encoder.model import Encoder

    return None if isinstance(result.value, Encoder) else f"returned {type(result.value).__name__}"


# ----------------------------------------------------------------------------- the cases
def cases(env: dict[str, Path]) -> list[FileCase]:
    found: list[FileCase] = []
    have_shared = "shared" in env
    usable = [c for c in MODEL_COMMANDS if have_shared or c not in NEEDS_SHARED]

    # --- training state and gloss encoder: crafted pickles in checkpoints, refused as incomplete (the line
    # names the missing manifest or safetensors file), never read
    missing = {"removed": "manifest.json", "recomputed": "training_state.safetensors"}
    state_cases = [
        ("train", "exec", "removed"), ("train", "open", "recomputed"), ("mlm", "system", "removed"),
        ("mlm", "eval", "recomputed"), ("gloss", "exec", "removed"), ("gloss", "open", "recomputed"),
    ]
    for kind, payload, manifest in state_cases:
        def setup(ctx, kind=kind, payload=payload, manifest=manifest):
            pickled_state(copy_checkpoint(ctx, kind), _payload(ctx, payload), manifest)

        found.append(FileCase(
            f"code:{kind}-resume-training-state-pt-{payload}-manifest-{manifest}", WHAT_PICKLE, setup,
            lambda ctx, kind=kind: resume_argv(ctx, kind, ctx.folder / "ck" / "step-1"),
            names=(missing[manifest],), timeout=120))

    def setup_root(ctx):
        pickled_state(copy_checkpoint(ctx, "train"), _payload(ctx, "eval"), "removed")

    found.append(FileCase("code:train-resume-checkpoint-root-training-state-pt", WHAT_PICKLE, setup_root,
                          lambda ctx: resume_argv(ctx, "train", ctx.folder / "ck"), names=("no intact checkpoint",),
                          timeout=120))

    def api_resume(ctx):
        import mirrorbert

        return mirrorbert.train(mirrorbert.TrainConfig(
            model=str(ctx.env["tiny"]), data=str(ctx.env["data"]), output=str(ctx.folder / "out" / "api"), steps=2,
            batch_size=4, max_length=16, device="cpu", seed=7, show_progress=False,
            resume=str(ctx.folder / "ck" / "step-1")))

    found.append(FileCase("code:python-train-resume-training-state-pt", WHAT_PICKLE, setup_root, api_resume,
                          names=("manifest.json",), timeout=120))

    missing_gloss = {"removed": "manifest.json", "recomputed": "gloss_encoder.safetensors"}
    for payload, manifest in (("system", "removed"), ("exec", "recomputed")):
        def setup_gloss(ctx, payload=payload, manifest=manifest):
            pickled_gloss_encoder(copy_checkpoint(ctx, "gloss"), _payload(ctx, payload), manifest)

        found.append(FileCase(f"code:gloss-resume-gloss-encoder-pt-{payload}-manifest-{manifest}", WHAT_PICKLE,
                              setup_gloss, lambda ctx: resume_argv(ctx, "gloss", ctx.folder / "ck" / "step-1"),
                              names=(missing_gloss[manifest],), timeout=120))

    # the checkpoint's model folder: a pickle-only model, or one asking for its own code
    def setup_ck_model_pickle(ctx):
        from mirrorbert.training.checkpoints import write_manifest

        step = copy_checkpoint(ctx, "train")
        shutil.rmtree(step / "model")
        shutil.move(str(pickle_model(ctx, "open", name="crafted")), str(step / "model"))
        (step / "manifest.json").unlink()
        write_manifest(step)

    found.append(FileCase("code:train-resume-checkpoint-model-pickle-bin", WHAT_PICKLE, setup_ck_model_pickle,
                          lambda ctx: resume_argv(ctx, "train", ctx.folder / "ck" / "step-1"),
                          names=("pytorch_model.bin",), timeout=120))

    def setup_ck_model_remote(ctx):
        from mirrorbert.training.checkpoints import write_manifest

        step = copy_checkpoint(ctx, "mlm")
        config_path = step / "model" / "config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config.update(model_type="mirrorbert-evil", auto_map={"AutoConfig": "evil.EvilConfig",
                                                               "AutoModelForMaskedLM": "evil.EvilForMaskedLM"})
        config_path.write_text(json.dumps(config), encoding="utf-8")
        _evil_module(ctx, step / "model")
        (step / "manifest.json").unlink()
        write_manifest(step)

    def resume_yes(ctx):
        say_yes()
        return resume_argv(ctx, "mlm", ctx.folder / "ck" / "step-1")

    found.append(FileCase("code:pretrain-mlm-resume-checkpoint-model-auto-map", WHAT_REMOTE, setup_ck_model_remote,
                          resume_yes, names=("auto_map", "--trust-remote-code"), timeout=120))

    # what must keep working: a planted .pt beside the safetensors state
    def setup_planted(ctx):
        import torch

        step = copy_checkpoint(ctx, "train")
        torch.save({"optimizer": _payload(ctx, "exec")}, step / "training_state.pt")  # beside the real state

    found.append(FileCase("code:train-resume-planted-pt-beside-safetensors-state", WHAT_PICKLE, setup_planted,
                          lambda ctx: resume_argv(ctx, "train", ctx.folder / "ck" / "step-1"), expect=WORKS,
                          check=_resumed("train"), timeout=180))

    # --- pickle-only weights, every command that loads a model
    kinds = list(PAYLOADS)
    for i, name in enumerate(usable):
        kind = kinds[i % len(kinds)]
        found.append(FileCase(f"code:{name}-pytorch-model-bin-{kind}", WHAT_PICKLE,
                              lambda ctx, kind=kind: pickle_model(ctx, kind), _command(name),
                              names=("pytorch_model.bin",), timeout=120))
    found.append(FileCase("code:encoder-load-pytorch-model-bin", WHAT_PICKLE, lambda ctx: pickle_model(ctx, "open"),
                          _api_encoder_load(), names=("pytorch_model.bin",)))
    found.append(FileCase("code:mteb-pytorch-model-bin", WHAT_PICKLE, lambda ctx: pickle_model(ctx, "system"),
                          _api_mteb(), names=("pytorch_model.bin",)))

    def push_pickle(ctx):
        return ["push", "--model", str(ctx.folder / "model"), "--repo", "user/name", "--dry-run", "--output",
                str(ctx.folder / "out" / "push")]

    def saved_pickle(ctx):
        from mirrorbert.encoder.model import Encoder

        folder = Encoder.load(ctx.env["tiny"], pooling="mean", device="cpu").save(ctx.folder / "saved")
        shutil.move(str(folder), str(ctx.folder / "model"))
        import torch
        from safetensors.torch import load_file

        model = ctx.folder / "model"
        state = load_file(str(model / "model.safetensors"))
        (model / "model.safetensors").unlink()
        state["payload"] = _payload(ctx, "eval")
        torch.save(state, model / "pytorch_model.bin")

    found.append(FileCase("code:push-dry-run-pytorch-model-bin-never-loaded", WHAT_PICKLE, saved_pickle, push_pickle,
                          expect=WORKS, check=_worked_without_code))

    # a clean pickle-only model still loads (weights-only unpickling reads it)
    def clean_bin(ctx):
        import torch
        from safetensors.torch import load_file

        folder = ctx.copy_model()
        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        torch.save(state, folder / "pytorch_model.bin")

    found.append(FileCase("code:encode-clean-pytorch-model-bin-works", WHAT_PICKLE, clean_bin,
                          _command("encode"), expect=WORKS, check=_has_vectors))

    # --- auto_map: the folder's own code, with "y" on standard input, every command
    for name in usable:
        found.append(FileCase(f"code:{name}-config-auto-map-stdin-yes", WHAT_REMOTE,
                              lambda ctx: remote_model(ctx, "config"), _command(name, yes=True),
                              names=("auto_map",)))
    for name in ("train", "encode", "lexsub" if have_shared else "search", "gloss-pretrain"):
        found.append(FileCase(f"code:{name}-tokenizer-config-auto-map-stdin-yes", WHAT_REMOTE,
                              lambda ctx: remote_model(ctx, "tokenizer"), _command(name, yes=True),
                              names=("tokenizer_config.json",)))
    found.append(FileCase("code:encoder-load-config-auto-map-stdin-yes", WHAT_REMOTE,
                          lambda ctx: remote_model(ctx, "config"), _api_encoder_load(yes=True),
                          names=("auto_map",)))
    found.append(FileCase("code:encoder-load-tokenizer-auto-map-stdin-yes", WHAT_REMOTE,
                          lambda ctx: remote_model(ctx, "tokenizer"), _api_encoder_load(yes=True),
                          names=("tokenizer_config.json",)))
    found.append(FileCase("code:python-train-config-auto-map-stdin-yes", WHAT_REMOTE,
                          lambda ctx: remote_model(ctx, "both"), _api_train(yes=True), names=("auto_map",)))
    found.append(FileCase("code:mteb-config-auto-map-stdin-yes", WHAT_REMOTE,
                          lambda ctx: remote_model(ctx, "config"), _api_mteb(yes=True), names=("auto_map",)))
    # a known model_type with an auto_map: transformers would quietly build plain BERT; refused all the same
    found.append(FileCase("code:encode-auto-map-on-a-bert-config", WHAT_REMOTE,
                          lambda ctx: remote_model(ctx, "config", model_type="bert"),
                          _command("encode", yes=True), names=("auto_map",)))

    def tokenizer_folder(ctx):
        remote_model(ctx, "tokenizer", name="tok")
        ctx.copy_model("model")

    def mlm_tokenizer(ctx):
        say_yes()
        return commands(ctx, ctx.env["tiny"])["pretrain-mlm"] + ["--tokenizer", str(ctx.folder / "tok")]

    found.append(FileCase("code:pretrain-mlm-tokenizer-option-auto-map-stdin-yes", WHAT_REMOTE, tokenizer_folder,
                          mlm_tokenizer, names=("--tokenizer",)))

    def architecture_file(ctx):
        ctx.copy_model("plain-tok")
        ctx.write("arch.json", json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                                           "num_attention_heads": 2, "intermediate_size": 64,
                                           "auto_map": {"AutoModelForMaskedLM": "evil.EvilForMaskedLM"}}))

    def mlm_architecture(ctx):
        say_yes()
        tok = ctx.folder / "plain-tok"
        return ["pretrain-mlm", "--corpus", str(ctx.env["data"]), "--output", str(ctx.folder / "out" / "mlm"),
                "--architecture", str(ctx.folder / "arch.json"), "--tokenizer", str(tok), "--max-tokens", "1000",
                "--seq-length", "32", "--batch-size", "4", "--no-progress", "--device", "cpu"]

    found.append(FileCase("code:pretrain-mlm-architecture-json-auto-map", WHAT_REMOTE, architecture_file,
                          mlm_architecture, names=("--architecture", "auto_map")))

    def config_file(ctx):
        ctx.copy_model()
        ctx.write("run.yaml", f"model: {ctx.folder / 'model'}\ntrust_remote_code: true\n")

    def train_config_file(ctx):
        return ["train", "--config", str(ctx.folder / "run.yaml"), "--data", str(ctx.env["data"]), "--output",
                str(ctx.folder / "out" / "train"), "--steps", "1", "--batch-size", "4", "--no-progress"]

    found.append(FileCase("code:train-config-file-sets-trust-remote-code", WHAT_REMOTE, config_file,
                          train_config_file, names=("--config", "run.yaml")))

    found.append(FileCase("code:encoder-load-trust-remote-code-not-a-boolean", WHAT_REMOTE,
                          lambda ctx: remote_model(ctx, "config"), _api_encoder_load(trust_remote_code="yes"),
                          names=("trust_remote_code",)))

    # --- --trust-remote-code given on a folder without auto_map: works as without it
    def trusted_encode(ctx):
        return commands(ctx, ctx.folder / "model")["encode"] + ["--trust-remote-code"]

    found.append(FileCase("code:encode-trust-remote-code-on-a-plain-folder-works", WHAT_REMOTE,
                          lambda ctx: ctx.copy_model(), trusted_encode, expect=WORKS, check=_has_vectors))
    found.append(FileCase("code:encoder-load-trust-remote-code-on-a-plain-folder-works", WHAT_REMOTE,
                          lambda ctx: ctx.copy_model(), _api_encoder_load(trust_remote_code=True),
                          expect=WORKS, check=_is_encoder))

    # --- modules.json naming a module class from another package
    found.append(FileCase("code:encode-modules-json-foreign-module", WHAT_ST, foreign_modules_model,
                          _command("encode"), names=("modules.json",)))
    found.append(FileCase("code:encoder-load-modules-json-foreign-module", WHAT_ST, foreign_modules_model,
                          _api_encoder_load(), names=("modules.json",)))
    if have_shared:
        found.append(FileCase("code:eval-st-backend-modules-json-foreign-module", WHAT_ST, foreign_modules_model,
                              _command("eval-st"), names=("modules.json",)))
    return found
