"""Output folders written atomically, JSON written atomically, and where checkpoints go by default.

The rules for which paths may be written live in `mirrorbert.safety`; these helpers apply them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from mirrorbert.safety import check_replaceable, fix_folder_mode, mark_folder


def check_output_dir(path: str | Path, overwrite: bool, option: str = "--output") -> Path:
    """Refuse early (before any training) to clobber a user's folder (or, with --overwrite, a foreign one)."""
    return check_replaceable(path, overwrite, option)


@contextlib.contextmanager
def atomic_output_dir(final: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final` in (almost) one rename.

    Nothing the user had is lost: on failure the temporary folder is removed and `final` is untouched;
    an existing `final` is moved aside first and only deleted after the new one is in place.
    """
    final = Path(final)
    check_output_dir(final, overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        mark_folder(tmp)
        fix_folder_mode(tmp)
        check_output_dir(final, overwrite)  # a folder may have appeared there while we worked
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    backup = None
    if final.exists():
        backup = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, backup)
    os.replace(tmp, final)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def default_checkpoint_dir(output: str | Path, checkpoint_dir: str | Path | None = None) -> Path:
    """Checkpoints live beside the output (`<output>.checkpoints`) so the final folder can be written atomically."""
    if checkpoint_dir:
        return Path(checkpoint_dir)
    return Path(f"{Path(output).as_posix().rstrip('/')}.checkpoints")
