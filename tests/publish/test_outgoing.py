"""What leaves the machine (issue 34): `push` and `push --dry-run` send only regular, single-link files that
come from inside the model folder, copied from the descriptor that was checked, and a card built only from
the folder's own files. Offline: the real push runs against a recording stand-in for `HfApi`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mirrorbert.cli.app import main
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError
from mirrorbert.publish import hub
from mirrorbert.publish.model_card import model_architecture, public_name, render_model_card
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.writes import MARKER
from support import one_error_line

REPO = "me/tiny-encoder"
SECRET = "SECRET-FROM-OUTSIDE"


@pytest.fixture(scope="module")
def saved_once(tiny_bert, tmp_path_factory) -> Path:
    return Encoder.load(tiny_bert, pooling="mean", device="cpu").save(tmp_path_factory.mktemp("out") / "saved")


@pytest.fixture
def model(saved_once, tmp_path) -> Path:
    """A fresh copy of a saved model folder, beside a folder `outside/` holding a secret."""
    shutil.copytree(saved_once, tmp_path / "model")
    (tmp_path / "outside").mkdir()
    for name in ("README.md", "report.md", "config.json", "token"):
        (tmp_path / "outside" / name).write_text(f'{{"secret": "{SECRET} {name}"}}\n', encoding="utf-8")
    return tmp_path / "model"


@pytest.fixture
def hub_calls(monkeypatch):
    """HfApi.create_repo / upload_folder replaced by recorders (the staged folder's files and inodes kept)."""
    from huggingface_hub import HfApi

    calls: list[dict] = []

    def create_repo(self, repo_id, **kwargs):
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        staged = {p.relative_to(folder_path).as_posix(): p for p in Path(folder_path).rglob("*") if p.is_file()}
        calls.append({"content": {rel: p.read_bytes() for rel, p in staged.items()},
                      "stat": {rel: os.lstat(p) for rel, p in staged.items()}})
        return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def refused(capsys, model: Path, out: Path, *fragments: str) -> str:
    """Both the dry run and the push end in one error line holding `fragments`, and nothing is written."""
    lines = []
    for argv in (["--dry-run", "--output", str(out)], []):
        assert main(["push", "--model", str(model), "--repo", REPO, *argv]) == 2
        lines.append(one_error_line(capsys, *fragments))
    assert not out.exists()
    assert not [p for p in model.parent.iterdir() if ".tmp-push-" in p.name]
    return lines[0]


def dry_run(capsys, model: Path, out: Path) -> dict:
    assert main(["push", "--model", str(model), "--repo", REPO, "--dry-run", "--output", str(out)]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- links and special files
@pytest.mark.parametrize("rel", ["notes.txt", "model.safetensors", "1_Pooling/config.json", "mirrorbert.json"])
def test_a_hard_link_to_a_file_outside_is_refused(model, tmp_path, capsys, hub_calls, rel):
    victim = tmp_path / "outside" / "token"
    if (model / rel).exists():
        victim.write_bytes((model / rel).read_bytes())  # the same bytes: only the link is wrong
        (model / rel).unlink()
    os.link(victim, model / rel)
    refused(capsys, model, tmp_path / "upload", f"{rel} is a hard link (2 names", "only regular files")
    assert not hub_calls and os.stat(victim).st_nlink == 2


@pytest.mark.parametrize("make, name", [
    (lambda m, o: os.symlink(o / "token", m / "1_Pooling" / "notes.txt"), "1_Pooling/notes.txt is a symlink to"),
    (lambda m, o: (m / "a" / "b").mkdir(parents=True) or os.symlink(o, m / "a" / "b" / "c"), "a/b/c is a symlink"),
    (lambda m, o: os.symlink(o, m / "extras"), "extras is a symlink to"),
    (lambda m, o: os.mkfifo(m / "1_Pooling" / "pipe"), "1_Pooling/pipe is a FIFO"),
])
def test_a_link_or_special_file_anywhere_below_is_refused(model, tmp_path, capsys, hub_calls, make, name):
    make(model, tmp_path / "outside")
    refused(capsys, model, tmp_path / "upload", name)
    assert not hub_calls


def test_bookkeeping_is_left_out_even_when_it_holds_links(model, tmp_path, capsys):
    (model / ".cache").mkdir()
    os.symlink(tmp_path / "outside" / "token", model / ".cache" / "token")
    (model / "step-3").mkdir()
    os.link(tmp_path / "outside" / "token", model / "step-3" / "state")
    (model / "notes").mkdir()
    (model / "notes" / "training.md").write_text("trained on a laptop\n", encoding="utf-8")
    record = dry_run(capsys, model, tmp_path / "upload")
    assert "notes/training.md" in record["files"]
    assert not [f for f in record["files"] if f.startswith((".cache", "step-"))]


# ----------------------------------------------------------------------------- swapped between check and copy
def _swap(how: str, model: Path, outside: Path, rel: str) -> None:
    target = model / rel
    if how == "renamed-in":  # regular, one link, but another inode than the one listed
        shutil.copy(outside / "token", outside / "moved")
        os.replace(outside / "moved", target)
    elif how == "hard-link":
        target.unlink()
        os.link(outside / "token", target)
    elif how == "symlink":
        target.unlink()
        os.symlink(outside / "token", target)
    elif how == "folder-linked":  # O_NOFOLLOW alone guards only the last part of a path
        evil = outside / "evil"
        shutil.copytree(target.parent, evil)
        (evil / target.name).write_text(SECRET, encoding="utf-8")
        os.rename(target.parent, outside / "aside")
        os.symlink(evil, target.parent)


@pytest.mark.parametrize("link", [False, True])
@pytest.mark.parametrize("how, rel", [("renamed-in", "config.json"), ("hard-link", "tokenizer_config.json"),
                                      ("symlink", "model.safetensors"), ("folder-linked", "1_Pooling/config.json")])
def test_a_file_swapped_between_check_and_copy_is_refused(model, tmp_path, how, rel, link):
    upload = hub.plan_upload(hub.open_model_folder(model), REPO)
    _swap(how, model, tmp_path / "outside", rel)
    dest = tmp_path / "staged"
    dest.mkdir()
    with pytest.raises(UserError, match=f"{rel}: changed since the folder was listed"):
        upload.write(dest, link=link)
    assert not any(SECRET.encode() in p.read_bytes() for p in dest.rglob("*") if p.is_file())


def test_the_push_stages_the_checked_files_and_leaves_them_single(model, tmp_path, capsys, hub_calls):
    expected = dry_run(capsys, model, tmp_path / "upload")
    assert main(["push", "--model", str(model), "--repo", REPO]) == 0
    record = json.loads(capsys.readouterr().out)
    (sent,) = hub_calls
    assert sorted(sent["content"]) == record["files"] == expected["files"]
    for rel, data in sent["content"].items():
        assert data == (tmp_path / "upload" / rel).read_bytes(), rel
        if rel != "README.md":  # hard links where the filesystem allows: the very inode that was checked
            assert os.path.samestat(sent["stat"][rel], os.lstat(model / rel)), rel
    # the staging folder is gone, so the model's files have one link again and push again
    assert all(os.lstat(model / rel).st_nlink == 1 for rel in record["files"])
    assert main(["push", "--model", str(model), "--repo", REPO]) == 0


# ----------------------------------------------------------------------------- the card
@pytest.mark.parametrize("how", ["../outside", "absolute", ".linked", "1_Pooling/../../outside"])
def test_a_module_folder_leading_out_never_reaches_the_card(model, tmp_path, capsys, hub_calls, how):
    outside = tmp_path / "outside"
    path = {"absolute": str(outside)}.get(how, how)
    if how == ".linked":  # a dot-folder is not uploaded, yet the card would have read it
        os.symlink(outside, model / ".linked")
    modules = json.loads((model / "modules.json").read_text(encoding="utf-8"))
    modules[1]["path"] = path
    (model / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    refused(capsys, model, tmp_path / "upload", f"modules.json names {path!r}: leads out of the model folder")
    assert not hub_calls
    with pytest.raises(UserError, match="modules.json names .*leads out"):
        model_architecture(model)
    with pytest.raises(UserError, match="modules.json names .*leads out"):
        render_model_card({"pooling": "mean"}, folder=model)


@pytest.mark.parametrize("folder", [".module", "step-1"])
def test_the_card_reads_only_files_that_go_up(model, tmp_path, capsys, hub_calls, folder):
    """A module folder left out of the upload (a dot-folder, a checkpoint) is never listed, so a hard link
    there to a file outside would reach the card if the card read it."""
    (model / folder).mkdir()
    os.link(tmp_path / "outside" / "config.json", model / folder / "config.json")
    modules = json.loads((model / "modules.json").read_text(encoding="utf-8"))
    modules[1]["path"] = folder
    (model / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    refused(capsys, model, tmp_path / "upload", f"{folder}/config.json: is not one of the files that go up")
    assert not hub_calls


def test_paths_in_mirrorbert_json_are_named_never_read(model, tmp_path, capsys):
    outside = tmp_path / "outside"
    meta = json.loads((model / "mirrorbert.json").read_text(encoding="utf-8"))
    meta["base_model"] = str(outside)
    meta["training"] = {"method": "mirror-bert",
                        "config": {"model": "../outside", "output": str(outside), "data": "../outside/token"},
                        "data": {"strings": 3, "source": str(outside / "README.md")},
                        "eval_after": {"tasks": ["sts"], "data_dir": str(outside), "report": "../outside/report.md",
                                       "metrics": {"sts/stsb": 0.5}},
                        "readme": str(outside / "README.md")}
    (model / "mirrorbert.json").write_text(json.dumps(meta), encoding="utf-8")
    dry_run(capsys, model, tmp_path / "upload")
    card = (tmp_path / "upload" / "README.md").read_text(encoding="utf-8")
    assert SECRET not in card and str(tmp_path) not in card
    assert "`outside` (a local model)" in card and "from `README.md`" in card and "| sts | stsb | 50.00 |" in card


@pytest.mark.parametrize("rel", ["mirrorbert.json", "modules.json", "config.json", "1_Pooling/config.json",
                                 "sentence_bert_config.json", "config_sentence_transformers.json"])
def test_a_card_source_nested_too_deep_is_refused_by_name(model, tmp_path, capsys, hub_calls, rel):
    (model / rel).write_text("[" * 5000 + "]" * 5000, encoding="utf-8")
    refused(capsys, model, tmp_path / "upload", rel, "nested deeper than")


@pytest.mark.parametrize("field, value", [("training", ["a"]), ("pooling", {"mean": True}),
                                          ("training", {"method": ["mirror-bert"]})])
def test_a_mirrorbert_json_the_card_cannot_show_is_refused_by_name(model, tmp_path, capsys, field, value):
    meta = json.loads((model / "mirrorbert.json").read_text(encoding="utf-8"))
    meta[field] = value
    (model / "mirrorbert.json").write_text(json.dumps(meta), encoding="utf-8")
    refused(capsys, model, tmp_path / "upload", "mirrorbert.json: damaged (the model card cannot be written")


@pytest.mark.parametrize("make", [os.mkfifo, lambda p: os.symlink(p.parent.parent / "outside" / "token", p)])
def test_a_marker_that_is_no_file_inside_leaves_the_card_as_it_is(model, tmp_path, capsys, make):
    (model / MARKER).unlink()
    make(model / MARKER)
    record = dry_run(capsys, model, tmp_path / "upload")
    assert "as it is" in record["card"]
    assert (tmp_path / "upload" / "README.md").read_bytes() == (model / "README.md").read_bytes()


def test_the_card_reads_through_a_confined_folder(model):
    folder = ConfinedFolder(model, "--model", kind="model folder")
    assert model_architecture(folder) == model_architecture(model)
    assert model_architecture(folder).startswith("SentenceTransformer(\n  (0): Transformer(")


def test_public_name_of_a_name_no_filesystem_takes():
    assert public_name("a" * 5000) == "a" * 5000 and public_name("x\0y") == "x\0y"


def test_the_push_table_lists_every_file_a_saved_folder_publishes(tmp_path, tiny_bert):
    """tests/hostile_files/cases_push.py names the files of a saved folder without building one."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hostile_files.cases_push import SAVED_FILES, saved_files

    from mirrorbert.encoder.model import Encoder

    folder = Encoder.load(tiny_bert, device="cpu").save(tmp_path / "saved")
    assert tuple(saved_files(folder)) == SAVED_FILES
