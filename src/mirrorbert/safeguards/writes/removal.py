"""Removing what mirrorbert wrote without following a link. (What fails a check when read back is not removed
but set aside: `mirrorbert.safeguards.readback.set_aside`.)"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from mirrorbert.safeguards.writes.paths import PathLike


def remove_tree(path: PathLike) -> None:
    """Remove a folder mirrorbert wrote; a symlink (to a folder or anything else) is unlinked, never followed.

    `shutil.rmtree` itself never follows links below the top (it works on file descriptors); this adds the
    top, where rmtree refuses a symlink with an error: such a link is unlinked instead.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    shutil.rmtree(path, ignore_errors=True)

