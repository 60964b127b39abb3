"""Hostile files for what leaves the machine (issue 34): `mirrorbert push` and `push --dry-run`.

Nothing goes up that mirrorbert cannot show came from inside the model folder. Generated from the files of a
folder saved by mirrorbert: each file x {a hard link to a file outside, a symlink out, reached through a
symlinked subfolder, a FIFO, a symlink deep in a subfolder} for the dry run (and the hard links for the real
push, which must refuse before any network); the sources of the model card (fields of mirrorbert.json that
hold paths x {a path out, an absolute path, JSON nested too deep}, modules.json's module folders, each JSON
file the card reads, nested too deep); a file or folder swapped between the check and the copy; a planted
marker; and a check that the dry run writes exactly what the real push stages.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hostile_files.harness import WORKS, Context, FileCase, Result

WHAT_LINK = "link or special file in an outgoing folder"
WHAT_CARD = "model card source leading out of the folder"
WHAT_SWAP = "outgoing file swapped between check and copy"
WHAT_SAME = "dry run and push disagree"
SECRET = "SECRET-FROM-OUTSIDE-7f3a"
REPO = "user/name"
DEEP = 5000  # far beyond the JSON nesting bound, and beyond what a recursive parser survives at 1000


# ----------------------------------------------------------------------------- the saved folder
def saved_model(env: dict) -> Path:
    """The tiny model saved by mirrorbert, made once for the table (cases copy it)."""
    folder = Path(env["root"]) / "push-saved"
    if not folder.exists():
        from mirrorbert.encoder.model import Encoder

        Encoder.load(env["tiny"], device="cpu").save(folder)
    return folder


def saved_files(folder: Path) -> list[str]:
    """Every file a saved model folder publishes (mirrorbert's marker aside)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not p.name.startswith("."))


def model(ctx: Context) -> Path:
    return ctx.folder / "model"


def copy_model(ctx: Context) -> Path:
    dest = model(ctx)
    if not dest.exists():
        shutil.copytree(saved_model(ctx.env), dest, symlinks=True)
    return dest


def outside(ctx: Context, name: str, content: bytes | None = None) -> Path:
    """A file of the user's outside the model folder (a victim: it must stay as it was)."""
    return ctx.victim(ctx.folder / "outside" / name, content if content is not None else SECRET.encode() + b"\n")


def dry(ctx: Context) -> list[str]:
    return ["push", "--model", str(model(ctx)), "--repo", REPO, "--dry-run", "--output", str(ctx.folder / "upload")]


def real_push(ctx: Context) -> list[str]:
    """The real push: refused before any network (the harness runs offline, so reaching the Hub would end in an
    error naming --repo instead of the file)."""
    return ["push", "--model", str(model(ctx)), "--repo", REPO]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".mirrorbert-output"}


# ----------------------------------------------------------------------------- every file x an attack
def _hard_link(ctx: Context, rel: str) -> None:
    target = model(ctx) / rel
    victim = outside(ctx, Path(rel).name, target.read_bytes())
    target.unlink()
    os.link(victim, target)


def _symlink_out(ctx: Context, rel: str) -> None:
    target = model(ctx) / rel
    victim = outside(ctx, Path(rel).name, target.read_bytes())
    target.unlink()
    os.symlink(victim, target)


def _linked_folder(ctx: Context, rel: str) -> None:
    """The file's folder is a symlink out (a top-level file: a linked subfolder `linked/` holding it)."""
    source = model(ctx) / rel
    if "/" in rel:
        sub = rel.split("/", 1)[0]
        aside = ctx.folder / "outside" / sub
        shutil.move(str(model(ctx) / sub), str(aside))
        for path in aside.rglob("*"):
            ctx.victim(path, None)
        os.symlink(aside, model(ctx) / sub)
    else:
        outside(ctx, f"linked/{rel}", source.read_bytes())
        os.symlink(ctx.folder / "outside" / "linked", model(ctx) / "linked")


def _fifo(ctx: Context, rel: str) -> None:
    target = model(ctx) / rel
    target.unlink()
    os.mkfifo(target)


def _deep_link(ctx: Context, rel: str) -> None:
    """A symlink out two real subfolders down."""
    target = model(ctx) / "extra" / "deeper" / Path(rel).name
    target.parent.mkdir(parents=True)
    os.symlink(outside(ctx, Path(rel).name, (model(ctx) / rel).read_bytes()), target)


ATTACKS = {
    "hard-link-out": (_hard_link, lambda rel: (rel,)),
    "symlink-out": (_symlink_out, lambda rel: (rel,)),
    "symlinked-folder": (_linked_folder, lambda rel: (rel.split("/", 1)[0] if "/" in rel else "linked",)),
    "fifo": (_fifo, lambda rel: (rel,)),
    "deep-symlink": (_deep_link, lambda rel: (f"extra/deeper/{Path(rel).name}",)),
}


def _attack_setup(attack, rel: str):
    def setup(ctx: Context) -> None:
        copy_model(ctx)
        attack(ctx, rel)
    return setup


def _file_cases(files: list[str]) -> list[FileCase]:
    found = []
    for rel in files:
        for name, (attack, names) in ATTACKS.items():
            found.append(FileCase(f"push-dry-run:{name}:{rel}", WHAT_LINK, _attack_setup(attack, rel), dry,
                                  names=names(rel), timeout=30))
        found.append(FileCase(f"push-no-network:hard-link-out:{rel}", WHAT_LINK, _attack_setup(_hard_link, rel),
                              real_push, names=(rel,), timeout=30))
    return found


# ----------------------------------------------------------------------------- the card's sources
# Fields of mirrorbert.json that hold a path (or could be taken for one): the card names them, never opens them.
PATH_FIELDS = (("base_model",), ("training", "config", "model"), ("training", "config", "output"),
               ("training", "config", "data"), ("training", "data", "source"), ("training", "eval_after", "data_dir"),
               ("training", "eval_after", "report"), ("training", "readme"))


def _set_field(ctx: Context, keys: tuple[str, ...], value) -> None:
    path = model(ctx) / "mirrorbert.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    node = meta
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value
    path.write_text(json.dumps(meta), encoding="utf-8")


def _secrets_outside(ctx: Context) -> Path:
    """A folder outside holding what a path in mirrorbert.json could name: a README, a report, a config."""
    for name in ("README.md", "report.md", "config.json", "strings.txt"):
        outside(ctx, name, f"{SECRET} in {name}\n".encode())
    return ctx.folder / "outside"


def _field_setup(keys: tuple[str, ...], how: str):
    def setup(ctx: Context) -> None:
        copy_model(ctx)
        where = _secrets_outside(ctx)
        target = "README.md" if keys[-1] in ("report", "readme", "data", "source") else ""
        value = {"out": f"../outside/{target}".rstrip("/"), "absolute": str(where / target).rstrip("/"),
                 "deep": None}[how]
        if how == "deep":  # written by hand: json.dumps itself recurses
            _set_field(ctx, keys, "__DEEP__")
            path = model(ctx) / "mirrorbert.json"
            deep = "[" * DEEP + '"leaf"' + "]" * DEEP
            path.write_text(path.read_text(encoding="utf-8").replace('"__DEEP__"', deep), encoding="utf-8")
        else:
            _set_field(ctx, keys, value)
    return setup


def card_holds_nothing_from_outside(ctx: Context, result: Result) -> str | None:
    card_path = ctx.folder / "upload" / "README.md"
    if not card_path.is_file():
        return "no card was written"
    card = card_path.read_text(encoding="utf-8")
    if SECRET in card:
        return "the card holds content of a file outside the model folder"
    if str(ctx.folder) in card:
        return "the card holds an absolute path of this machine"
    expected = set(saved_files(model(ctx)))
    written = set(snapshot(ctx.folder / "upload"))
    return None if written == expected else f"uploaded {sorted(written ^ expected)} differently"


def _card_field_cases() -> list[FileCase]:
    found = []
    for keys in PATH_FIELDS:
        field = ".".join(keys)
        for how in ("out", "absolute"):
            found.append(FileCase(f"push-card:{field}:path-{how}", WHAT_CARD, _field_setup(keys, how), dry,
                                  expect=WORKS, check=card_holds_nothing_from_outside))
        found.append(FileCase(f"push-card:{field}:deep-json", WHAT_CARD, _field_setup(keys, "deep"), dry,
                              names=("mirrorbert.json",), timeout=30))
    return found


def _deep_file(rel: str):
    def setup(ctx: Context) -> None:
        copy_model(ctx)
        (model(ctx) / rel).write_text("[" * DEEP + "]" * DEEP, encoding="utf-8")
    return setup


def _module_path(how: str):
    def setup(ctx: Context) -> None:
        copy_model(ctx)
        secrets = ctx.folder / "outside" / "module"
        ctx.victim(secrets / "config.json", json.dumps({"secret": SECRET}).encode())
        path = model(ctx) / "modules.json"
        modules = json.loads(path.read_text(encoding="utf-8"))
        pooling = next(m for m in modules if m.get("path"))
        if how == "out":
            pooling["path"] = "../outside/module"
        elif how == "absolute":
            pooling["path"] = str(secrets)
        elif how == "dot-folder-linked-out":  # a dot-folder is not uploaded, but the card would read it
            os.symlink(secrets, model(ctx) / ".module")
            pooling["path"] = ".module"
        elif how == "inner-link-out":
            os.symlink(secrets, model(ctx) / pooling["path"] / "inner")
            pooling["path"] = f"{pooling['path']}/inner"
        elif how in ("dot-folder-hard-link", "checkpoint-hard-link"):  # inside, but left out of the upload
            sub = model(ctx) / (".module" if how.startswith("dot") else "step-1")
            sub.mkdir()
            os.link(secrets / "config.json", sub / "config.json")
            pooling["path"] = sub.name
        elif how == "parent-walk":
            pooling["path"] = f"{pooling['path']}/../../outside/module"
        path.write_text(json.dumps(modules), encoding="utf-8")
    return setup


CARD_JSON = ("modules.json", "config.json", "1_Pooling/config.json", "sentence_bert_config.json",
             "config_sentence_transformers.json", "mirrorbert.json")


def _card_file_cases(files: list[str]) -> list[FileCase]:
    found = [FileCase(f"push-card:deep-json-file:{rel}", WHAT_CARD, _deep_file(rel), dry, names=(rel,), timeout=30)
             for rel in CARD_JSON if rel in files]
    for how in ("out", "absolute", "dot-folder-linked-out", "inner-link-out", "parent-walk", "dot-folder-hard-link",
                "checkpoint-hard-link"):
        found.append(FileCase(f"push-card:modules-json-path:{how}", WHAT_CARD, _module_path(how), dry,
                              names=("modules.json", "1_Pooling/inner", ".module/config.json", "step-1/config.json")))

    def wrong_type(keys: tuple[str, ...], value):
        def setup(ctx: Context) -> None:
            copy_model(ctx)
            _set_field(ctx, keys, value)
        return setup

    for keys, value in ((("training",), ["a", "list"]), (("training", "method"), ["mirror-bert"]),
                        (("pooling",), {"mean": True}), (("training", "eval_after", "metrics"), [1, 2])):
        found.append(FileCase(f"push-card:wrong-type:{'.'.join(keys)}", WHAT_CARD, wrong_type(keys, value), dry,
                              names=("mirrorbert.json",)))
    return found


# ----------------------------------------------------------------------------- the marker
def _marker(kind: str):
    def setup(ctx: Context) -> None:
        folder = copy_model(ctx)
        marker = folder / ".mirrorbert-output"
        marker.unlink()
        if kind == "fifo":
            os.mkfifo(marker)
        else:  # a link to a crafted marker outside, claiming the card (which holds a secret) is mirrorbert's
            (folder / "README.md").write_text(f"# edited by hand\n{SECRET}\n", encoding="utf-8")
            os.symlink(outside(ctx, "marker", json.dumps({"files": [], "digests": {}}).encode()), marker)
    return setup


def card_as_it_is(ctx: Context, result: Result) -> str | None:
    sent, mine = ctx.folder / "upload" / "README.md", model(ctx) / "README.md"
    if not sent.is_file():
        return "no card was written"
    return None if sent.read_bytes() == mine.read_bytes() else "the card was not uploaded as it is"


# ----------------------------------------------------------------------------- swapped between check and copy
def _swap(how: str, rel: str):
    """Replace `rel` after push planned its upload (listing and checks done), before it copies the files."""
    def swap(ctx: Context) -> None:
        target = model(ctx) / rel
        planted = target.read_bytes().replace(b"{", b'{"secret": "' + SECRET.encode() + b'", ', 1)
        victim = outside(ctx, "swapped", planted)
        if how == "renamed-in":  # a file from outside moved over it: regular, one link, another inode
            aside = ctx.folder / "aside"
            shutil.copy(victim, aside)
            os.replace(aside, target)
        elif how == "hard-link":
            target.unlink()
            os.link(victim, target)
        elif how == "symlink":
            target.unlink()
            os.symlink(victim, target)
        elif how == "fifo":
            target.unlink()
            os.mkfifo(target)
        elif how == "folder-linked":
            sub = model(ctx) / rel.split("/", 1)[0]
            evil = ctx.folder / "evil"
            shutil.copytree(sub, evil)
            (evil / Path(rel).name).write_bytes(victim.read_bytes())
            os.rename(sub, ctx.folder / "aside-folder")
            os.symlink(evil, sub)
    return swap


def _swapped_action(swap, real: bool):
    def action(ctx: Context):
        from mirrorbert.publish import hub

        plan = hub.plan_upload

        def plan_then_swap(*args, **kwargs):
            upload = plan(*args, **kwargs)
            swap(ctx)
            return upload

        hub.plan_upload = plan_then_swap
        try:
            if real:
                return hub.push_folder(model(ctx), REPO)
            return hub.dry_run(model(ctx), REPO, ctx.folder / "upload")
        finally:
            hub.plan_upload = plan
    return action


def _copy_only(ctx: Context) -> None:
    copy_model(ctx)


def _swap_cases() -> list[FileCase]:
    found = []
    for how, rel in (("renamed-in", "config_sentence_transformers.json"), ("hard-link", "config.json"),
                     ("symlink", "tokenizer_config.json"), ("fifo", "sentence_bert_config.json"),
                     ("folder-linked", "1_Pooling/config.json")):
        for real in (False, True):
            found.append(FileCase(f"push-swap:{how}:{'push' if real else 'dry-run'}", WHAT_SWAP,
                                  _copy_only, _swapped_action(_swap(how, rel), real),
                                  names=(rel,), timeout=30))
    return found


# ----------------------------------------------------------------------------- the dry run is the push
def _dry_run_and_push(ctx: Context):
    from huggingface_hub import HfApi

    from mirrorbert.publish import hub

    folder = copy_model(ctx)
    (folder / "notes").mkdir()
    (folder / "notes" / "training.md").write_text("trained on a laptop\n", encoding="utf-8")
    (folder / ".cache").mkdir()
    os.symlink(outside(ctx, "token", b"hf_SECRET\n"), folder / ".cache" / "token")  # a dot-folder: left out
    sent: dict[str, bytes] = {}

    def create_repo(self, repo_id, **kwargs):
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        sent.update(snapshot(Path(folder_path)))
        return f"https://huggingface.co/{repo_id}/commit/0"

    saved = HfApi.create_repo, HfApi.upload_folder
    HfApi.create_repo, HfApi.upload_folder = create_repo, upload_folder
    try:
        hub.push_folder(folder, REPO)
    finally:
        HfApi.create_repo, HfApi.upload_folder = saved
    hub.dry_run(folder, REPO, ctx.folder / "upload")
    return {"sent": sent, "dry": snapshot(ctx.folder / "upload")}


def same_files(ctx: Context, result: Result) -> str | None:
    sent, dry_run = result.value["sent"], result.value["dry"]
    if sent != dry_run:
        return f"the dry run wrote {sorted(dry_run)}, the push sent {sorted(sent)}"
    if "notes/training.md" not in sent or any(".cache" in name or name.endswith("/token") for name in sent):
        return f"unexpected upload {sorted(sent)}"
    return None


# What a saved model folder publishes (tests/publish checks the list against a real save): the case ids are
# known without building a model, so the table can be listed before its environment exists.
SAVED_FILES = ("1_Pooling/config.json", "README.md", "config.json", "config_sentence_transformers.json",
               "mirrorbert.json", "model.safetensors", "modules.json", "sentence_bert_config.json",
               "tokenizer.json", "tokenizer_config.json")


def cases(env: dict) -> list[FileCase]:
    files = list(SAVED_FILES)
    return [
        *_file_cases(files),
        *_card_field_cases(),
        *_card_file_cases(files),
        FileCase("push-marker:fifo", WHAT_LINK, _marker("fifo"), dry, expect=WORKS, check=card_as_it_is, timeout=30),
        FileCase("push-marker:symlink-out-claims-card", WHAT_LINK, _marker("link"), dry, expect=WORKS,
                 check=card_as_it_is),
        *_swap_cases(),
        FileCase("push-same:dry-run-writes-what-push-sends", WHAT_SAME, None, _dry_run_and_push, expect=WORKS,
                 check=same_files),
    ]
