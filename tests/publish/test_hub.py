"""Publishing on the Hugging Face Hub: `mirrorbert push`, `--dry-run`, `train --push-to-hub` and
`hub.push_encoder`. Offline: the real push path runs against a recording stand-in for `HfApi`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from mirrorbert.publish import hub
from mirrorbert.cli.app import main
from mirrorbert.compat import installed_version
from mirrorbert.encoder.model import Encoder
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.writes import MARKER
from support import one_error_line, snapshot

TEXTS = ["a cat sat on the mat", "heart attack", "the bank raised rates"]
REPO = "me/tiny-encoder"


def upload_files(folder: Path) -> list[str]:
    """The files of a saved model folder that would go to the Hub, sorted."""
    return list(hub.list_upload(ConfinedFolder(folder, "--model", kind="model folder")))


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory) -> Path:
    """A model saved by mirrorbert, plus what a training output may also hold: a checkpoint, temporaries."""
    folder = Encoder.load(tiny_bert, pooling="mean", device="cpu").save(tmp_path_factory.mktemp("hub") / "saved")
    (folder / "step-2").mkdir()
    (folder / "step-2" / "training_state.pt").write_bytes(b"optimiser state")
    (folder / ".README.md.tmp").write_text("half-written\n", encoding="utf-8")
    (folder / ".mirrorbert-write-test-abc").write_text("", encoding="utf-8")
    return folder


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load a model or tokenizer fails the test: push never needs one."""
    import transformers

    def trap(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(Encoder, "load", trap)
    for name in ("AutoConfig", "AutoTokenizer", "AutoModel", "AutoModelForMaskedLM"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", trap)


@pytest.fixture
def hub_calls(monkeypatch):
    """HfApi.create_repo / upload_folder replaced by recorders (the uploaded folder's content is kept)."""
    from huggingface_hub import HfApi

    calls: list[tuple[str, str, dict]] = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        calls.append(("upload_folder", repo_id, {**kwargs, "content": snapshot(Path(folder_path))}))
        return f"https://huggingface.co/{repo_id}/commit/0123abc"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def dry_run(capsys, model: Path, output: Path, repo: str = REPO, *extra: str) -> dict:
    assert main(["push", "--model", str(model), "--repo", repo, "--dry-run", "--output", str(output), *extra]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- what is uploaded
def test_dry_run_writes_exactly_the_upload(saved, tmp_path, capsys, no_model_load):
    out = tmp_path / "upload"
    record = dry_run(capsys, saved, out)
    written = snapshot(out)
    # the marker is the write policy's claim on the dry-run folder; it is not part of the upload
    planned = hub.plan_upload(hub.open_model_folder(saved), REPO)
    assert set(written) - {MARKER} == set(record["files"]) == set(planned.files)
    assert record["files"] == upload_files(saved) and record["repo"] == REPO
    assert record["bytes"] == sum(len(v) for k, v in written.items() if k != MARKER)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "modules.json", "1_Pooling/config.json",
                 "sentence_bert_config.json", "config_sentence_transformers.json", "mirrorbert.json", "README.md"):
        assert name in record["files"], name
    # none of mirrorbert's bookkeeping, no checkpoint
    assert not [f for f in record["files"] if f.startswith(".") or "/." in f or f.startswith("step-")]
    assert MARKER not in record["files"] and ".README.md.tmp" not in record["files"]
    # the files are the saved ones, the card is rendered for the repo
    for name in record["files"]:
        if name != "README.md":
            assert written[name] == (saved / name).read_bytes(), name
    card = written["README.md"].decode("utf-8")
    assert f"SentenceTransformer({REPO!r})" in card and f"AutoModel.from_pretrained({REPO!r})" in card
    assert f"Encoder.load({REPO!r})" in card and card.startswith("---\n") and "\n# tiny-encoder\n" in card
    assert record["card"] == "rendered for the repo"


def test_the_dry_run_folder_loads_to_the_same_vectors(saved, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "upload"
    dry_run(capsys, saved, out)
    expected = Encoder.load(saved, device="cpu").encode(TEXTS)
    np.testing.assert_allclose(Encoder.load(out, device="cpu").encode(TEXTS), expected, atol=1e-6)
    np.testing.assert_allclose(SentenceTransformer(str(out), device="cpu").encode(TEXTS), expected, atol=1e-5)


def test_dry_run_output_follows_the_write_policy(saved, tmp_path, capsys, no_model_load):
    out = tmp_path / "upload"
    dry_run(capsys, saved, out)
    before = snapshot(out)
    assert main(["push", "--model", str(saved), "--repo", REPO, "--dry-run", "--output", str(out)]) == 2
    one_error_line(capsys, "--output", "already exists; pass --overwrite")
    assert snapshot(out) == before
    record = dry_run(capsys, saved, out, "me/other", "--overwrite")  # replaced: mirrorbert wrote all of it
    assert "SentenceTransformer('me/other')" in (out / "README.md").read_text(encoding="utf-8")
    assert record["repo"] == "me/other"
    assert main(["push", "--model", str(saved), "--repo", REPO, "--dry-run", "--output", str(saved / "up"),
                 "--overwrite"]) == 2
    one_error_line(capsys, "--output", "lies inside the input --model")
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".upload")]  # no lock or temporary left


def test_an_edited_card_goes_up_as_it_is(saved, tmp_path, capsys):
    mine = tmp_path / "mine"
    shutil.copytree(saved, mine)
    (mine / "README.md").write_text("---\nlibrary_name: sentence-transformers\n---\n# my own card\n", encoding="utf-8")
    record = dry_run(capsys, mine, tmp_path / "upload")
    assert (tmp_path / "upload" / "README.md").read_text(encoding="utf-8").endswith("# my own card\n")
    assert "as it is" in record["card"]
    (mine / "README.md").unlink()  # no card at all: one is written from mirrorbert.json
    record = dry_run(capsys, mine, tmp_path / "upload2")
    assert "README.md" in record["files"] and "from mirrorbert.json" in record["card"]


def test_a_dry_run_folder_pushes_the_same_files(saved, tmp_path, capsys):
    first = dry_run(capsys, saved, tmp_path / "a")
    second = dry_run(capsys, tmp_path / "a", tmp_path / "b")  # its marker is left out in turn
    assert first["files"] == second["files"] and first["bytes"] == second["bytes"]
    assert snapshot(tmp_path / "a").keys() == snapshot(tmp_path / "b").keys()


# ----------------------------------------------------------------------------- the real push, recorded
def test_push_calls_create_repo_and_upload_folder(saved, tmp_path, capsys, hub_calls, no_model_load):
    upload = tmp_path / "upload"
    expected = dry_run(capsys, saved, upload)
    assert main(["push", "--model", str(saved), "--repo", REPO, "--private", "--commit-message", "first"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [c[0] for c in hub_calls] == ["create_repo", "upload_folder"]
    (_, repo, create), (_, repo2, sent) = hub_calls
    assert repo == repo2 == REPO and create["exist_ok"] is True and create["private"] is True
    assert sent["commit_message"] == "first" and sent.get("repo_type", "model") == "model"
    # exactly what the dry run wrote, byte for byte (the marker aside)
    assert sent["content"] == {k: v for k, v in snapshot(upload).items() if k != MARKER}
    assert record["files"] == expected["files"] and record["url"] == f"https://huggingface.co/{REPO}"
    assert not [p for p in saved.parent.iterdir() if ".tmp-push-" in p.name]  # the staging folder is gone


def test_push_without_private_leaves_the_visibility_to_the_hub(saved, capsys, hub_calls):
    assert main(["push", "--model", str(saved), "--repo", REPO]) == 0
    assert hub_calls[0][2]["private"] is None


def test_offline_push_is_one_error_line_naming_the_repo(saved, capsys, monkeypatch):
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:  # conftest sets HF_HUB_OFFLINE=1; never reach for the network here
        pytest.skip("HF_HUB_OFFLINE is not set")
    assert main(["push", "--model", str(saved), "--repo", REPO]) == 2
    line = one_error_line(capsys, f"--repo {REPO}", "could not push to the Hugging Face Hub")
    assert "offline" in line.lower()
    assert not [p for p in saved.parent.iterdir() if ".tmp-push-" in p.name]


def test_a_network_error_is_one_error_line_naming_the_repo(saved, capsys, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    def unreachable(self, *args, **kwargs):
        raise hub_errors.HTTPError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    assert main(["push", "--model", str(saved), "--repo", REPO]) == 2
    one_error_line(capsys, f"--repo {REPO}", "Name or service not known")


# ----------------------------------------------------------------------------- bad input, before anything
@pytest.mark.parametrize("repo", ["bad/id/x", "no-namespace", "-me/x", "me/x-", "me/x--y", "me/x..y", "me/x.git",
                                  "me/a b", "me/", "/x", "", "me/" + "a" * 97, "me/caf\u00e9"])
def test_bad_repo_ids_are_refused(saved, tmp_path, capsys, no_model_load, hub_calls, repo):
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    option = f"--repo={repo}"  # one argument, even where it starts with "-"
    assert main(["push", "--model", str(saved), option, "--dry-run", "--output", str(tmp_path / "o")]) == 2
    one_error_line(capsys, "--repo", "not a Hugging Face Hub repo id" if repo else "--repo must not be empty")
    assert main(["push", "--model", str(saved), option]) == 2
    one_error_line(capsys, "--repo")
    assert not hub_calls and not (tmp_path / "o").exists()
    if repo == "me/caf\u00e9" and installed_version("huggingface-hub") < (1,):
        return  # huggingface_hub 0.x's own check lets non-ASCII names through; mirrorbert refuses them above
    if repo != "no-namespace":  # huggingface_hub refuses the others too (a bare name it would put under the login)
        with pytest.raises(HFValidationError):
            validate_repo_id(repo)


@pytest.mark.parametrize("repo", ["me/tiny", "Org_1/model.v2-x", "a/b", "me/" + "a" * 96])
def test_good_repo_ids_pass_here_and_in_huggingface_hub(repo):
    from huggingface_hub.utils import validate_repo_id

    assert hub.check_repo_id(repo) == repo
    validate_repo_id(repo)


def test_not_a_saved_model_folder_is_refused(tiny_bert, tmp_path, capsys, no_model_load, hub_calls):
    cases = [(tiny_bert, "no mirrorbert.json"), (tmp_path / "missing", "not found"),
             (tmp_path / "f.txt", "is a file")]
    (tmp_path / "f.txt").write_text("x\n", encoding="utf-8")
    for model, message in cases:
        assert main(["push", "--model", str(model), "--repo", REPO, "--dry-run", "--output", str(tmp_path / "o")]) == 2
        one_error_line(capsys, "--model", message)
        assert main(["push", "--model", str(model), "--repo", REPO]) == 2
        one_error_line(capsys, "--model", message)
    assert not hub_calls and not (tmp_path / "o").exists()


def test_damaged_saved_folder_is_refused(saved, tmp_path, capsys, hub_calls):
    for damage, message in [(lambda f: (f / "mirrorbert.json").write_text("{bad", encoding="utf-8"), "damaged"),
                            (lambda f: (f / "model.safetensors").unlink(), "no weights"),
                            (lambda f: (f / "modules.json").write_text('{"a": 1}', encoding="utf-8"), "damaged"),
                            (lambda f: shutil.rmtree(f / "1_Pooling"), "1_Pooling")]:
        copy = tmp_path / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(saved, copy)
        damage(copy)
        assert main(["push", "--model", str(copy), "--repo", REPO]) == 2
        one_error_line(capsys, "--model", message)
    assert not hub_calls


def test_output_and_dry_run_go_together(saved, tmp_path, capsys, hub_calls):
    assert main(["push", "--model", str(saved), "--repo", REPO, "--output", str(tmp_path / "o")]) == 2
    one_error_line(capsys, "--output", "only with --dry-run")
    assert main(["push", "--model", str(saved), "--repo", REPO, "--dry-run"]) == 2
    one_error_line(capsys, "--dry-run", "--output")
    assert not hub_calls and not (tmp_path / "o").exists()


def test_push_help_imports_nothing_heavy():
    from support import heavy_modules_after as _modules_after

    code = ("from mirrorbert.cli.app import main\n"
            "for argv in (['push', '--help'], ['train', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "assert main(['push', '--model', 'nowhere', '--repo', 'bad/id/x']) == 2\n")
    assert _modules_after(code) == []


# ----------------------------------------------------------------------------- train --push-to-hub
def test_train_push_to_hub_bad_repo_is_refused_before_training(tiny_bert, strings_file, tmp_path, capsys,
                                                               monkeypatch):
    import mirrorbert.mirror.train

    def trap(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(mirrorbert.mirror.train, "train", trap)
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_bert), "--data", str(strings_file), "--output", str(out),
                 "--push-to-hub", "bad/id/x"]) == 2
    one_error_line(capsys, "--push-to-hub 'bad/id/x'", "not a Hugging Face Hub repo id")
    assert not out.exists()


TRAIN = ["--batch-size", "4", "--steps", "1", "--max-length", "16", "--no-progress", "--device", "cpu"]


def test_train_push_to_hub_pushes_the_saved_output(tiny_bert, strings_file, tmp_path, capsys, hub_calls):
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_bert), "--data", str(strings_file), "--output", str(out),
                 *TRAIN, "--push-to-hub", REPO]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pushed"] == f"https://huggingface.co/{REPO}"
    (_, repo, _), (_, repo2, sent) = hub_calls
    assert repo == repo2 == REPO
    assert set(sent["content"]) == set(upload_files(out)) and MARKER not in sent["content"]
    for name, data in sent["content"].items():
        if name != "README.md":
            assert data == (out / name).read_bytes(), name
    card = sent["content"]["README.md"].decode("utf-8")
    assert f"SentenceTransformer({REPO!r})" in card and "## Training Details" in card


def test_train_push_to_hub_offline_keeps_the_model_and_says_how_to_push(tiny_bert, strings_file, tmp_path, capsys,
                                                                       monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    def unreachable(self, *args, **kwargs):
        raise hub_errors.HTTPError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_bert), "--data", str(strings_file), "--output", str(out),
                 *TRAIN, "--push-to-hub", REPO]) == 2
    one_error_line(capsys, f"--push-to-hub {REPO}", "could not push", f"saved in {out}",
                   f"mirrorbert push --model {out} --repo {REPO}")
    assert (out / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- push_encoder
def test_push_encoder_dry_run_and_push(tiny_bert, tmp_path, hub_calls):
    enc = Encoder.load(tiny_bert, pooling="cls", device="cpu")
    record = hub.push_encoder(enc, REPO, dry_run_dir=tmp_path / "up")
    assert not hub_calls and record["dry_run"] is True
    written = snapshot(tmp_path / "up")
    assert set(written) - {MARKER} == set(record["files"]) and "model.safetensors" in record["files"]
    assert f"SentenceTransformer({REPO!r})" in written["README.md"].decode("utf-8")
    np.testing.assert_allclose(Encoder.load(tmp_path / "up", device="cpu").encode(TEXTS), enc.encode(TEXTS),
                               atol=1e-6)
    with pytest.raises(UserError, match="dry_run_dir .* already exists"):
        hub.push_encoder(enc, REPO, dry_run_dir=tmp_path / "up")
    with pytest.raises(UserError, match="repo_id 'bad/id/x'"):
        hub.push_encoder(enc, "bad/id/x")
    assert not hub_calls

    record = hub.push_encoder(enc, REPO, private=True, commit_message="from Python")
    (_, _, create), (_, repo, sent) = hub_calls
    assert repo == REPO and create["private"] is True and sent["commit_message"] == "from Python"
    assert set(sent["content"]) == set(record["files"]) == set(written) - {MARKER}
    assert sent["content"]["model.safetensors"] == written["model.safetensors"]


def test_push_encoder_offline_raises_user_error(tiny_bert, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    def unreachable(self, *args, **kwargs):
        raise hub_errors.HTTPError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    with pytest.raises(UserError, match=f"repo_id {REPO}: could not push"):
        hub.push_encoder(Encoder.load(tiny_bert, device="cpu"), REPO)


def test_the_uploaded_card_front_matter_is_valid_yaml(saved, tmp_path, capsys):
    dry_run(capsys, saved, tmp_path / "up")
    card = (tmp_path / "up" / "README.md").read_text(encoding="utf-8")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "sentence-transformers" and front["pipeline_tag"] == "sentence-similarity"
    assert "sentence-transformers" in front["tags"]
    # the Hub refuses a base_model that is no Hub model: a local one is named in the text only
    assert "base_model" not in front and "(a local model)" in card
    meta = json.loads((saved / "mirrorbert.json").read_text(encoding="utf-8"))
    from mirrorbert.publish.model_card import render_model_card

    on_hub = render_model_card({**meta, "base_model": "bert-base-uncased"}, folder=saved, name=REPO, hub=True)
    assert yaml.safe_load(on_hub.split("---\n")[1])["base_model"] == "bert-base-uncased"
