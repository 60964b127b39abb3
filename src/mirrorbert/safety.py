"""Never lose a user's files: path rules, ownership markers, run locks, writability and free space.

Everything here runs before a model or any data is loaded, so that a mistake costs a second, not a
finished training run. The rules (also in the README, "Safety: your files"):

* An output or checkpoint folder may not be, contain or lie inside any input (`--model`, `--data`,
  `--config`, `--resume`, ...), and may not be or contain the current or the home directory (a fresh
  subfolder of either, such as `./out`, is fine).
* `--overwrite` only replaces a folder that mirrorbert wrote (it carries `MARKER`, or one of the info
  files every trainer writes) or an empty one; anything else is refused.
* One run at a time per output/checkpoint folder: an `fcntl.flock` on a lock file beside the folder,
  released by the kernel when the process ends (so a killed run never leaves a stale lock).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

# Written into every folder this tool creates (trained models, MLM/GR outputs, checkpoint roots).
MARKER = ".mirrorbert-output"
# Folders written before the marker existed are still recognised by their info files.
KNOWN_INFO_FILES = ("mirrorbert.json", "mlm_pretraining.json", "gr_training.json", "checkpoint.json")
# Created folders get these permissions minus the umask (tempfile.mkdtemp makes 0700 folders).
FOLDER_MODE = 0o777
FILE_MODE = 0o666


# --------------------------------------------------------------------------- path rules
def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(str(path))).resolve()


def _inside(child: Path, parent: Path) -> bool:
    """`child` equals `parent` or lies somewhere below it (both already resolved)."""
    return child == parent or parent in child.parents


PathLike = str | os.PathLike
# option name -> one path, several paths (e.g. --corpus A B), or None
Inputs = Mapping[str, "PathLike | list[PathLike] | tuple[PathLike, ...] | None"]


def _each_input(inputs: Inputs) -> Iterator[tuple[str, PathLike]]:
    for name, value in inputs.items():
        for item in (value if isinstance(value, (list, tuple)) else [value]):
            if item:
                yield name, item


def check_not_overlapping(path: PathLike, option: str, inputs: Inputs, protect_cwd: bool = True) -> Path:
    """Refuse an output that is, contains or lies inside an input, or is/contains the cwd or home."""
    target = _resolved(path)
    protected: list[tuple[str, Path]] = []
    if protect_cwd:
        protected.append(("the current directory", Path.cwd().resolve()))
        home = os.environ.get("HOME")
        if home:
            protected.append(("the home directory", _resolved(home)))
    for where, folder in protected:
        if _inside(folder, target):
            relation = "is" if folder == target else "contains"
            raise UserError(f"{option} {path}: refusing to write there, it {relation} {where} ({folder})")
    for name, value in _each_input(inputs):
        if not Path(os.path.expanduser(str(value))).exists():
            continue  # a hub id or a missing file is not a folder we could damage
        source = _resolved(value)
        if _inside(source, target) or _inside(target, source):
            if source == target:
                relation = "is"
            elif _inside(source, target):
                relation = "contains"
            else:
                relation = "lies inside"
            raise UserError(f"{option} {path}: refusing to write there, it {relation} the input {name} {value}")
    return target


def check_not_nested(a: str | os.PathLike, a_option: str, b: str | os.PathLike, b_option: str) -> None:
    """Two output locations that overlap would overwrite each other (e.g. --checkpoint-dir X --output X)."""
    ra, rb = _resolved(a), _resolved(b)
    if _inside(ra, rb) or _inside(rb, ra):
        raise UserError(f"{a_option} {a} and {b_option} {b} overlap; give them separate folders")


def written_by_us(folder: Path) -> bool:
    return any((folder / name).exists() for name in (MARKER, *KNOWN_INFO_FILES)) or any(
        child.name.startswith("step-") and (child / "checkpoint.json").exists() for child in folder.iterdir()
    )


def check_replaceable(path: str | os.PathLike, overwrite: bool, option: str = "--output") -> Path:
    """An existing folder is only replaced with --overwrite, and only when this tool wrote it (or it is empty)."""
    path = Path(path)
    if not path.exists():
        return path
    if not path.is_dir():
        raise UserError(f"{option} {path} exists and is not a folder")
    if not overwrite:
        raise UserError(f"{option} {path} already exists; pass --overwrite to replace it")
    if any(path.iterdir()) and not written_by_us(path):
        raise UserError(f"{option} {path}: --overwrite only replaces a folder mirrorbert wrote "
                        f"(it has no {MARKER} or mirrorbert.json); move it away or choose another folder")
    return path


def mark_folder(folder: str | os.PathLike) -> None:
    """Claim a folder as ours, so a later --overwrite may replace it."""
    (Path(folder) / MARKER).write_text("written by mirrorbert; --overwrite may replace this folder\n",
                                       encoding="utf-8")


def fix_folder_mode(folder: str | os.PathLike) -> None:
    """tempfile.mkdtemp makes 0700 folders (and some writers 0600 files); a finished output gets the usual
    umask-based modes, like any folder the user would have made."""
    umask = os.umask(0)
    os.umask(umask)
    folder = Path(folder)
    for path in (folder, *folder.rglob("*")):
        with contextlib.suppress(OSError):
            if path.is_dir():
                os.chmod(path, FOLDER_MODE & ~umask)
            elif path.is_file():
                os.chmod(path, FILE_MODE & ~umask)


# --------------------------------------------------------------------------- writability / space
def _existing_ancestor(path: Path, option: str) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise UserError(f"{option} {path}: {candidate} is a file, not a folder")
            return candidate
    return Path("/")  # pragma: no cover - the root always exists


def check_writable(path: str | os.PathLike, option: str, needed_bytes: int = 0, is_file: bool = False,
                   probe_parent: bool = False) -> None:
    """Prove the location can be written by creating (and removing) a file in the nearest existing folder.

    A probe instead of os.access: it also catches read-only mounts, /proc and full disks, and is right for root.
    """
    path = Path(os.path.expanduser(str(path)))
    if is_file and path.is_dir():
        raise UserError(f"{option} {path} is a folder; expected a file name")
    start = path.parent if (is_file or probe_parent) else path  # outputs are built in a sibling temp folder
    folder = _existing_ancestor(Path(os.path.abspath(start)), option)
    try:
        fd, probe = tempfile.mkstemp(prefix=".mirrorbert-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise UserError(f"{option} {path}: cannot write in {folder} ({reason})") from None
    if needed_bytes > 0:
        free = shutil.disk_usage(folder).free
        if free < needed_bytes:
            raise UserError(f"{option} {path}: only {_human(free)} free in {folder}, about {_human(needed_bytes)} "
                            f"needed")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def weights_size(model: str | os.PathLike | None) -> int:
    """Bytes of weight files in a local model folder (0 for a hub id: the estimate is then skipped)."""
    if not model:
        return 0
    folder = Path(os.path.expanduser(str(model)))
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.iterdir()
               if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".pth"))


def check_output_files(outputs: Iterable[tuple[str, PathLike | None]], inputs: Inputs = {}) -> None:
    """Up-front checks for single-file outputs (encode --output, eval --output/--report): writable, not an input."""
    for option, location in outputs:
        if location:
            check_not_overlapping(location, option, inputs, protect_cwd=False)
            check_writable(location, option, is_file=True)


def check_outputs_avoid(inputs: Inputs, *outputs: tuple[str, PathLike | None]) -> None:
    """The path rules for inputs only the CLI knows about (e.g. --config)."""
    for option, location in outputs:
        if location:
            check_not_overlapping(location, option, inputs)


# --------------------------------------------------------------------------- locks
def lock_path(folder: str | os.PathLike) -> Path:
    folder = Path(os.path.abspath(os.path.expanduser(str(folder))))
    return folder.with_name(f".{folder.name}.lock")


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, option: str) -> Iterator[Path]:
    """Exclusive lock for one output/checkpoint folder; a second run on it is refused at once.

    The kernel drops an flock when the process exits, however it exits, so a killed run never leaves a
    stale lock. The lock file is removed on release; a run that locked a file just unlinked by another
    notices (the path no longer names its file) and tries again.
    """
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{option} {folder}: another mirrorbert run is using it (lock {path}); "
                                f"wait for it to finish or choose another folder") from None
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # closing releases the flock


# --------------------------------------------------------------------------- one call per trainer
def guard_run(stack: contextlib.ExitStack, *, output: PathLike, overwrite: bool,
              inputs: Inputs, checkpoint_dir: str | os.PathLike | None = None,
              checkpoint_option: str = "--checkpoint-dir", resuming: bool = False,
              extra_outputs: Iterable[tuple[str, PathLike | None]] = (),
              extra_files: Iterable[tuple[str, PathLike | None]] = (), model_bytes: int = 0) -> None:
    """All output checks of a training command, before anything is loaded; locks live on `stack`.

    `model_bytes` (size of the starting weights) gives the rough free-space estimate: the output needs
    about one copy, each checkpoint about three (weights plus AdamW's two moments).
    """
    check_not_overlapping(output, "--output", inputs)
    check_replaceable(output, overwrite)
    check_writable(output, "--output", needed_bytes=model_bytes, probe_parent=True)
    if checkpoint_dir is not None:
        check_not_nested(checkpoint_dir, checkpoint_option, output, "--output")
        check_not_overlapping(checkpoint_dir, checkpoint_option,
                              {k: v for k, v in inputs.items() if k != "--resume"})
        check_writable(checkpoint_dir, checkpoint_option, needed_bytes=3 * model_bytes)
    for option, location in extra_outputs:
        if location:
            check_not_overlapping(location, option, inputs, protect_cwd=False)
            check_writable(location, option)
    for option, location in extra_files:
        if location:
            check_not_overlapping(location, option, inputs, protect_cwd=False)
            check_writable(location, option, is_file=True)
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return  # under torchrun/accelerate the job's rank 0 holds the locks and owns the checkpoint folder
    stack.enter_context(folder_lock(output, "--output"))
    if checkpoint_dir is not None:
        stack.enter_context(folder_lock(checkpoint_dir, checkpoint_option))


__all__ = [
    "MARKER", "check_not_overlapping", "check_output_files", "check_outputs_avoid", "check_not_nested", "check_replaceable", "check_writable",
    "folder_lock", "guard_run", "mark_folder", "fix_folder_mode", "weights_size", "written_by_us",
]
