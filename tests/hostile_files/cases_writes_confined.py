"""Hostile files for the write side of issue 34: no write or deletion on a file's word, nothing left behind.

* Every output option (`encode --output` and its `.rows.json`, `eval --output/--report`, `index`, `export`,
  `train`, `push --dry-run`) against a dangling link at its name (never followed, its target never created)
  and a link to the user's file or folder under `--overwrite` (the link is replaced, never its target).
* Every folder output against a planted `.mirrorbert-output` marker listing the user's `thesis.tex` with a
  null, wrong or malformed digest, and against a planted `step-N/manifest.json` (proof is a real digest of
  the file as it is, nothing less); a checkpoint folder's planted `step-N` and `best-model` under
  `--overwrite`.
* What a killed run leaves (`kill -9` runs no cleanup): temporaries and set-aside copies beside each output,
  made by a process that really died by SIGKILL (and a real `kill -9` of `encode` and `index` mid-write),
  removed by the next run; a live writer's temporary, another user's, a link, and a name without an owner
  record are never removed.
* A folder swapped for a link while a write runs, a mount point as the output, and the cache: a dangling
  link, a file as `XDG_CACHE_HOME`, `HOME=/proc/1`, a full cache filesystem.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hostile_files.cases_writes import (_out_dir, as_refusal, can_mount, command, mount_disk, precious_folder,
                                        run_main)
from hostile_files.harness import WORKS, Context, FileCase, Result

WHAT_LINK = "link at an output's name"
WHAT_MARKER = "planted proof of ownership"
WHAT_LEFT = "leftover of a killed run"
WHAT_SWAP = "folder swapped during a write"
WHAT_MOUNT = "mount point as an output"
WHAT_CACHE = "hostile cache location"
NOBODY = 65534
THESIS = b"chapter 1: the user's own words\n"

# name -> (command, output option, the output's name under out/, what it is, extra arguments)
OUTPUTS = {
    "encode": ("encode", "--output", "x.npy", "file", []),
    "encode-rows": ("encode", "--output", "x.rows.json", "file", ["--skip-bad-lines"]),
    "eval-output": ("eval-output", "--output", "r.json", "file", []),
    "eval-report": ("eval-report", "--report", "r.md", "file", []),
    "index": ("index", "--output", "index", "folder", []),
    "export": ("export", "--output", "export", "folder", []),
    "train": ("train", "--output", "train", "folder", []),
    "push": ("push", "--output", "push", "folder", []),
}
FOLDERS = [name for name, spec in OUTPUTS.items() if spec[3] == "folder"]


def _argv(ctx: Context, name: str, overwrite: bool = False) -> list[str]:
    which, _, out, _, extra = OUTPUTS[name]
    primary = {"encode-rows": "x.npy"}.get(name, out)
    return command(ctx, which, ctx.folder / "out" / primary) + extra + (["--overwrite"] if overwrite else [])


def _target(ctx: Context, name: str) -> Path:
    return ctx.folder / "out" / OUTPUTS[name][2]


def _leftovers(folder: Path) -> list[str]:
    """Names of mirrorbert temporaries or set-aside copies (with an owner record or not) in `folder`."""
    if not folder.is_dir():
        return []
    return sorted(n for n in os.listdir(folder) if n.startswith(".") and (".tmp-" in n or ".old-" in n))


# ----------------------------------------------------------------------------- links at an output's name
def _dangling(name: str):
    def setup(ctx: Context) -> None:
        missing = ctx.victim(ctx.folder / "elsewhere" / "never-created", None)
        _out_dir(ctx)
        os.symlink(missing, _target(ctx, name))
    return setup


def _link_to_victim(name: str):
    def setup(ctx: Context) -> None:
        if OUTPUTS[name][3] == "folder":
            victim = precious_folder(ctx)
        else:
            victim = ctx.victim(ctx.folder / "mine" / OUTPUTS[name][2], THESIS)
        _out_dir(ctx)
        os.symlink(victim, _target(ctx, name))
    return setup


def _replaced_link(name: str):
    """The output is now a real file or folder where the link was (the link's target is a victim)."""
    def check(ctx: Context, result: Result) -> str | None:
        target = _target(ctx, name)
        if target.is_symlink():
            return f"{target.name} is still a link: written through it"
        if not target.exists():
            return f"{target.name} was not written"
        kind = OUTPUTS[name][3]
        if (kind == "folder") != target.is_dir():
            return f"{target.name} is not a {kind}"
        return None
    return check


def _link_cases() -> list[FileCase]:
    cases = []
    for name, (_, option, out, kind, _) in OUTPUTS.items():
        names = (option, out)
        cases += [
            FileCase(f"w2-dangling-link:{name}", WHAT_LINK, _dangling(name), lambda ctx, n=name: _argv(ctx, n),
                     names=names),
            FileCase(f"w2-dangling-link-overwrite:{name}", WHAT_LINK, _dangling(name),
                     lambda ctx, n=name: _argv(ctx, n, overwrite=True), expect=WORKS, check=_replaced_link(name),
                     timeout=180),
            FileCase(f"w2-link-to-victim-overwrite:{name}", WHAT_LINK, _link_to_victim(name),
                     lambda ctx, n=name: _argv(ctx, n, overwrite=True), expect=WORKS, check=_replaced_link(name),
                     timeout=180),
        ]
    return cases


# ----------------------------------------------------------------------------- planted proof of ownership
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# what the planted marker records for thesis.tex
DIGESTS = {
    "null-digest": None,
    "no-digest": "absent",
    "wrong-digest": [len(THESIS), _sha(b"something else\n")],
    "size-only-digest": [len(THESIS), None],
    "malformed-digest": [len(THESIS), "not-a-sha256"],
}


def _planted_marker(name: str, digest) -> callable:
    def setup(ctx: Context) -> None:
        folder = _target(ctx, name)
        ctx.victim(folder / "thesis.tex", THESIS)
        record = {"written_by": "mirrorbert", "format": 1, "kind": "output", "files": ["thesis.tex"]}
        if digest != "absent":
            record["digests"] = {"thesis.tex": digest}
        (folder / ".mirrorbert-output").write_text(json.dumps(record), encoding="utf-8")
    return setup


def _planted_step(name: str, digest_of: bytes | None = None) -> callable:
    """A marked folder (the marker lists nothing: a checkpoint root's) holding `step-3/` with a manifest
    that lists the user's files (with the digest of other content, or none)."""
    def setup(ctx: Context) -> None:
        folder = _target(ctx, name)
        step = folder / "step-3"
        ctx.victim(step / "thesis.tex", THESIS)
        files = {"thesis.tex": {"size": len(THESIS), "sha256": _sha(digest_of) if digest_of else None}}
        (step / "manifest.json").write_text(json.dumps({"format_version": 1, "files": files}), encoding="utf-8")
        (folder / ".mirrorbert-output").write_text(json.dumps(
            {"written_by": "mirrorbert", "format": 1, "kind": "output", "files": [], "digests": {}}), encoding="utf-8")
    return setup


def _marker_cases() -> list[FileCase]:
    cases = []
    for name in FOLDERS:
        option = OUTPUTS[name][1]
        for label, digest in DIGESTS.items():
            cases.append(FileCase(f"w2-planted-marker-{label}:{name}", WHAT_MARKER, _planted_marker(name, digest),
                                  lambda ctx, n=name: _argv(ctx, n, overwrite=True), names=("thesis.tex", option)))
        cases.append(FileCase(f"w2-planted-step-manifest:{name}", WHAT_MARKER, _planted_step(name),
                              lambda ctx, n=name: _argv(ctx, n, overwrite=True), names=("thesis.tex",)))
        cases.append(FileCase(f"w2-planted-step-manifest-wrong-digest:{name}", WHAT_MARKER,
                              _planted_step(name, b"other\n"), lambda ctx, n=name: _argv(ctx, n, overwrite=True),
                              names=("thesis.tex",)))
    return cases


def _checkpoint_root_cases() -> list[FileCase]:
    """`--overwrite` discards a checkpoint folder's checkpoints: only ones whose manifest proves every file."""
    def planted(which: str, root_name: str, entry: str, digest_of: bytes | None):
        def setup(ctx: Context) -> None:
            root = _out_dir(ctx) / root_name
            ctx.victim(root / entry / "thesis.tex", THESIS)
            ctx.victim(root / entry / "model" / "notes.md", b"mine\n")
            files = {"thesis.tex": {"size": len(THESIS), "sha256": _sha(digest_of) if digest_of else None}}
            (root / entry / "manifest.json").write_text(json.dumps({"files": files}), encoding="utf-8")
        return setup

    def real_then_overwrite(ctx: Context) -> None:
        rc, err = run_main(command(ctx, "train") + ["--save-every", "1"])
        assert rc == 0, err

    def replaced(ctx: Context, result: Result) -> str | None:
        step = ctx.folder / "out" / "train.checkpoints" / "step-1"
        return None if (step / "manifest.json").is_file() else "the run's own checkpoint was not rewritten"

    ow = ["--overwrite", "--save-every", "1"]
    return [
        FileCase("w2-checkpoint-root-planted-step:train", WHAT_MARKER,
                 planted("train", "train.checkpoints", "step-3", None),
                 lambda ctx: command(ctx, "train") + ow, names=("thesis.tex", "notes.md")),
        FileCase("w2-checkpoint-root-planted-step-wrong-digest:train", WHAT_MARKER,
                 planted("train", "train.checkpoints", "step-3", b"x"),
                 lambda ctx: command(ctx, "train") + ow, names=("thesis.tex", "notes.md")),
        FileCase("w2-checkpoint-root-planted-step:pretrain-mlm", WHAT_MARKER,
                 planted("pretrain-mlm", "mlm.checkpoints", "step-3", None),
                 lambda ctx: command(ctx, "pretrain-mlm") + ow, names=("thesis.tex", "notes.md")),
        FileCase("w2-checkpoint-root-planted-best-model:gloss-pretrain", WHAT_MARKER,
                 planted("gloss-pretrain", "gr.checkpoints", "best-model", None),
                 lambda ctx: command(ctx, "gloss-pretrain") + ["--overwrite"], names=("thesis.tex", "notes.md")),
        FileCase("w2-checkpoint-root-own-steps-replaced:train", WHAT_MARKER, real_then_overwrite,
                 lambda ctx: command(ctx, "train") + ow, expect=WORKS, check=replaced),
    ]


# ----------------------------------------------------------------------------- leftovers of a killed run
_LEAVE = """
import os, signal, sys
from pathlib import Path
from mirrorbert.safeguards.writes.temporaries import make_temporary, set_aside_name
target, kind = Path(sys.argv[1]), sys.argv[2]
target.parent.mkdir(parents=True, exist_ok=True)
if kind == "folder":
    (make_temporary(target, folder=True) / "model.safetensors").write_bytes(b"half a model")
elif kind == "old":
    os.mkdir(set_aside_name(target))
    (set_aside_name(target) / "vectors.npy").write_bytes(b"the previous output")
else:
    make_temporary(target, suffix=kind).write_bytes(b"half a file")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def killed_writer(target: Path, kind: str) -> None:
    """What a writer of `target` leaves when `kill -9` ends it: a temporary (`kind`: "folder", a file
    suffix such as ".npy" or "" for none, or "old" for a set-aside copy), made by a process that really died."""
    done = subprocess.run([sys.executable, "-c", _LEAVE, str(target), kind], env=_child_env(), capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode(errors="replace")[-2000:]
    assert _leftovers(target.parent), "the killed writer left nothing"


def _left_by_kill(name: str, kind: str):
    def setup(ctx: Context) -> None:
        _out_dir(ctx)
        killed_writer(_target(ctx, name), kind)
    return setup


def _cleaned(name: str):
    """The output was written and the killed run's leftovers beside it are gone."""
    def check(ctx: Context, result: Result) -> str | None:
        target = _target(ctx, name)
        if not target.exists():
            return f"{target.name} was not written"
        left = _leftovers(target.parent)
        return f"left behind by the killed run, still there: {left}" if left else None
    return check


def _owner(pid: int, start: int, boot: str | None = None) -> str:
    from mirrorbert.safeguards.writes.temporaries import boot_id

    return f"{pid}.{boot or boot_id()}.{start}"


def _dead_owner() -> str:
    """pid 1 with another start time: a process of that number, but not the one that wrote."""
    from mirrorbert.safeguards.writes.temporaries import start_ticks

    return _owner(1, (start_ticks(1) or 0) + 12345)


def _kept_cases() -> list[FileCase]:
    """Beside `encode --output x.npy`, what only looks like a killed run's temporary is never removed (each is
    a registered victim: the harness checks it stays as it was)."""
    def live_writer(ctx: Context) -> None:
        from mirrorbert.safeguards.writes.temporaries import start_ticks

        sleeper = subprocess.Popen(["sleep", "300"])
        (ctx.folder / "sleeper.pid").write_text(str(sleeper.pid), encoding="utf-8")
        name = f".x.tmp-{_owner(sleeper.pid, start_ticks(sleeper.pid))}-abcdefgh.npy"
        ctx.victim(_out_dir(ctx) / name, b"being written by a live run\n")

    def encode_then_stop_sleeper(ctx: Context) -> int:
        try:
            rc, err = run_main(command(ctx, "encode"))
        finally:
            pid = int((ctx.folder / "sleeper.pid").read_text(encoding="utf-8"))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        return as_refusal(rc, err)

    def other_user(ctx: Context) -> None:
        path = ctx.victim(_out_dir(ctx) / f".x.tmp-{_dead_owner()}-abcdefgh.npy", b"someone else's\n")
        os.chown(path, NOBODY, NOBODY)

    def link(ctx: Context) -> None:
        victim = ctx.victim(ctx.folder / "victim.txt", THESIS)
        path = _out_dir(ctx) / f".x.tmp-{_dead_owner()}-abcdefgh.npy"
        os.symlink(victim, path)
        ctx.victim(path, None)

    def no_owner(ctx: Context) -> None:
        ctx.victim(_out_dir(ctx) / ".x.tmp-abcdefgh.npy", b"an older mirrorbert's, or the user's\n")

    def other_target(ctx: Context) -> None:
        ctx.victim(_out_dir(ctx) / f".y.tmp-{_dead_owner()}-abcdefgh.npy", b"another output's\n")

    def user_file(ctx: Context) -> None:
        ctx.victim(_out_dir(ctx) / f".x.tmp-{_dead_owner()}-abcdefgh.npy.notes", b"the user's notes\n")

    def other_boot(ctx: Context) -> None:  # removed: its writer died with the previous boot
        (_out_dir(ctx) / f".x.tmp-{_owner(os.getpid(), 1, boot='0badb007')}-abcdefgh.npy").write_bytes(b"half")

    def written(ctx: Context, result: Result) -> str | None:
        if result.value not in (None, 0):
            return f"exit status {result.value}"
        return None if (ctx.folder / "out" / "x.npy").is_file() else "x.npy was not written"

    encode = lambda ctx: command(ctx, "encode")  # noqa: E731
    return [
        FileCase("w2-kept-live-writers-temporary:encode", WHAT_LEFT, live_writer, encode_then_stop_sleeper,
                 expect=WORKS, check=written),
        FileCase("w2-kept-other-users-temporary:encode", WHAT_LEFT, other_user, encode, expect=WORKS, check=written),
        FileCase("w2-kept-link-named-as-temporary:encode", WHAT_LEFT, link, encode, expect=WORKS, check=written),
        FileCase("w2-kept-temporary-without-owner:encode", WHAT_LEFT, no_owner, encode, expect=WORKS, check=written),
        FileCase("w2-kept-other-outputs-temporary:encode", WHAT_LEFT, other_target, encode, expect=WORKS,
                 check=written),
        FileCase("w2-kept-longer-name-than-a-temporary:encode", WHAT_LEFT, user_file, encode, expect=WORKS,
                 check=written),
        FileCase("w2-removed-previous-boots-temporary:encode", WHAT_LEFT, other_boot, encode, expect=WORKS,
                 check=_cleaned("encode")),
    ]


def _leftover_cases() -> list[FileCase]:
    kinds = {"encode": [".npy", "old"], "encode-rows": [".json"], "eval-report": [".md"], "index": ["folder", "old"],
             "export": ["folder"], "train": ["folder", "old"], "push": ["folder"]}
    cases = []
    for name, leftovers in kinds.items():
        for kind in leftovers:
            label = "set-aside-copy" if kind == "old" else "temporary"
            cases.append(FileCase(f"w2-killed-run-{label}-removed:{name}", WHAT_LEFT, _left_by_kill(name, kind),
                                  lambda ctx, n=name: _argv(ctx, n), expect=WORKS, check=_cleaned(name),
                                  timeout=180))
    cases.append(FileCase("w2-killed-run-temporary-removed:pretrain-mlm", WHAT_LEFT,
                          lambda ctx: killed_writer(_out_dir(ctx) / "mlm", "folder"),
                          lambda ctx: command(ctx, "pretrain-mlm"), expect=WORKS,
                          check=lambda ctx, r: _cleaned_at(ctx, "mlm")))
    return cases


def _cleaned_at(ctx: Context, rel: str) -> str | None:
    target = ctx.folder / "out" / rel
    if not target.exists():
        return f"{rel} was not written"
    left = _leftovers(target.parent)
    return f"left behind by the killed run, still there: {left}" if left else None


# ----------------------------------------------------------------------------- a real kill -9 mid-write
_MAIN = "import sys\nfrom mirrorbert.cli.app import main\nsys.exit(main(sys.argv[1:]))\n"


def _many_strings(ctx: Context, lines: int = 50_000) -> Path:
    path = ctx.folder / "many.txt"
    from tiny_models import CORPUS

    with open(path, "w", encoding="utf-8") as fh:
        for i in range(lines):
            fh.write(f"{CORPUS[i % len(CORPUS)]} {i}\n")
    return path


def kill_mid_write(argv_of, watch: str):
    """Run the command in a child process and `kill -9` it once its temporary is there (`watch`: the folder,
    relative to ctx.folder, the temporary appears in)."""
    def setup(ctx: Context) -> None:
        argv = argv_of(ctx)
        folder = ctx.folder / watch
        folder.mkdir(parents=True, exist_ok=True)
        child = subprocess.Popen([sys.executable, "-c", _MAIN, *argv], env=_child_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 150
        try:
            while not _leftovers(folder):
                if child.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the command ended (rc {child.returncode}) before it could be killed")
                time.sleep(0.02)
        finally:
            child.kill()
            child.wait()
        assert _leftovers(folder), "kill -9 left nothing behind"
    return setup


def _big(ctx: Context, which: str) -> list[str]:
    argv = command(ctx, which)
    option = "--input" if which == "encode" else "--corpus"
    argv[argv.index(option) + 1] = str(_many_strings(ctx))
    return argv


def _kill_cases() -> list[FileCase]:
    return [
        FileCase("w2-kill-9-mid-write-rerun:encode", WHAT_LEFT, kill_mid_write(lambda ctx: _big(ctx, "encode"), "out"),
                 lambda ctx: command(ctx, "encode"), expect=WORKS, check=_cleaned("encode"), timeout=300),
        FileCase("w2-kill-9-mid-write-rerun:index", WHAT_LEFT, kill_mid_write(lambda ctx: _big(ctx, "index"), "out"),
                 lambda ctx: command(ctx, "index"), expect=WORKS, check=_cleaned("index"), timeout=300),
    ]


# ----------------------------------------------------------------------------- a folder swapped mid-write
def swapped_during(argv_of):
    """Run the command; when it first encodes, its output folder `out/` is moved away and a link to
    the user's folder put in its place."""
    def action(ctx: Context):
        from mirrorbert.encoder.model import Encoder

        original, swapped = Encoder.encode, []

        def encode(self, *args, **kwargs):
            if not swapped:
                swapped.append(True)
                os.replace(ctx.folder / "out", ctx.folder / "out-moved")
                os.symlink(precious_folder(ctx, "precious"), ctx.folder / "out")
            return original(self, *args, **kwargs)

        Encoder.encode = encode
        try:
            rc, err = run_main(argv_of(ctx))
        finally:
            Encoder.encode = original
        left = _leftovers(ctx.folder / "out-moved")
        if left:
            raise AssertionError(f"temporaries left in the folder it was writing in: {left}")
        return as_refusal(rc, err)
    return action


def _api_swap(folder_output: bool):
    def action(ctx: Context):
        from mirrorbert.safeguards.writes import atomic_output_dir, atomic_output_file

        out = _out_dir(ctx)
        writer = atomic_output_dir(out / "idx") if folder_output else atomic_output_file(out / "r.json")
        with writer as tmp:
            (tmp / "a.txt" if folder_output else tmp).write_text("new", encoding="utf-8")
            os.replace(out, ctx.folder / "out-moved")
            os.symlink(precious_folder(ctx, "precious"), out)
        return "written"
    return action


def _swap_cases() -> list[FileCase]:
    def out(ctx: Context) -> None:
        _out_dir(ctx)

    return [
        FileCase("w2-folder-swapped-for-link:encode", WHAT_SWAP, out,
                 swapped_during(lambda ctx: command(ctx, "encode")), names=("--output", "replaced"),
                 ignore_leftovers=("out-moved",)),
        FileCase("w2-folder-swapped-for-link:index", WHAT_SWAP, out,
                 swapped_during(lambda ctx: command(ctx, "index")), names=("--output", "replaced"),
                 ignore_leftovers=("out-moved",)),
        FileCase("w2-folder-swapped-for-link:api-file", WHAT_SWAP, out, _api_swap(False),
                 names=("r.json",), ignore_leftovers=("out-moved",)),
        FileCase("w2-folder-swapped-for-link:api-folder", WHAT_SWAP, out, _api_swap(True),
                 names=("idx",), ignore_leftovers=("out-moved",)),
    ]


# ----------------------------------------------------------------------------- mount points, caches
def _mount_cases() -> list[FileCase]:
    if not can_mount():
        return []

    def mounted(name: str):
        def setup(ctx: Context) -> None:
            target = _target(ctx, name)
            target.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(target)], check=True)
        return setup

    def unmounting(name: str):
        def action(ctx: Context):
            try:
                rc, err = run_main(_argv(ctx, name, overwrite=True))
            finally:
                subprocess.run(["umount", str(_target(ctx, name))], capture_output=True)
            return as_refusal(rc, err)
        return action

    return [FileCase(f"w2-mount-point-overwrite:{name}", WHAT_MOUNT, mounted(name), unmounting(name),
                     names=("mount point",)) for name in ("index", "export", "train")]


def with_env(argv_of, **values):
    """Run the command with environment variables set (a callable value gets ctx; None unsets)."""
    def action(ctx: Context):
        saved = {k: os.environ.get(k) for k in values}
        try:
            for key, value in values.items():
                value = value(ctx) if callable(value) else value
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = str(value)
            rc, err = run_main(argv_of(ctx))
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return as_refusal(rc, err)
    return action


def _fresh_data(ctx: Context) -> Path:
    """Strings no earlier case tokenised (so the token cache is written, not read)."""
    path = ctx.folder / "fresh.txt"
    path.write_text("".join(f"fresh string {i} of {ctx.folder.name}\n" for i in range(12)), encoding="utf-8")
    return path


def _train_fresh(ctx: Context) -> list[str]:
    argv = command(ctx, "train")
    argv[argv.index("--data") + 1] = str(_fresh_data(ctx))
    return argv


def _cache_cases() -> list[FileCase]:
    def dangling(ctx: Context) -> None:
        os.symlink(ctx.victim(ctx.folder / "gone" / "cache", None), ctx.folder / "cache-link")

    def a_file(ctx: Context) -> None:
        ctx.victim(ctx.folder / "xdg", b"not a folder\n")

    link = lambda ctx: ctx.folder / "cache-link"  # noqa: E731
    cases = [
        FileCase("w2-cache-dangling-link:train", WHAT_CACHE, dangling,
                 with_env(_train_fresh, MIRRORBERT_CACHE=link), names=("cache-link", "MIRRORBERT_CACHE")),
        FileCase("w2-cache-xdg-is-a-file:train", WHAT_CACHE, a_file,
                 with_env(_train_fresh, MIRRORBERT_CACHE=None, XDG_CACHE_HOME=lambda ctx: ctx.folder / "xdg"),
                 names=("xdg", "MIRRORBERT_CACHE")),
        FileCase("w2-cache-home-is-proc:train", WHAT_CACHE, None,
                 with_env(_train_fresh, MIRRORBERT_CACHE=None, XDG_CACHE_HOME=None, HOME="/proc/1"),
                 names=("/proc/1", "MIRRORBERT_CACHE")),
        FileCase("w2-cache-dir-dangling-link:pretrain-mlm", WHAT_CACHE, dangling,
                 lambda ctx: command(ctx, "pretrain-mlm")[:-2] + ["--cache-dir", str(link(ctx))],
                 names=("--cache-dir",)),
        FileCase("w2-cache-dir-is-a-file:pretrain-mlm", WHAT_CACHE, a_file,
                 lambda ctx: command(ctx, "pretrain-mlm")[:-2] + ["--cache-dir", str(ctx.folder / "xdg")],
                 names=("--cache-dir",)),
        FileCase("w2-cache-xdg-is-a-file:pretrain-mlm", WHAT_CACHE, a_file,
                 with_env(lambda ctx: command(ctx, "pretrain-mlm")[:-2], MIRRORBERT_CACHE=None,
                          XDG_CACHE_HOME=lambda ctx: ctx.folder / "xdg"), names=("xdg", "--cache-dir")),
    ]
    if can_mount():
        def full(ctx: Context) -> None:
            mount_disk(ctx, before=lambda disk: (disk / "cache" / "tokens").mkdir(parents=True))

        cases.append(FileCase("w2-cache-full-filesystem:train", WHAT_CACHE, full, _on_full_cache(),
                              names=("MIRRORBERT_CACHE",)))
    return cases


def _on_full_cache():
    """train with MIRRORBERT_CACHE on the full tmpfs at ctx.folder/disk (nothing left there, one line)."""
    def argv(ctx: Context) -> list[str]:
        return _train_fresh(ctx)

    inner = with_env(argv, MIRRORBERT_CACHE=lambda ctx: ctx.folder / "disk" / "cache")

    def action(ctx: Context):
        disk = ctx.folder / "disk"
        before = sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))
        try:
            return inner(ctx)
        finally:
            after = sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))
            subprocess.run(["umount", str(disk)], capture_output=True)
            if after != before:
                raise AssertionError(f"left on the full cache filesystem: {sorted(set(after) - set(before))}")
    return action


def cases(env: dict[str, Path]) -> list[FileCase]:
    return [*_link_cases(), *_marker_cases(), *_checkpoint_root_cases(), *_leftover_cases(), *_kept_cases(),
            *_kill_cases(), *_swap_cases(), *_mount_cases(), *_cache_cases()]
