"""No write follows a link or replaces what is not ours; failures lose nothing: a full disk or a name too long is
one line, and a failed API call leaves an encoder as it was. Faults are simulated with links, FIFOs, sockets,
monkeypatched system calls and (where this process may mount one) a tmpfs; never with chmod (tests may run as root).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mirrorbert.safeguards import writes as safety
from mirrorbert.safeguards.writes.locks import LOCK_RECORD, folder_lock, lock_path
from mirrorbert.safeguards.writes.markers import foreign_file
from mirrorbert.safeguards.writes.paths import OWN_TEMPORARY, own_name
from mirrorbert.safeguards.writes.plan import check_replaceable, check_replaceable_file
from mirrorbert.errors import UserError
from support import can_mount


def _victim(path: Path, content: bytes = b"precious\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if OWN_TEMPORARY.match(p.name))


# --------------------------------------------------------------------------- locks
def test_a_lock_never_follows_a_symlink_at_its_path(tmp_path):
    victim = _victim(tmp_path / "victim.txt")
    out = tmp_path / "out"
    os.symlink(victim, lock_path(out))
    with pytest.raises(UserError, match=r"lock path .*\.out\.lock is a symlink"):
        with folder_lock(out, "--output"):
            pass
    assert victim.read_bytes() == b"precious\n"


def test_a_dangling_symlink_at_the_lock_path_creates_nothing(tmp_path):
    out = tmp_path / "out"
    os.symlink(tmp_path / "never-created", lock_path(out))
    with pytest.raises(UserError, match="symlink"):
        with folder_lock(out, "--output"):
            pass
    assert not os.path.lexists(tmp_path / "never-created")


@pytest.mark.parametrize("kind", ["fifo", "folder", "socket"])
def test_a_special_file_at_the_lock_path_is_refused_without_opening_it(tmp_path, monkeypatch, kind):
    lock = lock_path(tmp_path / "out")
    if kind == "fifo":
        os.mkfifo(lock)  # opening it for reading would wait for a writer forever
    elif kind == "folder":
        lock.mkdir()
    else:
        monkeypatch.chdir(tmp_path)  # socket paths are limited to about 108 bytes: bind a relative one
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(lock.name)
    with pytest.raises(UserError, match=f"lock path {re.escape(str(lock))} is a"):
        with folder_lock(tmp_path / "out", "--output"):
            pass
    assert os.path.lexists(lock)


def test_a_planted_regular_file_at_the_lock_path_is_locked_but_never_written_nor_removed(tmp_path):
    lock = _victim(lock_path(tmp_path / "out"), b"someone's notes\n")
    with folder_lock(tmp_path / "out", "--output"):
        with pytest.raises(UserError, match="another mirrorbert run is using it"):  # it still locks
            with folder_lock(tmp_path / "out", "--output"):
                pass
    assert lock.read_bytes() == b"someone's notes\n"


def test_a_lock_of_mirrorbert_left_by_a_killed_run_is_reused_and_removed(tmp_path):
    lock = _victim(lock_path(tmp_path / "out"), f"{LOCK_RECORD}99999\n".encode())
    with folder_lock(tmp_path / "out", "--output"):
        pass
    assert not lock.exists()


def test_a_fresh_lock_records_the_pid_and_goes_away(tmp_path):
    with folder_lock(tmp_path / "out", "--output") as lock:
        assert lock.read_text(encoding="utf-8") == f"{LOCK_RECORD}{os.getpid()}\n"
    assert not lock.exists()


# --------------------------------------------------------------------------- names near NAME_MAX
@pytest.mark.parametrize("length", [1, 240, 249, 250, 255])
def test_own_names_fit_the_filesystem_and_stay_ours(tmp_path, length):
    name = "é" * (length // 2) + "n" * (length % 2)  # multi-byte: cut on bytes, not characters
    for tag, room in (("lock", 0), ("tmp-", 8), (f"old-{os.getpid()}", 0)):
        own = own_name(tmp_path / name, tag, room)
        assert len(os.fsencode(own)) + room <= 255
        assert OWN_TEMPORARY.match(own + ("abcdefgh" if room else ""))
        (tmp_path / (own + ("abcdefgh" if room else ""))).touch()  # the filesystem takes it
    assert own_name(tmp_path / ("a" * 255), "lock") != own_name(tmp_path / ("a" * 254 + "b"), "lock")


def test_a_255_byte_file_and_folder_are_written_and_256_refused_naming_the_option(tmp_path):
    file_name, folder_name = "f" * 251 + ".npy", "d" * 255
    safety.write_text_atomic(tmp_path / file_name, "x")
    with folder_lock(tmp_path / folder_name, "--output"), \
            safety.atomic_output_dir(tmp_path / folder_name) as tmp:
        (tmp / "a.txt").write_text("a", encoding="utf-8")
    assert (tmp_path / file_name).read_text(encoding="utf-8") == "x"
    assert (tmp_path / folder_name / "a.txt").exists()
    assert _temporaries(tmp_path) == []
    with pytest.raises(UserError, match=r"^--report .*: a name of 256 bytes in it is longer than the filesystem"):
        safety.WritePlan({}).file("--report", tmp_path / ("r" * 256)).check()


# --------------------------------------------------------------------------- what is replaced
def _special(tmp_path: Path, kind: str, monkeypatch) -> Path:
    path = tmp_path / "x.npy"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        monkeypatch.chdir(tmp_path)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(path.name)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "pipe")
        os.symlink(tmp_path / "pipe", path)
    elif kind == "char-device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
    return path


@pytest.mark.parametrize("kind", ["fifo", "socket", "link-to-fifo", "char-device"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_only_regular_files_and_folders_are_ever_replaced(tmp_path, monkeypatch, kind, overwrite):
    path = _special(tmp_path, kind, monkeypatch)
    before = os.lstat(path)
    for check in (check_replaceable_file, check_replaceable):
        with pytest.raises(UserError, match=r"^--output .*x\.npy: is a (FIFO|socket|character device)"):
            check(path, overwrite, "--output")
    with pytest.raises(UserError, match="only writes regular files and folders"):
        with safety.atomic_output_file(path, overwrite=overwrite):
            pass
    assert os.path.samestat(os.lstat(path), before)


def test_remove_tree_unlinks_a_symlinked_folder_and_leaves_its_target(tmp_path):
    target = tmp_path / "precious"
    _victim(target / "thesis.tex")
    os.symlink(target, tmp_path / "step-3")
    safety.remove_tree(tmp_path / "step-3")
    assert not os.path.lexists(tmp_path / "step-3")
    assert (target / "thesis.tex").read_bytes() == b"precious\n"
    safety.remove_tree(tmp_path / "missing")  # nothing there: nothing to do


def test_overwrite_and_rotation_remove_a_symlinked_step_not_its_target(tmp_path):
    from mirrorbert.training.checkpoints import CheckpointManager, check_checkpoint_root

    target = tmp_path / "precious"
    _victim(target / "thesis.tex")
    root = tmp_path / "ck"
    root.mkdir()
    os.symlink(target, root / "step-7")
    check_checkpoint_root(root, resuming=False, overwrite=True)
    assert not os.path.lexists(root / "step-7")
    os.symlink(target, root / "step-1")
    (root / "step-2").mkdir()
    CheckpointManager(root, keep=1)._prune(3)
    assert sorted(os.listdir(root)) == []
    assert (target / "thesis.tex").read_bytes() == b"precious\n"


def test_a_listed_file_replaced_by_a_fifo_is_foreign_and_never_read(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.txt").write_text("a", encoding="utf-8")
    safety.mark_folder(folder, files=["a.txt"])
    (folder / "a.txt").unlink()
    os.mkfifo(folder / "a.txt")
    assert foreign_file(folder) == folder / "a.txt"


def test_the_marker_temporary_is_exclusive_and_never_follows_a_planted_link(tmp_path):
    victim = _victim(tmp_path / "victim.txt")
    folder = tmp_path / "out"
    folder.mkdir()
    for name in (f".{safety.MARKER}.tmp", ".state.json.tmp"):  # the fixed names they used to be written under
        os.symlink(victim, folder / name)
    safety.mark_folder(folder)
    safety.write_json_atomic(folder / "state.json", {"a": 1})
    assert victim.read_bytes() == b"precious\n"
    assert safety.read_marker(folder)["files"] == []


def test_fixing_an_outputs_modes_never_reaches_through_a_link(tmp_path):
    outside = _victim(tmp_path / "private" / "key", b"secret")
    os.chmod(outside, 0o600)
    os.chmod(outside.parent, 0o700)
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    os.symlink(outside.parent, out / "sub" / "linked")
    os.symlink(outside, out / "key-link")
    safety.fix_folder_mode(out)
    assert (outside.stat().st_mode & 0o777, outside.parent.stat().st_mode & 0o777) == (0o600, 0o700)


# --------------------------------------------------------------------------- what goes out
def test_only_regular_files_inside_the_folder_are_published(tmp_path):
    from mirrorbert.publish.hub import list_upload
    from mirrorbert.safeguards.confined import ConfinedFolder

    def upload_files(folder, option="--model"):
        return list(list_upload(ConfinedFolder(folder, option, kind="model folder")))

    model = tmp_path / "model"
    _victim(model / "config.json", b"{}")
    token = _victim(tmp_path / "home" / "token", b"hf_SECRET\n")
    assert upload_files(model) == ["config.json"]
    os.symlink(token, model / "notes.txt")
    with pytest.raises(UserError, match=r"^--model .*: notes.txt is a symlink to .*token; only regular files"):
        upload_files(model)
    (model / "notes.txt").unlink()
    os.symlink(tmp_path / "home", model / "extras")  # a linked folder too
    with pytest.raises(UserError, match="extras is a symlink"):
        upload_files(model, "encoder")
    (model / "extras").unlink()
    os.mkfifo(model / "pipe")
    with pytest.raises(UserError, match="pipe is a FIFO"):
        upload_files(model)


# --------------------------------------------------------------------------- failed writes
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG])
def test_a_failed_write_is_one_line_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, code):
    target = _victim(tmp_path / "x.npy", b"the previous vectors")
    with pytest.raises(UserError) as caught:
        with safety.atomic_output_file(target, overwrite=True) as tmp:
            tmp.write_bytes(b"half")
            raise OSError(code, os.strerror(code))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--output {target}: cannot write it: ")
    assert target.read_bytes() == b"the previous vectors"
    assert _temporaries(tmp_path) == []


def test_write_failures_of_libraries_without_oserror_are_recognised(tmp_path, monkeypatch):
    """By the errno a Rust library carries (its Debug or Display form), or, for an error with none, by what the
    filesystem says: the same torch error is a full disk on a full disk and passes through on one with room."""
    class SafetensorError(Exception):
        pass

    spelled = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')
    bare = Exception("No space left on device (os error 28)")  # tokenizers' save
    torch_zip = RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing "
                             "file data/0: file write failed")
    for exc in (spelled, bare):
        with pytest.raises(UserError, match="no space left on the device"):
            with safety.atomic_output_dir(tmp_path / "out", option="--output"):
                raise exc
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):  # room on the disk: not a full disk
        with safety.atomic_output_dir(tmp_path / "out", option="--output"):
            raise torch_zip
    full = os.statvfs(tmp_path)
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((*full[:3], 0, 0, *full[5:])))
    with pytest.raises(UserError, match="no space left on the device"):
        with safety.atomic_output_dir(tmp_path / "out", option="--output"):
            raise torch_zip
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == []
    with pytest.raises(KeyError):  # anything else passes through unchanged
        with safety.write_errors(tmp_path / "x"):
            raise KeyError("not a write failure")


def test_preallocation_turns_a_full_disk_into_an_error_before_the_memory_map(tmp_path, monkeypatch):
    calls = []

    def full(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with open(tmp_path / "x", "wb") as fh:
        with pytest.raises(UserError, match=r"^--output .*out\.npy: cannot write it: no space .*about 1\.0 MB needed"):
            safety.preallocate(fh.fileno(), 1 << 20, tmp_path / "out.npy")
    monkeypatch.setattr(os, "posix_fallocate", lambda *a: (_ for _ in ()).throw(OSError(errno.EOPNOTSUPP, "no")))
    with open(tmp_path / "x", "wb") as fh:
        safety.preallocate(fh.fileno(), 1 << 20, tmp_path / "out.npy")  # unsupported: left to the write
    assert calls == [1 << 20]


@pytest.mark.skipif(not can_mount(), reason="needs root and permission to mount a tmpfs")
def test_encode_to_npy_on_a_nearly_full_tmpfs_is_an_error_not_a_sigbus(tmp_path):
    from mirrorbert.encoder.streaming import ChunkedInput, encode_to_npy

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        rows = 4096  # 4096 x 32 float32: 512 KB, far more than the 64 KB there
        source = ChunkedInput(rows, lambda: iter([["a"] * rows]))
        with pytest.raises(UserError, match=r"^--output .*x\.npy: cannot write it: no space left"):
            with safety.atomic_output_file(disk / "x.npy") as tmp:
                encode_to_npy(lambda chunk: np.ones((len(chunk), 32), np.float32), source, 32, tmp,
                              target=disk / "x.npy")
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_sigterm_during_encode_removes_the_temporary_and_exits_130(tmp_path, tiny_bert, strings_file, monkeypatch):
    from mirrorbert.cli.app import main
    from mirrorbert.encoder.model import Encoder

    original = Encoder.encode

    def encode(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "encode", encode)
    before = signal.getsignal(signal.SIGTERM)
    previous = _victim(tmp_path / "x.npy", b"the previous vectors")
    assert main(["encode", "--model", str(tiny_bert), "--input", str(strings_file), "--output", str(previous),
                 "--overwrite", "--no-progress"]) == 130
    assert previous.read_bytes() == b"the previous vectors"
    assert _temporaries(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) == before  # the CLI's handler is gone again


# --------------------------------------------------------------------------- the API leaves objects as they were
@pytest.fixture(scope="module")
def encoder(tiny_bert):
    from mirrorbert.encoder.model import Encoder

    return Encoder.load(tiny_bert, device="cpu")


@pytest.mark.parametrize("call", ["encode-meta", "encode-cuda7", "encode-unknown", "to-meta", "to-cuda7"])
def test_a_refused_device_leaves_the_encoder_as_it_was(encoder, corpus, call):
    before = encoder.encode(corpus)
    state = {k: v.clone() for k, v in encoder.state_dict().items()}
    device = {"meta": "meta", "cuda7": "cuda:7", "unknown": "gpu9"}[call.split("-")[1]]
    with pytest.raises(UserError, match="^device"):
        if call.startswith("encode"):
            encoder.encode(corpus, device=device)
        else:
            encoder.to(device)
    assert encoder.device.type == "cpu"
    assert all(np.array_equal(v.numpy(), state[k].numpy()) for k, v in encoder.state_dict().items())
    assert np.array_equal(encoder.encode(corpus), before)


def test_a_move_that_fails_halfway_is_moved_back(encoder, monkeypatch, corpus):
    import torch

    before = encoder.encode(corpus)
    moved = []
    original = torch.nn.Module._apply

    def failing(self, fn, *args, **kwargs):
        if not moved:
            moved.append(True)
            raise RuntimeError("out of memory halfway")
        return original(self, fn, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "_apply", failing)
    with pytest.raises(RuntimeError, match="halfway"):
        encoder.to("cpu")
    monkeypatch.undo()
    assert encoder.device.type == "cpu" and np.array_equal(encoder.encode(corpus), before)


def test_search_index_save_follows_the_policy(encoder, corpus, tmp_path):
    from mirrorbert.search.exact import SearchIndex, build_index

    index = build_index(encoder, corpus[:3])
    _victim(tmp_path / "afile", b"not an index")
    with pytest.raises(UserError, match=r"^folder .*afile exists and is not a folder"):
        index.save(tmp_path / "afile")
    saved = index.save(tmp_path / "idx")
    with pytest.raises(UserError, match="already exists; pass --overwrite"):
        index.save(tmp_path / "idx")
    index.save(tmp_path / "idx", overwrite=True)  # its own folder: replaced
    assert len(SearchIndex.load(saved)) == 3
    _victim(tmp_path / "mine" / "notes.txt")
    with pytest.raises(UserError, match="only replaces a folder mirrorbert wrote"):
        index.save(tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_bytes() == b"precious\n"
