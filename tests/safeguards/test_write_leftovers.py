"""What a killed run (really killed, SIGKILL) leaves is removed by the next writer, and nothing else; nothing is
deleted or written on a file's word: a marker or manifest proves a file only with its real digest; a link at an
output is replaced, never followed; a mount point is never an output; a path that cannot hold a folder is one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorbert.errors import UserError
from mirrorbert.safeguards import writes as safety
from mirrorbert.safeguards.writes.locks import lock_path
from mirrorbert.safeguards.writes.markers import RECORD_LIMIT, foreign_file
from mirrorbert.safeguards.writes.paths import OWN_TEMPORARY
from mirrorbert.safeguards.writes.plan import check_checkpoints_proven, check_replaceable
from mirrorbert.safeguards.writes.temporaries import (boot_id, owner_gone, owner_record, remove_stale_temporaries,
                                                      set_aside_name, start_ticks)
from support import can_mount

NOBODY = 65534


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(".") and (".tmp-" in n or ".old-" in n))


def _die_leaving(target: Path, body: str) -> None:
    """Run `body` in a child process (`target`, `safety`, `set_aside_name` and Path are defined) that then kills
    itself with SIGKILL: nothing of it runs any cleanup."""
    code = ("import os, signal, sys\nfrom pathlib import Path\nfrom mirrorbert.safeguards import writes as safety\n"
            "from mirrorbert.safeguards.writes.temporaries import set_aside_name\n"
            f"target = Path({str(target)!r})\n{body}\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode(errors="replace")[-3000:]


# --------------------------------------------------------------------------- owner records
def test_an_owner_record_names_this_process_and_is_alive():
    pid, boot, start = owner_record().split(".")
    assert int(pid) == os.getpid() and len(boot) == 8 and int(start) >= 0
    assert not owner_gone(int(pid), boot, int(start))


def test_an_owner_is_gone_once_killed_or_when_its_pid_was_reused_or_of_another_boot():
    child = subprocess.Popen(["sleep", "60"])
    start = start_ticks(child.pid)
    boot = boot_id()
    assert not owner_gone(child.pid, boot, start)
    child.kill()
    child.wait()
    assert owner_gone(child.pid, boot, start)
    assert owner_gone(1, boot, (start_ticks(1) or 0) + 1)  # pid 1 is running, but not that one
    other = "0badb007" if boot != "0badb007" else "0badb008"
    if boot != "0" * 8:
        assert owner_gone(os.getpid(), other, start_ticks(os.getpid()) or 0)


# --------------------------------------------------------------------------- leftovers of a killed writer
@pytest.mark.parametrize("kind", ["file", "npy", "folder", "set-aside"])
def test_what_a_killed_writer_left_is_removed_by_the_next_writer(tmp_path, kind):
    target = tmp_path / ("x.npy" if kind == "npy" else "out")
    body = {"file": "safety.make_temporary(target).write_bytes(b'half')",
            "npy": "safety.make_temporary(target, suffix='.npy').write_bytes(b'half')",
            "folder": "(safety.make_temporary(target, folder=True) / 'w.bin').write_bytes(b'half')",
            "set-aside": "set_aside_name(target).mkdir(); (set_aside_name(target) / 'a').touch()"}[kind]
    _die_leaving(target, body)
    assert len(_leftovers(tmp_path)) == 1
    suffix = ".npy" if kind == "npy" else ""
    fresh = safety.make_temporary(target, suffix=suffix)
    assert _leftovers(tmp_path) == [fresh.name]


def test_a_killed_atomic_write_is_cleaned_up_by_the_rerun(tmp_path):
    target = tmp_path / "r.json"
    _die_leaving(target, "cm = safety.atomic_output_file(target)\ntmp = cm.__enter__()\ntmp.write_text('half')")
    _die_leaving(tmp_path / "idx", "cm = safety.atomic_output_dir(target.with_name('idx'))\n"
                                   "(cm.__enter__() / 'vectors.npy').write_bytes(b'half')")
    assert len(_leftovers(tmp_path)) == 2
    safety.write_text_atomic(target, "{}")
    with safety.atomic_output_dir(tmp_path / "idx") as tmp:
        (tmp / "vectors.npy").write_bytes(b"whole")
    assert _leftovers(tmp_path) == [] and target.read_text(encoding="utf-8") == "{}"


def test_only_a_dead_writers_own_files_and_folders_of_that_target_are_removed(tmp_path):
    target = tmp_path / "x.npy"
    boot = boot_id()
    dead = f"1.{boot}.{(start_ticks(1) or 0) + 7}"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        live = f"{sleeper.pid}.{boot}.{start_ticks(sleeper.pid)}"
        keep = {
            f".x.tmp-{live}-abcdefgh.npy": "a live writer's",
            f".x.tmp-{dead}-abcdefgh.npy.notes": "a longer name",
            f".y.tmp-{dead}-abcdefgh.npy": "another target's",
            ".x.tmp-abcdefgh.npy": "no owner record",
            f".x.tmp-{dead}-other.npy": "another user's",
        }
        for name in keep:
            (tmp_path / name).write_bytes(b"kept")
        os.chown(tmp_path / f".x.tmp-{dead}-other.npy", NOBODY, NOBODY)
        victim = tmp_path / "victim.txt"
        victim.write_bytes(b"precious")
        os.symlink(victim, tmp_path / f".x.tmp-{dead}-linkedxx.npy")  # a link: never removed nor followed
        (tmp_path / f".x.tmp-{dead}-zzzzzzzz.npy").write_bytes(b"half")  # the one leftover
        removed = remove_stale_temporaries(target, ".npy")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert [p.name for p in removed] == [f".x.tmp-{dead}-zzzzzzzz.npy"]
    assert all((tmp_path / name).read_bytes() == b"kept" for name in keep)
    assert os.path.islink(tmp_path / f".x.tmp-{dead}-linkedxx.npy") and victim.read_bytes() == b"precious"


@pytest.mark.parametrize("length", [1, 120, 200, 251, 255])
def test_temporaries_of_long_names_fit_and_are_still_recognised(tmp_path, length):
    target = tmp_path / ("n" * (length - 4) + ".npy" if length > 4 else "n")
    suffix = target.suffix
    _die_leaving(target, f"safety.make_temporary(target, suffix={suffix!r}).write_bytes(b'half')\n"
                         "set_aside_name(target).mkdir()")
    left = _leftovers(tmp_path)
    assert len(left) == 2 and all(len(os.fsencode(n)) <= 255 and OWN_TEMPORARY.match(n) for n in left)
    assert len(remove_stale_temporaries(target, suffix)) == 2 and _leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("which", ["encode", "index"])
def test_kill_9_mid_write_then_the_rerun_succeeds_and_leaves_nothing(tmp_path, tiny_bert, corpus, which):
    from mirrorbert.cli.app import main

    data = tmp_path / "many.txt"
    data.write_text("".join(f"{corpus[i % len(corpus)]} {i}\n" for i in range(50_000)), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    target = out / ("x.npy" if which == "encode" else "index")
    argv = [which, "--model", str(tiny_bert), "--input" if which == "encode" else "--corpus", str(data),
            "--output", str(target), "--no-progress"]
    code = "import sys\nfrom mirrorbert.cli.app import main\nsys.exit(main(sys.argv[1:]))\n"
    child = subprocess.Popen([sys.executable, "-c", code, *argv], env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while not _leftovers(out):
            assert child.poll() is None and time.monotonic() < deadline, "ended before it could be killed"
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()
    assert _leftovers(out) and not target.exists()
    small = tmp_path / "small.txt"
    small.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    argv[argv.index(str(data))] = str(small)
    assert main(argv) == 0
    assert target.exists() and _leftovers(out) == []


# --------------------------------------------------------------------------- proof of ownership
def _digest(data: bytes) -> list:
    return [len(data), hashlib.sha256(data).hexdigest()]


def _marked(folder: Path, digest) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "thesis.tex").write_bytes(b"my thesis\n")
    record = {"written_by": "mirrorbert", "format": 1, "files": ["thesis.tex"]}
    if digest != "absent":
        record["digests"] = {"thesis.tex": digest}
    (folder / safety.MARKER).write_text(json.dumps(record), encoding="utf-8")
    return folder


@pytest.mark.parametrize("digest", [None, "absent", [10, None], [10, "zz"], "abc", [True, "0" * 64],
                                    _digest(b"something else\n"), [11, hashlib.sha256(b"my thesis\n").hexdigest()]])
def test_a_listed_file_without_a_matching_real_digest_is_foreign(tmp_path, digest):
    folder = _marked(tmp_path / "out", digest)
    assert foreign_file(folder) == folder / "thesis.tex"
    with pytest.raises(UserError, match=r"^--output .*thesis\.tex, which mirrorbert did not write"):
        check_replaceable(folder, True, "--output")
    assert (folder / "thesis.tex").read_bytes() == b"my thesis\n"


def test_a_listed_file_with_its_real_digest_is_ours_and_large_files_are_digested_whole(tmp_path):
    folder = _marked(tmp_path / "out", _digest(b"my thesis\n"))
    assert foreign_file(folder) is None
    big = tmp_path / "big"
    big.mkdir()
    (big / "weights.bin").write_bytes(b"\0" * (3 << 20))
    safety.mark_folder(big, files=["weights.bin"])
    recorded = safety.read_marker(big)["digests"]["weights.bin"]
    assert recorded == _digest(b"\0" * (3 << 20))
    with open(big / "weights.bin", "r+b") as fh:  # same size, one byte changed in the middle
        fh.seek(1 << 20)
        fh.write(b"\1")
    assert foreign_file(big) == big / "weights.bin"


def test_a_link_mirrorbert_made_is_proven_by_its_target_and_a_listed_file_turned_folder_is_not(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    os.symlink("/data/corpora", folder / "corpora")  # reproduce --quick links the folders it does not cut
    (folder / "a.json").write_text("{}", encoding="utf-8")
    safety.record_files(folder, "reproduce")
    assert safety.read_marker(folder)["digests"]["corpora"] == ["symlink", "/data/corpora"]
    assert foreign_file(folder) is None
    os.unlink(folder / "corpora")
    os.symlink("/home/user/thesis", folder / "corpora")  # another target: not the link mirrorbert made
    assert foreign_file(folder) == folder / "corpora"
    os.unlink(folder / "corpora")
    (folder / "a.json").unlink()
    (folder / "a.json").mkdir()
    (folder / "a.json" / "mine.txt").write_bytes(b"mine")
    assert foreign_file(folder) == folder / "a.json" / "mine.txt"


@pytest.mark.parametrize("kind", ["link", "fifo", "huge", "deep"])
def test_a_marker_that_is_not_a_small_regular_json_file_proves_nothing(tmp_path, kind):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "thesis.tex").write_bytes(b"my thesis\n")
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"files": ["thesis.tex"], "digests": {"thesis.tex": _digest(b"my thesis\n")}}))
    marker = folder / safety.MARKER
    if kind == "link":
        os.symlink(real, marker)
    elif kind == "fifo":
        os.mkfifo(marker)  # reading it would wait forever
    elif kind == "huge":
        with open(marker, "wb") as fh:
            fh.truncate(RECORD_LIMIT + 1)
    else:
        marker.write_text("[" * 100_000 + "]" * 100_000)
    assert safety.read_marker(folder) is None
    with pytest.raises(UserError, match="only replaces a folder mirrorbert wrote"):
        check_replaceable(folder, True, "--output")


def _step(root: Path, name: str = "step-3", sha_of: bytes | None = None, size: int | None = None) -> Path:
    step = root / name
    (step / "model").mkdir(parents=True)
    (step / "model" / "w.bin").write_bytes(b"weights")
    digest = hashlib.sha256(sha_of if sha_of is not None else b"weights").hexdigest()
    files = {"model/w.bin": {"size": size if size is not None else 7, "sha256": digest}}
    (step / "manifest.json").write_text(json.dumps({"format_version": 1, "files": files}), encoding="utf-8")
    return step


def test_a_checkpoint_is_ours_only_where_its_manifest_proves_every_file(tmp_path):
    step = _step(tmp_path / "a")
    assert safety.checkpoint_stray(step) is None
    (step / "thesis.tex").write_bytes(b"mine")
    assert safety.checkpoint_stray(step) == step / "thesis.tex"
    assert safety.checkpoint_stray(_step(tmp_path / "b", sha_of=b"other")) is not None
    assert safety.checkpoint_stray(_step(tmp_path / "c", size=8)) is not None
    bare = tmp_path / "d" / "step-1"
    bare.mkdir(parents=True)
    (bare / "notes.md").write_bytes(b"no manifest")
    assert safety.checkpoint_stray(bare) == bare / "notes.md"


def test_a_real_checkpoint_is_proven_by_the_manifest_mirrorbert_writes(tmp_path):
    from mirrorbert.training.checkpoints import write_manifest

    step = tmp_path / "ck" / "step-1"
    (step / "model").mkdir(parents=True)
    (step / "model" / "model.safetensors").write_bytes(os.urandom(2 << 20))
    (step / "checkpoint.json").write_text('{"step": 1}', encoding="utf-8")
    write_manifest(step)
    assert safety.checkpoint_stray(step) is None
    check_checkpoints_proven(tmp_path / "ck")


def test_overwrite_refuses_to_discard_a_checkpoint_folder_holding_unproven_files(tmp_path):
    import contextlib

    root = tmp_path / "out.checkpoints"
    step = _step(root, sha_of=b"planted")
    (root / "best-model").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(UserError, match=r"^--checkpoint-dir .*: --overwrite would discard step-3, which holds "
                                        r".*w\.bin"):
        with contextlib.ExitStack() as stack:
            safety.guard_run(stack, safety.RunPaths(tmp_path / "out", {"--model": model}, checkpoint_dir=root),
                             overwrite=True)
    assert (step / "model" / "w.bin").read_bytes() == b"weights"
    with contextlib.ExitStack() as stack:  # resuming discards nothing: nothing to prove
        safety.guard_run(stack, safety.RunPaths(tmp_path / "out", {"--model": model}, checkpoint_dir=root),
                         overwrite=True, resuming=True)


def test_a_marked_folders_best_model_must_prove_its_files_too(tmp_path):
    folder = tmp_path / "out"
    (folder / "best-model").mkdir(parents=True)
    (folder / "best-model" / "thesis.tex").write_bytes(b"mine")
    safety.mark_folder(folder)
    assert foreign_file(folder) == folder / "best-model" / "thesis.tex"


# --------------------------------------------------------------------------- links at an output's name
@pytest.mark.parametrize("writer", ["file", "folder"])
def test_a_dangling_link_at_an_output_is_refused_then_replaced_never_followed(tmp_path, writer):
    missing = tmp_path / "elsewhere" / "never"
    out = tmp_path / ("x.npy" if writer == "file" else "idx")
    os.symlink(missing, out)
    write = safety.atomic_output_file if writer == "file" else safety.atomic_output_dir
    with pytest.raises(UserError, match=r"already exists \(a symlink to .*never, which does not exist\)"):
        with write(out):
            pass
    with write(out, overwrite=True) as tmp:
        (tmp if writer == "file" else tmp / "a.txt").write_text("new", encoding="utf-8")
    assert not out.is_symlink() and out.exists() and not os.path.lexists(missing.parent)
    assert _leftovers(tmp_path) == []


def test_overwrite_onto_a_link_to_the_users_file_or_folder_replaces_the_link(tmp_path):
    victim = tmp_path / "mine" / "thesis.tex"
    victim.parent.mkdir()
    victim.write_bytes(b"my thesis\n")
    os.symlink(victim, tmp_path / "r.md")
    os.symlink(victim.parent, tmp_path / "plots")
    safety.write_text_atomic(tmp_path / "r.md", "report", overwrite=True)
    with safety.atomic_output_dir(tmp_path / "plots", overwrite=True) as tmp:
        (tmp / "a.png").write_bytes(b"png")
    assert (tmp_path / "r.md").read_text(encoding="utf-8") == "report" and not (tmp_path / "r.md").is_symlink()
    assert (tmp_path / "plots" / "a.png").exists() and not (tmp_path / "plots").is_symlink()
    assert victim.read_bytes() == b"my thesis\n" and os.listdir(victim.parent) == ["thesis.tex"]


def test_the_lock_of_a_linked_output_is_beside_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real" / "x.npy", tmp_path / "x.npy")
    assert lock_path(tmp_path / "x.npy") == tmp_path / ".x.npy.lock"


def test_a_link_to_nothing_among_an_outputs_folders_is_refused(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "dl")
    with pytest.raises(UserError, match=r"^--output .*dl/sub/x\.npy: .*dl is a symlink to .*gone, which does not"):
        safety.WritePlan({}).file("--output", tmp_path / "dl" / "sub" / "x.npy").check()
    with pytest.raises(UserError, match=r"^--log-dir .*dl is a symlink to .*gone, which does not exist"):
        safety.WritePlan({}).append_folder("--log-dir", tmp_path / "dl").check()
    assert not os.path.lexists(tmp_path / "gone")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "logs")  # a link to a folder that is there: files go there
    safety.WritePlan({}).append_folder("--log-dir", tmp_path / "logs").check()


# --------------------------------------------------------------------------- a folder swapped mid-write
@pytest.mark.parametrize("writer", ["file", "folder"])
def test_a_folder_swapped_for_a_link_mid_write_is_refused_and_nothing_lands_anywhere(tmp_path, writer):
    out, victim = tmp_path / "out", tmp_path / "mine"
    out.mkdir()
    victim.mkdir()
    (victim / "thesis.tex").write_bytes(b"my thesis\n")
    write = safety.atomic_output_file(out / "r.json") if writer == "file" else safety.atomic_output_dir(out / "idx")
    with pytest.raises(UserError, match=r"its folder .*out was replaced while mirrorbert was writing \(it is now a "
                                        r"symlink\)"):
        with write as tmp:
            (tmp if writer == "file" else tmp / "a.txt").write_text("new", encoding="utf-8")
            os.replace(out, tmp_path / "moved")
            os.symlink(victim, out)
    assert os.listdir(victim) == ["thesis.tex"] and os.listdir(tmp_path / "moved") == []


# --------------------------------------------------------------------------- places that cannot be written
@pytest.mark.skipif(not can_mount(), reason="needs root and permission to mount a tmpfs")
def test_a_mount_point_is_never_an_output(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        with pytest.raises(UserError, match=r"^--output .*disk is a mount point: it cannot be replaced atomically"):
            check_replaceable(disk, True, "--output")
        with pytest.raises(UserError, match="is a mount point"):
            with safety.atomic_output_dir(disk, overwrite=True):
                pass
        assert os.listdir(disk) == [] and _leftovers(tmp_path) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("where", ["file-in-path", "dangling-link", "proc"])
def test_a_cache_path_that_cannot_hold_a_folder_is_one_line(tmp_path, where):
    if where == "file-in-path":
        (tmp_path / "xdg").write_bytes(b"a file")
        cache, blocked = tmp_path / "xdg" / "mirrorbert" / "tokens", "is a file, where a folder must go"
    elif where == "dangling-link":
        os.symlink(tmp_path / "gone", tmp_path / "cache")
        cache, blocked = tmp_path / "cache" / "tokens", "which does not exist (mirrorbert never writes through"
    else:
        cache, blocked = Path("/proc/1/.cache/mirrorbert/tokens"), "cannot be created"
    with pytest.raises(UserError) as caught:
        with safety.write_errors(cache, "MIRRORBERT_CACHE"):
            cache.mkdir(parents=True, exist_ok=True)
    message = str(caught.value)
    assert message.startswith(f"MIRRORBERT_CACHE {cache}: cannot write it: ") and blocked in message
    assert "\n" not in message and not os.path.lexists(tmp_path / "gone")


def test_an_unrelated_error_inside_a_write_passes_through(tmp_path):
    with pytest.raises(FileNotFoundError):
        with safety.write_errors(tmp_path / "out" / "x.npy"):
            open(tmp_path / "inputs" / "missing.txt", encoding="utf-8")
    with pytest.raises(OSError) as caught:
        with safety.write_errors(tmp_path / "x.npy"):
            raise OSError(errno.EACCES, "Permission denied", "/etc/somewhere-else")
    assert not isinstance(caught.value, UserError)


def test_a_killed_token_store_build_is_cleaned_up_by_the_next_build(tmp_path, tiny_bert, corpus):
    """The training token cache's temporary carries an owner record too: after a writer killed mid-build, the
    next build of the same store removes what it left and nothing else."""
    from transformers import AutoTokenizer

    from mirrorbert.data.strings import load_training_strings
    from mirrorbert.data.token_store import open_token_store, store_key

    data = tmp_path / "strings.txt"
    data.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    strings = load_training_strings(data=str(data))
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    cache = tmp_path / "tokens"
    cache.mkdir()
    root = cache / store_key(strings.fingerprint, tokenizer, 16)
    _die_leaving(root, "(safety.make_temporary(target, folder=True) / 'ids.bin').write_bytes(b'half')")
    other = cache / ".someone-elses.tmp-file"
    other.write_bytes(b"not ours")
    assert len(_leftovers(cache)) == 2
    store = open_token_store([list(strings.strings)], strings.fingerprint, tokenizer, 16, cache_dir=cache)
    assert len(store) == len(corpus)
    assert _leftovers(cache) == [other.name]
