"""The confined reader (safeguards/confined.py) and the model-folder check built on it (model_files.py)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time

import pytest

from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder, hf_blob_store
from mirrorbert.safeguards.model_files import check_model_folder, module_type_allowed


def vet_model_folder(folder, trust_remote_code=False):
    checked = check_model_folder(folder, trust_remote_code=trust_remote_code)
    checked.close()
    return checked


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "given"
    root.mkdir()
    (root / "config.json").write_text('{"a": 1}', encoding="utf-8")
    (root / "sub").mkdir()
    (root / "sub" / "inner.json").write_text("[1, 2]", encoding="utf-8")
    (tmp_path / "outside.json").write_text('{"secret": 1}', encoding="utf-8")
    return root


def test_reads_what_is_inside(folder):
    confined = ConfinedFolder(folder, "--model")
    assert confined.read_json("config.json") == {"a": 1}
    assert confined.read_json("sub/inner.json", expect=list) == [1, 2]
    os.symlink("config.json", folder / "alias.json")  # a link that stays inside is followed
    assert confined.read_json("alias.json") == {"a": 1}


@pytest.mark.parametrize("name", ["../outside.json", "sub/../../outside.json", "/etc/hostname", "", "a\0b"])
def test_names_that_lead_out_are_refused(folder, name):
    with pytest.raises(UserError, match="--model"):
        ConfinedFolder(folder, "--model").read_bytes(name)


def test_a_link_out_is_refused_naming_the_file_that_named_it(folder):
    os.symlink(folder.parent / "outside.json", folder / "link.json")
    with pytest.raises(UserError) as caught:
        ConfinedFolder(folder, "--index", "index folder").read_json("link.json", named_in="manifest.json")
    message = str(caught.value)
    assert "manifest.json names 'link.json'" in message and "leads out of the index folder" in message


def test_a_link_swapped_back_for_a_file_mid_walk_is_refused(folder, monkeypatch):
    os.symlink("config.json", folder / "alias.json")

    def swapped(*args, **kwargs):  # what readlink says when the link became a file after the walk's stat
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "readlink", swapped)
    with pytest.raises(UserError, match="alias.json: changed while it was read"):
        ConfinedFolder(folder, "--model").read_json("alias.json")


def test_a_fifo_is_refused_at_once(folder):
    os.mkfifo(folder / "tokenizer.json")
    start = time.monotonic()
    with pytest.raises(UserError, match="is a FIFO"):
        ConfinedFolder(folder, "--model").read_bytes("tokenizer.json")
    assert time.monotonic() - start < 5  # refused on the descriptor, never read


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_inside_the_folder_is_refused(folder):
    os.mknod(folder / "vocab.txt", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # a /dev/zero of its own
    with pytest.raises(UserError, match="is a character device"):
        ConfinedFolder(folder, "--model").read_text("vocab.txt")


def test_size_depth_and_encoding_are_bounded(folder):
    confined = ConfinedFolder(folder, "--model")
    (folder / "big.json").write_bytes(b"[" + b"1," * 100 + b"1]")
    with pytest.raises(UserError, match="203 bytes, more than the 10"):
        confined.read_json("big.json", expect=list, limit=10)
    (folder / "deep.json").write_bytes(b"[" * 100_000)
    with pytest.raises(UserError, match="nested deeper"):
        confined.read_json("deep.json")
    (folder / "latin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(UserError, match="not UTF-8"):
        confined.read_text("latin.txt")
    with pytest.raises(UserError, match="expected an object"):
        confined.read_json("sub/inner.json")


def test_a_subfolder_named_in_a_file_stays_confined(folder):
    confined = ConfinedFolder(folder, "--model")
    sub = confined.subfolder("sub", named_in="modules.json")
    assert sub.read_json("inner.json", expect=list) == [1, 2]
    with pytest.raises(UserError, match="leads out"):
        sub.read_bytes("../../outside.json")
    with pytest.raises(UserError, match="modules.json names '..'"):
        confined.subfolder("..", named_in="modules.json")


def test_a_hugging_face_snapshot_may_link_into_its_blob_store(tmp_path):
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs" / "0f0f").write_text('{"model_type": "bert"}', encoding="utf-8")
    os.symlink("../../blobs/0f0f", snapshot / "config.json")
    (tmp_path / "hub" / "elsewhere.json").write_text("{}", encoding="utf-8")
    os.symlink("../../../elsewhere.json", snapshot / "other.json")
    assert hf_blob_store(snapshot) == repo / "blobs"
    confined = ConfinedFolder(snapshot, "--model")
    assert confined.read_json("config.json") == {"model_type": "bert"}
    with pytest.raises(UserError, match="leads out"):
        confined.read_json("other.json")
    assert hf_blob_store(tmp_path) is None


def test_a_file_given_as_the_folder_is_refused(folder):
    with pytest.raises(UserError, match="expected a model folder"):
        ConfinedFolder(folder / "config.json", "--model", "model folder")


# ----------------------------------------------------------------------------- the model-folder check
@pytest.fixture
def saved(tmp_path, tiny_bert):
    from mirrorbert.encoder.model import Encoder

    return Encoder.load(tiny_bert, pooling="mean", device="cpu").save(tmp_path / "saved")


def test_a_saved_folder_passes_and_its_files_are_parsed(saved):
    model = vet_model_folder(saved)
    assert model.get("config.json")["model_type"] == "bert"
    assert [m["_folder"] for m in model.modules if m["type"].endswith(".Pooling")] == ["1_Pooling"]
    assert "model.safetensors" in model.tensors and "1_Pooling/config.json" in model.copied


def test_an_unknown_pooling_mode_is_refused(saved):
    (saved / "1_Pooling" / "config.json").write_text('{"pooling_mode": "telepathy"}', encoding="utf-8")
    with pytest.raises(UserError, match="unknown pooling mode"):
        vet_model_folder(saved)


def test_a_fifo_under_any_name_is_refused(saved):
    os.mkfifo(saved / "notes")
    with pytest.raises(UserError, match="notes: is a FIFO"):
        vet_model_folder(saved)


def test_hidden_bookkeeping_is_not_read(saved):
    os.mkfifo(saved / ".git-fifo")  # hidden: no loader opens it
    vet_model_folder(saved)


@pytest.mark.parametrize("path, reason", [("../x", "leads out"), ("/tmp", "leads out")])
def test_module_paths_stay_inside(saved, path, reason):
    modules = json.loads((saved / "modules.json").read_text(encoding="utf-8"))
    modules[-1]["path"] = path
    (saved / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    with pytest.raises(UserError, match=reason):
        vet_model_folder(saved)


def test_a_module_folder_is_checked_like_the_folder(saved):
    shutil.rmtree(saved / "1_Pooling")
    (saved / "1_Pooling").mkdir()
    (saved / "1_Pooling" / "config.json").write_bytes(b"{" * 1000)
    with pytest.raises(UserError, match="1_Pooling/config.json: damaged"):
        vet_model_folder(saved)


def test_auto_map_in_a_module_folder_needs_trust(saved):
    shutil.copytree(saved, saved.parent / "copy")
    copy = saved.parent / "copy"
    (copy / "1_Pooling" / "config.json").write_text('{"auto_map": {"AutoModel": "x.Y"}}', encoding="utf-8")
    with pytest.raises(UserError, match="auto_map"):
        vet_model_folder(copy)
    vet_model_folder(copy, trust_remote_code=True)


@pytest.mark.parametrize("kind, allowed", [
    ("sentence_transformers.models.Pooling", True), ("sentence_transformers.models.Transformer", True),
    ("sentence_transformers.sparse_encoder.models.SpladePooling", True),
    ("sentence_transformers.base.modules.transformer.Transformer", True),
    ("sentence_transformers.base.modules.transformer.os.system", False),
    ("sentence_transformers.base.modules.Pooling.x.Y", False),
    ("sentence_transformers.util.misc.import_from_string", False), ("sentence_transformers.SentenceTransformer", False),
    ("sentence_transformers.models.os.system", False), ("evilpkg.models.Pooling", False), (None, False),
])
def test_module_types(kind, allowed):
    assert module_type_allowed(kind) is allowed
