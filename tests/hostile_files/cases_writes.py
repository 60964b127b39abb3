"""Hostile files for the write policy (issue 26): no write follows a link or replaces what is not ours, and a
failure loses nothing.

Planted lock paths (a symlink to a victim, to a special file, dangling, across users in a shared sticky
folder; a regular file, a FIFO, a folder, a device), `--overwrite` onto devices, FIFOs and sockets (and links
to them), symlinked `step-N` checkpoints under `--overwrite` and rotation, outgoing files (push and its dry
run) holding links to a token, names of 250 to 256 bytes, a file in the path, a read-only or full filesystem
(a small tmpfs: only where this process may mount one), signals during `encode`/`index`, and the Python API
(`Encoder.encode(device="meta")`, `Encoder.to`, `SearchIndex.save`, `Encoder.save`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from hostile_files.harness import REFUSED, WORKS, Context, FileCase, Result

WHAT_LOCK = "planted lock path"
WHAT_SPECIAL = "special file as an output"
WHAT_STEP = "symlinked checkpoint"
WHAT_OUTGOING = "link in an outgoing folder"
WHAT_NAME = "name near the filesystem's limit"
WHAT_DISK = "full or read-only filesystem"
WHAT_SIGNAL = "signal during a write"
WHAT_API = "API call that fails"
WHAT_OWN = "planted temporary or marker"

TRIPLETS = ("bank\tthe bank raised interest rates again\ta financial institution that accepts deposits\n"
            "bank\tshe sat on the river bank\tsloping land beside a body of water\n"
            "cat\tthe cat sat on the mat\ta small domesticated carnivorous mammal\n"
            "dog\ta dog ran in the park\ta domesticated carnivore kept as a pet\n")
NOBODY = 65534  # another user's uid and gid (the shared-folder cases)


# ----------------------------------------------------------------------------- command lines
def _shared(ctx: Context) -> str:
    return str(ctx.env.get("shared", "/nonexistent-data-dir"))


def _out(ctx: Context, name: str) -> Path:
    return ctx.folder / "out" / name


def command(ctx: Context, which: str, output: Path | None = None) -> list[str]:
    """A valid command line of `which` writing `output` (default: a fresh name under ctx.folder/out)."""
    tiny, data = str(ctx.env["tiny"]), str(ctx.env["data"])
    out = str(output) if output is not None else None
    if which == "train":
        return ["train", "--model", tiny, "--data", data, "--output", out or str(_out(ctx, "train")), "--steps", "1",
                "--batch-size", "4", "--no-progress"]
    if which == "encode":
        return ["encode", "--model", tiny, "--input", data, "--output", out or str(_out(ctx, "x.npy")), "--no-progress"]
    if which == "index":
        return ["index", "--model", tiny, "--corpus", data, "--output", out or str(_out(ctx, "index")), "--no-progress"]
    if which == "export":
        return ["export", "--model", tiny, "--output", out or str(_out(ctx, "export"))]
    if which == "push":
        return ["push", "--model", str(saved_model(ctx)), "--repo", "user/name", "--dry-run", "--output", out or str(_out(ctx, "push"))]
    if which == "eval-output":
        return ["eval", "--model", tiny, "--tasks", "sts", "--data-dir", _shared(ctx), "--no-progress", "--output",
                out or str(_out(ctx, "r.json"))]
    if which == "eval-report":
        return ["eval", "--model", tiny, "--tasks", "sts", "--data-dir", _shared(ctx), "--no-progress", "--report",
                out or str(_out(ctx, "r.md"))]
    if which == "pretrain-mlm":
        return ["pretrain-mlm", "--corpus", data, "--output", out or str(_out(ctx, "mlm")), "--model", tiny,
                "--max-tokens", "2000", "--seq-length", "32", "--no-progress", "--cache-dir", str(ctx.folder / "cache")]
    if which == "gloss-pretrain":
        triplets = ctx.folder / "triplets.tsv"
        if not triplets.exists():
            triplets.write_text(TRIPLETS, encoding="utf-8")
        return ["gloss-pretrain", "--model", tiny, "--triplets", str(triplets), "--output",
                out or str(_out(ctx, "gr")), "--steps", "1", "--no-progress"]
    if which == "lexsub":
        return ["lexsub", "--model", tiny, "--data-dir", _shared(ctx), "--limit", "2", "--no-progress", "--output",
                out or str(_out(ctx, "lexsub"))]
    if which == "finetune-sts":
        return ["finetune-sts", "--model", tiny, "--data-dir", _shared(ctx), "--fractions", "0.01", "--seeds", "0",
                "--epochs", "1", "--no-progress", "--output", out or str(_out(ctx, "sts.json"))]
    if which == "reproduce":
        return ["reproduce", "--model", tiny, "--output", out or str(_out(ctx, "rep")), "--data-dir", _shared(ctx),
                "--experiments", "sts", "--quick"]
    raise KeyError(which)


def saved_model(ctx: Context) -> Path:
    """The tiny model saved by mirrorbert (what `push` reads), made once per case."""
    folder = ctx.folder / "saved"
    if not folder.exists():
        from mirrorbert.encoder.model import Encoder

        Encoder.load(ctx.env["tiny"], device="cpu").save(folder)
    return folder


# The output each command writes (under ctx.folder/out) and the lock beside it.
OUTPUTS = {"train": "train", "encode": "x.npy", "index": "index", "export": "export", "push": "push",
           "eval-output": "r.json", "eval-report": "r.md", "pretrain-mlm": "mlm", "gloss-pretrain": "gr",
           "lexsub": "lexsub", "finetune-sts": "sts.json", "reproduce": "rep"}


def lock_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _out_dir(ctx: Context) -> Path:
    folder = ctx.folder / "out"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ----------------------------------------------------------------------------- running a command inside an action
def run_main(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process; (exit status, what it printed on stderr, which is also passed on)."""
    from mirrorbert.cli.app import main

    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stderr.write(buf.getvalue())
    return rc, buf.getvalue()


def as_refusal(rc: int, err: str):
    """A command's one-line refusal as the harness counts a Python call's: raise UserError with the line."""
    from mirrorbert.errors import UserError

    errors = [line for line in err.splitlines() if line.startswith("mirrorbert") and ": error: " in line]
    if rc == 2 and len(errors) == 1 and "Traceback" not in err:
        raise UserError(errors[0].split(": error: ", 1)[1])
    return rc


# ----------------------------------------------------------------------------- special files
def mkfifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def mkchar(path: Path) -> Path:
    """A character device with /dev/null's numbers (as root), else a FIFO: either is not a regular file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        os.mkfifo(path)
    return path


def mksocket(path: Path) -> Path:
    """A Unix socket file (bound through a relative name: socket paths are limited to about 108 bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(previous)
    return path


def precious_folder(ctx: Context, name: str = "precious") -> Path:
    """A folder of the user's with two registered files (a symlinked step-N's target)."""
    folder = ctx.folder / name
    ctx.victim(folder / "thesis.tex", b"years of work\n")
    ctx.victim(folder / "data" / "numbers.csv", b"1,2,3\n")
    ctx.victim(folder, None)  # its list of entries
    return folder


# ----------------------------------------------------------------------------- checks
def exists(*names: str):
    def check(ctx: Context, result: Result) -> str | None:
        missing = [n for n in names if not (ctx.folder / n).exists()]
        return f"not written: {missing}" if missing else None
    return check


def link_gone(name: str, *written: str):
    def check(ctx: Context, result: Result) -> str | None:
        if os.path.lexists(ctx.folder / name):
            return f"{name} is still there"
        return exists(*written)(ctx, result)
    return check


# ----------------------------------------------------------------------------- the tmpfs cases
@functools.lru_cache(maxsize=None)
def can_mount() -> bool:
    """Root on Linux with a working `mount -t tmpfs` (a container may forbid it: those cases are left out)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    probe = tempfile.mkdtemp(prefix="mirrorbert-mount-probe-")
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], capture_output=True)
        if done.returncode != 0:
            return False
        subprocess.run(["umount", probe], capture_output=True)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def mount_disk(ctx: Context, size_kb: int = 256, free: int = 0, read_only: bool = False,
               before=None) -> Path:
    """A small tmpfs at ctx.folder/disk, filled until `free` bytes are left (`before(disk)` runs first)."""
    disk = ctx.folder / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0755", "tmpfs", str(disk)], check=True)
    if before is not None:
        before(disk)
    if read_only:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        return disk
    with open(disk / "filler", "wb") as fh:
        block = b"\0" * 4096
        while True:
            st = os.statvfs(disk)
            left = st.f_bavail * st.f_frsize
            if left <= free:
                break
            try:
                fh.write(block[: max(1, min(4096, left - free))])
                fh.flush()
            except OSError:
                break
    return disk


def _tree(folder: Path) -> dict[str, tuple]:
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):  # a folder by its entries (listed on their own), not its times
                found[str(path.relative_to(folder))] = (stat.S_IFDIR,)
                continue
            found[str(path.relative_to(folder))] = (stat.S_IFMT(st.st_mode), st.st_size,
                                                    path.read_bytes() if stat.S_ISREG(st.st_mode) and
                                                    st.st_size < 1 << 16 else st.st_mtime_ns)
    return found


def on_disk(argv):
    """The action of a tmpfs case: run the command, compare the tmpfs before and after (nothing left there,
    nothing changed), unmount it, and report the refusal as one line."""
    def action(ctx: Context):
        disk = ctx.folder / "disk"
        before = _tree(disk)
        try:
            rc, err = run_main(argv(ctx))
            after = _tree(disk)
        finally:
            subprocess.run(["umount", str(disk)], capture_output=True)
        if after != before:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            raise AssertionError(f"clobbered on the full filesystem: {changed}")
        return as_refusal(rc, err)
    return action


def api_on_disk(call):
    def action(ctx: Context):
        disk = ctx.folder / "disk"
        before = _tree(disk)
        try:
            value = call(ctx)
            after = _tree(disk)
        finally:
            subprocess.run(["umount", str(disk)], capture_output=True)
        if after != before:
            raise AssertionError(f"clobbered on the full filesystem: {sorted(set(before) ^ set(after))}")
        return value
    return action


# ----------------------------------------------------------------------------- signals
def signalled(argv, signum: int = signal.SIGTERM, at: str = "encode"):
    """Run a command that receives `signum` from itself when it first encodes (deterministic: no timer).

    A fallback handler stands in case the CLI installed none (so a regression cannot kill the test run)."""
    def action(ctx: Context):
        from mirrorbert.encoder.model import Encoder

        original = Encoder.encode

        def encode(self, *args, **kwargs):
            os.kill(os.getpid(), signum)
            return original(self, *args, **kwargs)

        class Terminated(BaseException):
            pass

        def fallback(sig, frame):
            raise Terminated("the CLI installed no SIGTERM handler: the process would have died here")

        previous = signal.signal(signal.SIGTERM, fallback)
        Encoder.encode = encode
        try:
            rc, err = run_main(argv(ctx))
        finally:
            Encoder.encode = original
            signal.signal(signal.SIGTERM, previous)
        return rc
    return action


def interrupted(*absent: str):
    def check(ctx: Context, result: Result) -> str | None:
        if result.value != 130:
            return f"exit status {result.value}, expected 130 (interrupted)"
        left = [n for n in absent if os.path.lexists(ctx.folder / n)]
        return f"written although interrupted: {left}" if left else None
    return check


# ----------------------------------------------------------------------------- the Python API
def _encoder(ctx: Context):
    from mirrorbert.encoder.model import Encoder

    return Encoder.load(ctx.env["tiny"], device="cpu")


def _corpus() -> list[str]:
    from tiny_models import CORPUS

    return list(CORPUS)


def encode_after_failure(fail):
    """Call `fail(encoder)` (which must raise UserError), then encode: equal to a fresh encoder's vectors."""
    def action(ctx: Context):
        import numpy as np

        from mirrorbert.errors import UserError

        encoder = _encoder(ctx)
        try:
            fail(encoder)
        except UserError:
            refused = True
        else:
            refused = False
        after = encoder.encode(_corpus())
        fresh = _encoder(ctx).encode(_corpus())
        return {"refused": refused, "equal": bool(np.array_equal(after, fresh)), "device": str(encoder.device)}
    return action


def same_as_fresh(ctx: Context, result: Result) -> str | None:
    value = result.value or {}
    if not value.get("refused"):
        return "the bad device was not refused"
    if value.get("device") != "cpu":
        return f"the encoder was left on {value.get('device')}"
    return None if value.get("equal") else "the encoder's vectors changed after the failed call"


def index_save(target: str, overwrite: bool = False):
    def action(ctx: Context):
        from mirrorbert.search.exact import build_index

        index = build_index(_encoder(ctx), _corpus()[:3])
        return index.save(ctx.folder / target, overwrite=overwrite)
    return action


# ----------------------------------------------------------------------------- the table
def _lock_link_cases() -> list[FileCase]:
    """The lock file beside each command's output is a symlink to a victim: refused, the victim untouched."""
    cases = []
    for which, name in OUTPUTS.items():
        def setup(ctx: Context, name=name) -> None:
            victim = ctx.victim(ctx.folder / "victim.txt", b"the user's file\n")
            os.symlink(victim, lock_of(_out_dir(ctx) / name))

        cases.append(FileCase(f"write:lock-symlink-to-victim:{which}", WHAT_LOCK, setup,
                              lambda ctx, which=which: command(ctx, which), names=(".lock",)))
    return cases


def _setup_lock(name: str, make):
    def setup(ctx: Context) -> None:
        make(ctx, lock_of(_out_dir(ctx) / name))
    return setup


def _link_to(target_factory):
    def make(ctx: Context, lock: Path) -> None:
        os.symlink(target_factory(ctx), lock)
    return make


def _dangling(ctx: Context) -> Path:
    return ctx.victim(ctx.folder / "never-created", None)


def _fifo_victim(ctx: Context) -> Path:
    return ctx.victim(mkfifo(ctx.folder / "pipe"), None)


def _device_victim(ctx: Context) -> Path:
    return ctx.victim(mkchar(ctx.folder / "null-device"), None)


def _folder_victim(ctx: Context) -> Path:
    return precious_folder(ctx)


def _planted_file(content: bytes = b"precious\n", owner: int | None = None):
    def make(ctx: Context, lock: Path) -> None:
        ctx.victim(lock, content)
        if owner is not None:
            os.chown(lock, owner, owner)
            os.chmod(lock, 0o600)
    return make


def _shared_folder_setup(planted_kind: str):
    """A sticky 0777 folder shared by users: another user planted, at the lock path of our output, a symlink to
    a root-only 0600 file (or a 0600 file of their own)."""
    def setup(ctx: Context) -> None:
        shared = ctx.folder / "shared"
        shared.mkdir()
        os.chmod(shared, 0o1777)
        secret_dir = ctx.folder / "root-only"
        secret_dir.mkdir(mode=0o700)
        secret = ctx.victim(secret_dir / "shadow", b"root:secret\n")
        os.chmod(secret, 0o600)
        lock = shared / ".x.npy.lock"
        if planted_kind == "symlink":
            os.symlink(secret, lock)
            os.lchown(lock, NOBODY, NOBODY)
            ctx.victim(lock, None)
        else:
            ctx.victim(lock, b"someone else's\n")
            os.chown(lock, NOBODY, NOBODY)
            os.chmod(lock, 0o600)
    return setup


def _lock_variant_cases() -> list[FileCase]:
    cases = [
        FileCase("write:lock-dangling-symlink:train", WHAT_LOCK, _setup_lock("train", _link_to(_dangling)),
                 lambda ctx: command(ctx, "train"), names=(".lock",)),
        FileCase("write:lock-dangling-symlink:encode", WHAT_LOCK, _setup_lock("x.npy", _link_to(_dangling)),
                 lambda ctx: command(ctx, "encode"), names=(".lock",)),
        FileCase("write:lock-symlink-to-fifo:index", WHAT_LOCK, _setup_lock("index", _link_to(_fifo_victim)),
                 lambda ctx: command(ctx, "index"), names=(".lock",), timeout=30),
        FileCase("write:lock-symlink-to-device:export", WHAT_LOCK, _setup_lock("export", _link_to(_device_victim)),
                 lambda ctx: command(ctx, "export"), names=(".lock",)),
        FileCase("write:lock-symlink-to-folder:push", WHAT_LOCK, _setup_lock("push", _link_to(_folder_victim)),
                 lambda ctx: command(ctx, "push"), names=(".lock",)),
        FileCase("write:lock-is-fifo:encode", WHAT_LOCK,
                 _setup_lock("x.npy", lambda ctx, lock: ctx.victim(mkfifo(lock), None)),
                 lambda ctx: command(ctx, "encode"), names=(".lock",), timeout=30),
        FileCase("write:lock-is-device:index", WHAT_LOCK,
                 _setup_lock("index", lambda ctx, lock: ctx.victim(mkchar(lock), None)),
                 lambda ctx: command(ctx, "index"), names=(".lock",)),
        FileCase("write:lock-is-folder:train", WHAT_LOCK,
                 _setup_lock("train", lambda ctx, lock: (lock.mkdir(), ctx.victim(lock / "mine.txt"))),
                 lambda ctx: command(ctx, "train"), names=(".lock",)),
        FileCase("write:lock-is-socket:eval-output", WHAT_LOCK,
                 _setup_lock("r.json", lambda ctx, lock: ctx.victim(mksocket(lock), None)),
                 lambda ctx: command(ctx, "eval-output"), names=(".lock",)),
        FileCase("write:lock-symlink-shared-sticky-folder:encode", WHAT_LOCK, _shared_folder_setup("symlink"),
                 lambda ctx: command(ctx, "encode", ctx.folder / "shared" / "x.npy"), names=(".lock",)),
        # the checkpoint folder's own lock
        FileCase("write:lock-symlink-checkpoint-dir:train", WHAT_LOCK,
                 _setup_lock("train.checkpoints", _link_to(lambda ctx: ctx.victim(ctx.folder / "victim.txt"))),
                 lambda ctx: command(ctx, "train") + ["--save-every", "1"], names=(".lock",)),
        FileCase("write:lock-symlink-checkpoint-dir:pretrain-mlm", WHAT_LOCK,
                 _setup_lock("mlm.checkpoints", _link_to(lambda ctx: ctx.victim(ctx.folder / "victim.txt"))),
                 lambda ctx: command(ctx, "pretrain-mlm") + ["--save-every", "1"], names=(".lock",)),
        FileCase("write:lock-symlink-rows-file:encode", WHAT_LOCK,
                 _setup_lock("x.rows.json", _link_to(lambda ctx: ctx.victim(ctx.folder / "victim.txt"))),
                 lambda ctx: command(ctx, "encode") + ["--skip-bad-lines"], names=(".lock",)),
        FileCase("write:lock-symlink-plot-dir:eval-report", WHAT_LOCK,
                 _setup_lock("r_files", _link_to(lambda ctx: ctx.victim(ctx.folder / "victim.txt"))),
                 lambda ctx: command(ctx, "eval-report"), names=(".lock",)),
        # a regular file planted at the lock path: locked read-only, never written nor removed
        FileCase("write:lock-planted-file:encode", WHAT_LOCK, _setup_lock("x.npy", _planted_file()),
                 lambda ctx: command(ctx, "encode"), expect=WORKS, check=exists("out/x.npy")),
        FileCase("write:lock-planted-file:index", WHAT_LOCK, _setup_lock("index", _planted_file(b"")),
                 lambda ctx: command(ctx, "index"), expect=WORKS, check=exists("out/index/manifest.json")),
        FileCase("write:lock-planted-file:train", WHAT_LOCK, _setup_lock("train", _planted_file(b"12345\n")),
                 lambda ctx: command(ctx, "train"), expect=WORKS, check=exists("out/train/mirrorbert.json")),
        FileCase("write:lock-planted-file:push", WHAT_LOCK, _setup_lock("push", _planted_file()),
                 lambda ctx: command(ctx, "push"), expect=WORKS, check=exists("out/push/mirrorbert.json")),
        FileCase("write:lock-planted-file-other-user:encode", WHAT_LOCK,
                 _setup_lock("x.npy", _planted_file(b"theirs\n", owner=NOBODY)),
                 lambda ctx: command(ctx, "encode"), expect=WORKS, check=exists("out/x.npy")),
        FileCase("write:lock-planted-file-shared-sticky-folder:encode", WHAT_LOCK, _shared_folder_setup("file"),
                 lambda ctx: command(ctx, "encode", ctx.folder / "shared" / "x.npy"), expect=WORKS,
                 check=exists("shared/x.npy")),
    ]
    return cases


def _special_output_cases() -> list[FileCase]:
    def at(name: str, make, link: bool = False):
        def setup(ctx: Context) -> None:
            target = make(ctx.folder / (f"real-{name}" if link else f"out/{name}"))
            ctx.victim(target, None)
            if link:
                _out_dir(ctx)
                ctx.victim(ctx.folder / "out" / name, None)
                os.symlink(target, ctx.folder / "out" / name)
        return setup

    ow = ["--overwrite"]
    return [
        FileCase("write:overwrite-fifo:encode", WHAT_SPECIAL, at("x.npy", mkfifo),
                 lambda ctx: command(ctx, "encode") + ow, names=("--output",), timeout=30),
        FileCase("write:fifo-without-overwrite:encode", WHAT_SPECIAL, at("x.npy", mkfifo),
                 lambda ctx: command(ctx, "encode"), names=("--output",), timeout=30),
        FileCase("write:overwrite-char-device:encode", WHAT_SPECIAL, at("x.npy", mkchar),
                 lambda ctx: command(ctx, "encode") + ow, names=("--output",)),
        FileCase("write:overwrite-socket:encode", WHAT_SPECIAL, at("x.npy", mksocket),
                 lambda ctx: command(ctx, "encode") + ow, names=("--output",)),
        FileCase("write:overwrite-symlink-to-fifo:encode", WHAT_SPECIAL, at("x.npy", mkfifo, link=True),
                 lambda ctx: command(ctx, "encode") + ow, names=("--output",), timeout=30),
        FileCase("write:overwrite-symlink-to-device:encode", WHAT_SPECIAL, at("x.npy", mkchar, link=True),
                 lambda ctx: command(ctx, "encode") + ow + ["--quantize", "int8"], names=("--output",)),
        FileCase("write:overwrite-fifo:eval-output", WHAT_SPECIAL, at("r.json", mkfifo),
                 lambda ctx: command(ctx, "eval-output") + ow, names=("--output",), timeout=30),
        FileCase("write:overwrite-char-device:eval-report", WHAT_SPECIAL, at("r.md", mkchar),
                 lambda ctx: command(ctx, "eval-report") + ow, names=("--report",)),
        FileCase("write:overwrite-fifo:finetune-sts", WHAT_SPECIAL, at("sts.json", mkfifo),
                 lambda ctx: command(ctx, "finetune-sts") + ow, names=("--output",), timeout=30),
        FileCase("write:overwrite-fifo:index", WHAT_SPECIAL, at("index", mkfifo),
                 lambda ctx: command(ctx, "index") + ow, names=("--output",), timeout=30),
        FileCase("write:overwrite-char-device:train", WHAT_SPECIAL, at("train", mkchar),
                 lambda ctx: command(ctx, "train") + ow, names=("--output",)),
        FileCase("write:overwrite-socket:export", WHAT_SPECIAL, at("export", mksocket),
                 lambda ctx: command(ctx, "export") + ow, names=("--output",)),
        FileCase("write:overwrite-symlink-to-fifo:push", WHAT_SPECIAL, at("push", mkfifo, link=True),
                 lambda ctx: command(ctx, "push") + ow, names=("--output",), timeout=30),
        FileCase("write:overwrite-char-device:lexsub", WHAT_SPECIAL, at("lexsub", mkchar),
                 lambda ctx: command(ctx, "lexsub") + ow, names=("--output",)),
        FileCase("write:overwrite-fifo:reproduce", WHAT_SPECIAL, at("rep", mkfifo),
                 lambda ctx: command(ctx, "reproduce") + ow, names=("--output",), timeout=30),
    ]


def _listed_file_became_fifo(ctx: Context) -> None:
    """An index mirrorbert wrote, one of its listed files since replaced by a FIFO: --overwrite must not read it."""
    rc, err = run_main(command(ctx, "index"))
    assert rc == 0, err
    texts = ctx.folder / "out" / "index" / "texts.jsonl"
    texts.unlink()
    ctx.victim(mkfifo(texts), None)


def _step_cases() -> list[FileCase]:
    def checkpoints_with_link(which: str, root_name: str):
        def setup(ctx: Context) -> None:
            root = _out_dir(ctx) / root_name
            root.mkdir()
            os.symlink(precious_folder(ctx), root / "step-7")
            ctx.victim(root / "notes.txt", b"mine too\n")  # anything else in the folder stays
        return setup

    def rotation_setup(ctx: Context) -> None:
        """A finished run with step-1 and step-2; step-1 then replaced by a link to the user's folder."""
        rc, err = run_main(command(ctx, "train") + ["--steps", "2", "--save-every", "1", "--keep-checkpoints", "5"])
        assert rc == 0, err
        step1 = ctx.folder / "out" / "train.checkpoints" / "step-1"
        import shutil
        shutil.rmtree(step1)
        os.symlink(precious_folder(ctx), step1)

    def resume_rotating(ctx: Context) -> list[str]:
        root = ctx.folder / "out" / "train.checkpoints"
        return command(ctx, "train", ctx.folder / "out" / "train2") + [
            "--steps", "4", "--save-every", "1", "--keep-checkpoints", "1", "--resume", str(root),
            "--checkpoint-dir", str(root)]

    def best_model_link(ctx: Context) -> None:
        root = _out_dir(ctx) / "gr.checkpoints"
        root.mkdir()
        os.symlink(precious_folder(ctx), root / "best-model")

    return [
        FileCase("write:step-symlink-overwrite:train", WHAT_STEP, checkpoints_with_link("train", "train.checkpoints"),
                 lambda ctx: command(ctx, "train") + ["--overwrite", "--save-every", "1"], expect=WORKS,
                 check=link_gone("out/train.checkpoints/step-7", "out/train/mirrorbert.json")),
        FileCase("write:step-symlink-overwrite:pretrain-mlm", WHAT_STEP,
                 checkpoints_with_link("pretrain-mlm", "mlm.checkpoints"),
                 lambda ctx: command(ctx, "pretrain-mlm") + ["--overwrite", "--save-every", "1"], expect=WORKS,
                 check=link_gone("out/mlm.checkpoints/step-7", "out/mlm")),
        FileCase("write:step-symlink-without-overwrite:train", WHAT_STEP,
                 checkpoints_with_link("train", "train.checkpoints"),
                 lambda ctx: command(ctx, "train") + ["--save-every", "1"], names=("--checkpoint-dir", "--resume")),
        FileCase("write:step-symlink-rotation:train", WHAT_STEP, rotation_setup, resume_rotating, expect=WORKS,
                 check=link_gone("out/train.checkpoints/step-1", "out/train2/mirrorbert.json"), timeout=120),
        FileCase("write:best-model-symlink-overwrite:gloss-pretrain", WHAT_STEP, best_model_link,
                 lambda ctx: command(ctx, "gloss-pretrain") + ["--overwrite"], expect=WORKS,
                 check=exists("out/gr")),
        FileCase("write:listed-file-became-fifo:index", WHAT_SPECIAL, _listed_file_became_fifo,
                 lambda ctx: command(ctx, "index") + ["--overwrite"], names=("texts.jsonl",), timeout=60),
    ]


def _outgoing_cases() -> list[FileCase]:
    def model_with(make):
        def setup(ctx: Context) -> None:
            model = ctx.folder / "model"
            rc, err = run_main(["push", "--model", str(saved_model(ctx)), "--repo", "u/n", "--dry-run", "--output",
                                str(model)])
            assert rc == 0, err  # a saved model folder as push reads it (the dry run's output is one)
            make(ctx, model)
        return setup

    def token_link(ctx: Context, model: Path) -> None:
        token = ctx.victim(ctx.folder / "home" / ".cache" / "huggingface" / "token", b"hf_SECRETTOKEN\n")
        os.symlink(token, model / "notes.txt")

    def inside_link(ctx: Context, model: Path) -> None:
        os.symlink(model / "config.json", model / "config-copy.json")

    def folder_link(ctx: Context, model: Path) -> None:
        secrets = ctx.folder / "secrets"
        ctx.victim(secrets / "id_rsa", b"-----BEGIN KEY-----\n")
        os.symlink(secrets, model / "extras")

    def weights_link(ctx: Context, model: Path) -> None:
        weights = model / "model.safetensors"
        real = ctx.folder / "elsewhere.safetensors"
        os.replace(weights, real)
        os.symlink(real, weights)

    def fifo_in(ctx: Context, model: Path) -> None:
        mkfifo(model / "pipe")

    def device_in(ctx: Context, model: Path) -> None:
        mkchar(model / "tty")

    def dry(ctx: Context) -> list[str]:
        return ["push", "--model", str(ctx.folder / "model"), "--repo", "u/n", "--dry-run", "--output",
                str(ctx.folder / "upload")]

    def real_push(ctx: Context) -> list[str]:
        return ["push", "--model", str(ctx.folder / "model"), "--repo", "u/n"]

    def not_uploaded(ctx: Context, result: Result) -> str | None:
        return "the upload folder was written" if (ctx.folder / "upload").exists() else None

    return [
        FileCase("write:push-dry-run-symlinked-token", WHAT_OUTGOING, model_with(token_link), dry,
                 names=("notes.txt",)),
        FileCase("write:push-symlinked-token-no-network", WHAT_OUTGOING, model_with(token_link), real_push,
                 names=("notes.txt",)),
        FileCase("write:push-dry-run-symlink-inside", WHAT_OUTGOING, model_with(inside_link), dry,
                 names=("config-copy.json",)),
        FileCase("write:push-dry-run-symlinked-folder", WHAT_OUTGOING, model_with(folder_link), dry,
                 names=("extras",)),
        FileCase("write:push-dry-run-symlinked-weights", WHAT_OUTGOING, model_with(weights_link), dry,
                 names=("model.safetensors",)),
        FileCase("write:push-dry-run-fifo", WHAT_OUTGOING, model_with(fifo_in), dry, names=("pipe",), timeout=30),
        FileCase("write:push-dry-run-device", WHAT_OUTGOING, model_with(device_in), dry, names=("tty",)),
    ]


def _name_cases() -> list[FileCase]:
    def name(n: int, suffix: str = "") -> str:
        return "n" * (n - len(suffix)) + suffix

    def loads(rel: str):
        def check(ctx: Context, result: Result) -> str | None:
            import numpy as np

            path = ctx.folder / "out" / rel
            if not path.is_file():
                return "not written"
            return None if np.load(path).shape[0] > 0 else "empty matrix"
        return check

    def out_dir(ctx: Context) -> None:
        _out_dir(ctx)

    def previous_npy(n: int):
        def setup(ctx: Context) -> None:  # replaced, as --overwrite asks: not a victim
            (_out_dir(ctx) / name(n, ".npy")).write_bytes(b"the previous output\n")
        return setup

    return [
        FileCase("write:name-255-bytes:encode", WHAT_NAME, out_dir,
                 lambda ctx: command(ctx, "encode", ctx.folder / "out" / name(255, ".npy")), expect=WORKS,
                 check=loads(name(255, ".npy"))),
        FileCase("write:name-250-bytes:encode", WHAT_NAME, None,
                 lambda ctx: command(ctx, "encode", ctx.folder / "out" / name(250, ".npy")), expect=WORKS,
                 check=loads(name(250, ".npy"))),
        FileCase("write:name-256-bytes:encode", WHAT_NAME, out_dir,
                 lambda ctx: command(ctx, "encode", ctx.folder / "out" / name(256, ".npy")), names=("--output",)),
        FileCase("write:name-255-bytes-overwrite:encode", WHAT_NAME, previous_npy(255),
                 lambda ctx: command(ctx, "encode", ctx.folder / "out" / name(255, ".npy")) + ["--overwrite"],
                 expect=WORKS, check=loads(name(255, ".npy"))),
        FileCase("write:name-255-bytes:index", WHAT_NAME, out_dir,
                 lambda ctx: command(ctx, "index", ctx.folder / "out" / name(255)), expect=WORKS,
                 check=exists(f"out/{name(255)}/manifest.json")),
        FileCase("write:name-253-bytes:push", WHAT_NAME, out_dir,
                 lambda ctx: command(ctx, "push", ctx.folder / "out" / name(253)), expect=WORKS,
                 check=exists(f"out/{name(253)}/mirrorbert.json")),
        FileCase("write:name-255-bytes-rows-file:encode", WHAT_NAME, out_dir,
                 lambda ctx: command(ctx, "encode", ctx.folder / "out" / name(255, ".npy")) + ["--skip-bad-lines"],
                 names=("--output",)),
        FileCase("write:name-250-bytes-checkpoints:train", WHAT_NAME, out_dir,
                 lambda ctx: command(ctx, "train", ctx.folder / "out" / name(250)) + ["--save-every", "1"],
                 names=("--checkpoint-dir", "--output")),
        FileCase("write:name-255-bytes:api-encoder-save", WHAT_NAME, out_dir,
                 lambda ctx: _encoder(ctx).save(ctx.folder / "out" / name(255)), expect=WORKS,
                 check=exists(f"out/{name(255)}/mirrorbert.json")),
        FileCase("write:name-256-bytes:api-encoder-save", WHAT_NAME, out_dir,
                 lambda ctx: _encoder(ctx).save(ctx.folder / "out" / name(256)), names=("path",)),
    ]


def _path_is_a_file_cases() -> list[FileCase]:
    def a_file(ctx: Context) -> None:
        ctx.victim(ctx.folder / "afile", b"a file where a folder should be\n")

    return [
        FileCase("write:file-in-path:encode", WHAT_DISK, a_file,
                 lambda ctx: command(ctx, "encode", ctx.folder / "afile" / "x.npy"), names=("--output",)),
        FileCase("write:file-in-path:train", WHAT_DISK, a_file,
                 lambda ctx: command(ctx, "train", ctx.folder / "afile" / "sub" / "out"), names=("--output",)),
        FileCase("write:file-in-path:checkpoint-dir", WHAT_DISK, a_file,
                 lambda ctx: command(ctx, "train") + ["--save-every", "1", "--checkpoint-dir",
                                                      str(ctx.folder / "afile" / "ck")], names=("--checkpoint-dir",)),
        FileCase("write:file-in-path:eval-report", WHAT_DISK, a_file,
                 lambda ctx: command(ctx, "eval-report", ctx.folder / "afile" / "r.md"), names=("--report",)),
        FileCase("write:file-in-path:api-index-save", WHAT_API, a_file, index_save("afile/idx"),
                 names=("afile",)),
    ]


def _disk_cases() -> list[FileCase]:
    if not can_mount():
        return []

    def full(size_kb: int = 256, free: int = 0, before=None):
        return lambda ctx: mount_disk(ctx, size_kb, free, before=before) and None

    def old_npy(disk: Path) -> None:
        (disk / "x.npy").write_bytes(b"the previous vectors\n")

    def big_input(ctx: Context) -> Path:
        path = ctx.folder / "many.txt"
        if not path.exists():
            path.write_text("\n".join(_corpus() * 250) + "\n", encoding="utf-8")  # 3,000 rows: 384 KB of vectors
        return path

    def encode_big(ctx: Context) -> list[str]:
        argv = command(ctx, "encode", ctx.folder / "disk" / "x.npy")
        argv[argv.index("--input") + 1] = str(big_input(ctx))
        return argv

    def old_index(disk: Path) -> None:
        (disk / "index").mkdir()
        (disk / "index" / "mine.txt").write_text("the user's\n", encoding="utf-8")

    disk = lambda ctx, name: ctx.folder / "disk" / name  # noqa: E731
    return [
        FileCase("write:full-disk:encode", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "encode", disk(ctx, "x.npy"))), names=("--output",)),
        FileCase("write:full-disk-overwrite-previous-kept:encode", WHAT_DISK, full(before=old_npy),
                 on_disk(lambda ctx: command(ctx, "encode", disk(ctx, "x.npy")) + ["--overwrite"]),
                 names=("--output",)),
        FileCase("write:nearly-full-tmpfs-no-sigbus:encode", WHAT_DISK, full(256, 8192), on_disk(encode_big),
                 names=("--output",), timeout=120),
        FileCase("write:full-disk-quantized:encode", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "encode", disk(ctx, "x.npy")) + ["--quantize", "int8"]),
                 names=("--output",)),
        FileCase("write:full-disk:index", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "index", disk(ctx, "index"))), names=("--output",)),
        FileCase("write:full-disk-user-folder-kept:index", WHAT_DISK, full(before=old_index),
                 on_disk(lambda ctx: command(ctx, "index", disk(ctx, "index")) + ["--overwrite"]),
                 names=("--output",)),
        FileCase("write:full-disk:export", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "export", disk(ctx, "export"))), names=("--output",)),
        FileCase("write:full-disk:push", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "push", disk(ctx, "push"))), names=("--output",)),
        FileCase("write:full-disk:train", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "train", disk(ctx, "out"))), names=("--output",)),
        FileCase("write:full-disk-checkpoint:train", WHAT_DISK, full(),
                 on_disk(lambda ctx: command(ctx, "train") + ["--save-every", "1", "--checkpoint-dir",
                                                              str(disk(ctx, "ck"))]),
                 names=("--checkpoint-dir",)),
        FileCase("write:full-disk-cache:pretrain-mlm", WHAT_DISK, full(before=lambda disk: (disk / "cache").mkdir()),
                 on_disk(lambda ctx: command(ctx, "pretrain-mlm")[:-2] + ["--cache-dir", str(disk(ctx, "cache"))]),
                 names=("--cache-dir",)),
        FileCase("write:read-only-fs:encode", WHAT_DISK, lambda ctx: mount_disk(ctx, read_only=True) and None,
                 on_disk(lambda ctx: command(ctx, "encode", disk(ctx, "x.npy"))), names=("--output",)),
        FileCase("write:full-disk:api-encoder-save", WHAT_DISK, full(),
                 api_on_disk(lambda ctx: _encoder(ctx).save(disk(ctx, "model"))), names=("path",)),
        FileCase("write:full-disk:api-index-save", WHAT_DISK, full(),
                 api_on_disk(lambda ctx: index_save("disk/idx")(ctx)), names=("idx",)),
    ]


def _signal_cases() -> list[FileCase]:
    def previous(ctx: Context) -> None:
        ctx.victim(_out_dir(ctx) / "x.npy", b"the previous vectors\n")

    return [
        FileCase("write:sigterm-during:encode", WHAT_SIGNAL, None,
                 signalled(lambda ctx: command(ctx, "encode")), expect=WORKS, check=interrupted("out/x.npy")),
        FileCase("write:sigterm-during-overwrite-previous-kept:encode", WHAT_SIGNAL, previous,
                 signalled(lambda ctx: command(ctx, "encode") + ["--overwrite"]), expect=WORKS,
                 check=interrupted()),
        FileCase("write:sigint-during:encode", WHAT_SIGNAL, None,
                 signalled(lambda ctx: command(ctx, "encode"), signal.SIGINT), expect=WORKS,
                 check=interrupted("out/x.npy")),
        FileCase("write:sigterm-during:index", WHAT_SIGNAL, None,
                 signalled(lambda ctx: command(ctx, "index")), expect=WORKS, check=interrupted("out/index")),
        FileCase("write:sigterm-during-quantized:encode", WHAT_SIGNAL, None,
                 signalled(lambda ctx: command(ctx, "encode") + ["--quantize", "int8"]), expect=WORKS,
                 check=interrupted("out/x.npy")),
    ]


def _api_cases() -> list[FileCase]:
    def user_folder(ctx: Context) -> None:
        ctx.victim(ctx.folder / "mine" / "notes.txt")

    def a_file(ctx: Context) -> None:
        ctx.victim(ctx.folder / "afile", b"not an index\n")

    def fifo(ctx: Context) -> None:
        ctx.victim(mkfifo(ctx.folder / "pipe"), None)

    return [
        FileCase("write:api-encode-device-meta", WHAT_API, None,
                 lambda ctx: _encoder(ctx).encode(["the cat"], device="meta"), names=("device",)),
        FileCase("write:api-encode-device-meta-then-encode", WHAT_API, None,
                 encode_after_failure(lambda e: e.encode(["the cat"], device="meta")), expect=WORKS,
                 check=same_as_fresh),
        FileCase("write:api-encode-device-cuda7", WHAT_API, None,
                 lambda ctx: _encoder(ctx).encode(["the cat"], device="cuda:7"), names=("device",)),
        FileCase("write:api-encode-device-cuda7-then-encode", WHAT_API, None,
                 encode_after_failure(lambda e: e.encode(["the cat"], device="cuda:7")), expect=WORKS,
                 check=same_as_fresh),
        FileCase("write:api-to-meta-then-encode", WHAT_API, None, encode_after_failure(lambda e: e.to("meta")),
                 expect=WORKS, check=same_as_fresh),
        FileCase("write:api-index-save-onto-file", WHAT_API, a_file, index_save("afile"), names=("afile",)),
        FileCase("write:api-index-save-onto-user-folder", WHAT_API, user_folder, index_save("mine", overwrite=True),
                 names=("mine",)),
        FileCase("write:api-index-save-onto-fifo", WHAT_API, fifo, index_save("pipe"), names=("pipe",), timeout=30),
        FileCase("write:api-encoder-save-onto-fifo", WHAT_API, fifo,
                 lambda ctx: _encoder(ctx).save(ctx.folder / "pipe", overwrite=True), names=("pipe",), timeout=30),
    ]


def _own_file_cases() -> list[FileCase]:
    def marker_tmp_link(ctx: Context) -> None:
        """The checkpoint root made by the user, with a link planted where mirrorbert's marker temporary used to be
        written (a fixed name, opened through any link there)."""
        root = _out_dir(ctx) / "train.checkpoints"
        root.mkdir()
        victim = ctx.victim(ctx.folder / "victim.txt")
        os.symlink(victim, root / "..mirrorbert-output.tmp")  # the fixed name it used
        ctx.victim(root / "..mirrorbert-output.tmp", None)

    return [
        FileCase("write:marker-temporary-symlink:train", WHAT_OWN, marker_tmp_link,
                 lambda ctx: command(ctx, "train") + ["--save-every", "1"], expect=WORKS,
                 check=exists("out/train.checkpoints/step-1", "out/train/mirrorbert.json")),
    ]


def cases(env: dict[str, Path]) -> list[FileCase]:
    return [*_lock_link_cases(), *_lock_variant_cases(), *_special_output_cases(), *_step_cases(),
            *_outgoing_cases(), *_name_cases(), *_path_is_a_file_cases(), *_disk_cases(), *_signal_cases(),
            *_api_cases(), *_own_file_cases()]
