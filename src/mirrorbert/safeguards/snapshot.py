"""The only folder a library is handed for a model mirrorbert did not write: a private (0700) snapshot of the
checked files, as the bytes the check read or links to the descriptors it opened (`/proc/self/fd/N`; a copy
where the platform has no such names), removed when closed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping

from mirrorbert.safeguards.writes.temporaries import remove_tree

PROC_FD = Path("/proc/self/fd")
_CHUNK = 1 << 22


def _new_file(dest: Path):
    """`dest` created exclusively, never through a link, for writing."""
    return os.fdopen(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb")


def _copy_descriptor(fd: int, dest: Path) -> None:
    """The bytes of the open file `fd`, from its start, into the new file `dest`."""
    with _new_file(dest) as fh:
        offset = 0
        while block := os.pread(fd, _CHUNK, offset):
            fh.write(block)
            offset += len(block)


@contextlib.contextmanager
def private_copy(fd: int, name: str) -> Iterator[Path]:
    """A copy of the open file `fd` in a private temporary folder, removed after the block."""
    folder = Path(tempfile.mkdtemp(prefix="mirrorbert-file-"))
    try:
        path = folder / PurePosixPath(name).name
        _copy_descriptor(fd, path)
        yield path
    finally:
        remove_tree(folder)


class Snapshot:
    """A private folder of checked files (see the module docstring); `path` while open, removed by `close`."""

    def __init__(self, copied: Mapping[str, bytes], opened: Mapping[str, int]):
        self.path = Path(tempfile.mkdtemp(prefix="mirrorbert-model-"))
        self._remove = weakref.finalize(self, remove_tree, str(self.path))
        try:
            for rel, data in copied.items():
                with _new_file(self._place(rel)) as fh:
                    fh.write(data)
            for rel, fd in opened.items():
                if PROC_FD.is_dir():
                    os.symlink(PROC_FD / str(fd), self._place(rel))
                else:
                    _copy_descriptor(fd, self._place(rel))
        except BaseException:
            self.close()
            raise

    def _place(self, rel: str) -> Path:
        """Where the folder's file `rel` goes in the snapshot (its parents made, all inside)."""
        dest = self.path.joinpath(*PurePosixPath(rel).parts)
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return dest

    def close(self) -> None:
        self._remove()
