"""Atomic writers of outputs: written under a temporary name beside the target and renamed into place in the
folder opened when the write began (a link at its name replaced, never followed); on any failure what was there
before is left as it was."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Any, Iterator

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.readback import describe_kind
from mirrorbert.safeguards.writes.failures import utf8_path, write_errors
from mirrorbert.safeguards.writes.held import held_signals
from mirrorbert.safeguards.writes.markers import files_below, mark_folder
from mirrorbert.safeguards.writes.paths import PathLike, existing_ancestor, locate
from mirrorbert.safeguards.writes.plan import check_replaceable, check_replaceable_file
from mirrorbert.safeguards.writes.temporaries import (FILE_MODE, current_umask, fix_folder_mode, make_temporary,
                                                      open_temporary, remove_tree, replace_file, set_aside_name)


class _Folder:
    """The folder an output is written in, opened (never through a link) when the write starts: the final
    rename happens in this very folder, and only while its path still leads to it."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def check(self, option: str, shown: Any) -> None:
        """Refuse when the folder's path no longer leads to this folder (swapped for a link or another one)."""
        try:
            st = os.lstat(self.path)
            now = (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
            what = describe_kind(st.st_mode)
        except OSError:
            now, what = None, "gone"
        if now != self.identity:
            what = "another folder" if now is not None else what
            raise UserError(f"{option} {shown}: its folder {self.path} was replaced while mirrorbert was writing "
                            f"(it is now {what}); nothing was written there")

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove `name` from this folder (`remove_tree`: a link is unlinked, never followed)."""
        if sys.version_info >= (3, 11):
            remove_tree(name, dir_fd=self.fd)
        else:  # pragma: no cover - Python 3.10's rmtree takes no dir_fd: the descriptor's /proc entry if any
            here = Path(f"/proc/self/fd/{self.fd}")
            remove_tree((here if here.is_dir() else self.path) / name)

    def alias(self, name: str) -> Path:
        """`name` in this folder as a library taking UTF-8 names only may be handed it: its path, or where that
        is not UTF-8, the same entry through this folder's descriptor (`/proc/self/fd/N/name`)."""
        path = self.path / name
        here = Path(f"/proc/self/fd/{self.fd}")
        return path if utf8_path(path) or not here.is_dir() else here / name

    def replace(self, tmp: str, final: str) -> str | None:
        """Rename `tmp` onto `final`, an existing `final` first set aside (returned: the caller removes it once
        the new one is in place) and put back if the second rename fails. The caller holds signals."""
        backup = None
        with contextlib.suppress(FileNotFoundError):
            os.lstat(final, dir_fd=self.fd)
            backup = set_aside_name(self.path / final).name
        if backup is not None:
            self.rename(final, backup)
        try:
            self.rename(tmp, final)
        except BaseException:
            if backup is not None:
                self.rename(backup, final)
            raise
        return backup

    def close(self) -> None:
        os.close(self.fd)


@contextlib.contextmanager
def library_path(path: PathLike) -> Iterator[Path]:
    """`path` (in an existing folder) as a library that takes UTF-8 names only may be handed it while the block
    runs: itself, or where it is not valid UTF-8, the same entry through an open descriptor of its folder."""
    path = Path(path)
    if utf8_path(path):
        yield path
        return
    folder = _Folder(path.parent)
    try:
        yield folder.alias(path.name)
    finally:
        folder.close()


def _open_folder(final: Path, shown: Any, option: str) -> _Folder:
    """Create `final`'s folder where needed and open it (see `_Folder`)."""
    existing_ancestor(final.parent, option)  # a file where a folder should be: one line, not FileExistsError
    with write_errors(shown, option):
        final.parent.mkdir(parents=True, exist_ok=True)
        return _Folder(final.parent)


@contextlib.contextmanager
def atomic_output_dir(final: PathLike, overwrite: bool = False, *, kind: str = "output", keep_empty: bool = True,
                      option: str = "--output") -> Iterator[Path]:
    """Yield a temporary folder beside `final`; on success it is marked as mirrorbert's (`kind`) and replaces
    `final`: an existing `final` (all of it provably mirrorbert's) is set aside first and deleted only once the
    new one is in place. `keep_empty=False`: when nothing was written, nothing is created."""
    shown, final = final, locate(final)
    check_replaceable(shown, overwrite, option)
    folder = _open_folder(final, shown, option)
    tmp = backup = None
    try:
        with write_errors(shown, option):
            tmp = make_temporary(final, folder=True)
            yield folder.alias(tmp.name)
            if not keep_empty and not files_below(tmp):
                folder.remove(tmp.name)
                return
            mark_folder(tmp, kind, files_below(tmp))
            fix_folder_mode(tmp)
        check_replaceable(final, overwrite, option)  # a folder may have appeared there while we worked
        folder.check(option, shown)
        with held_signals():  # a signal now waits until the new folder is in place and known to be
            backup = folder.replace(tmp.name, final.name)
            tmp = None
        if backup is not None:
            folder.remove(backup)
    except BaseException as exc:
        if tmp is not None:
            folder.remove(tmp.name)
        if backup is not None:  # interrupted while removing the old folder: the new one is in place
            folder.remove(backup)
        if isinstance(exc, Exception):
            folder.check(option, shown)  # a folder swapped meanwhile fails as that, not as what the swap caused
        raise
    finally:
        folder.close()


@contextlib.contextmanager
def atomic_output_file(final: PathLike, overwrite: bool = False, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary path beside `final` (same suffix); on success it is renamed onto `final`. Only a
    regular file is replaced (a device, FIFO or socket, or a link to one, is refused)."""
    shown, final = final, locate(final)
    check_replaceable_file(shown, overwrite, option)
    folder = _open_folder(final, shown, option)
    tmp = None
    try:
        with write_errors(shown, option):
            tmp = make_temporary(final, suffix=final.suffix)
            yield folder.alias(tmp.name)
        check_replaceable_file(final, overwrite, option)  # a file may have appeared there while we worked
        folder.check(option, shown)
        os.chmod(tmp.name, FILE_MODE & ~current_umask(), dir_fd=folder.fd)
        with held_signals():
            folder.rename(tmp.name, final.name)
            tmp = None
    except Exception:
        folder.check(option, shown)  # a folder swapped meanwhile fails as that, not as what the swap caused
        raise
    finally:
        if tmp is not None:
            folder.remove(tmp.name)
        folder.close()


def write_text_atomic(path: PathLike, text: str, overwrite: bool = False, option: str = "--output") -> Path:
    with atomic_output_file(path, overwrite, option) as tmp, open_temporary(tmp) as fh:
        fh.write(text.encode("utf-8"))
    return locate(path)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Write JSON under a temporary name and rename it (inside a folder this run owns; no policy checks)."""
    replace_file(path, jsonio.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
