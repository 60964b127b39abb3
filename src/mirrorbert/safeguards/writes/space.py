"""Room to write: a location is proven writable by creating a file there, and has the free space an output
needs (a rough estimate from the size of the starting weights)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.failures import human_size
from mirrorbert.safeguards.writes.paths import (PathLike, check_name_length, check_no_dangling_link, check_not_special,
                                                existing_ancestor, locate)


def check_writable(path: PathLike, option: str, needed_bytes: int = 0, is_file: bool = False,
                   probe_parent: bool = False) -> None:
    """Prove the location can be written by creating (and removing) a file in the nearest existing folder.

    A probe instead of os.access: it also catches read-only mounts, /proc and full disks, and is right for root.
    """
    check_name_length(path, option)
    check_no_dangling_link(path, option)
    path = locate(path)
    check_not_special(path, option)
    if is_file and path.is_dir() and not path.is_symlink():
        raise UserError(f"{option} {path} is a folder; expected a file name")
    start = path.parent if (is_file or probe_parent) else path  # outputs are built in a sibling temp folder
    folder = existing_ancestor(start, option)
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
            raise UserError(f"{option} {path}: only {human_size(free)} free in {folder}, about {human_size(needed_bytes)} "
                            f"needed")


def weights_size(model: PathLike | None) -> int:
    """Bytes of weight files in a local model folder (0 for a hub id: the estimate is then skipped)."""
    if not model:
        return 0
    folder = Path(os.path.expanduser(str(model)))
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.iterdir()
               if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".pth"))
