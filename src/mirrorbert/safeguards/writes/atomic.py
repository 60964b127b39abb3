"""Atomic writers of outputs: a file or folder is written under a temporary name beside its target and
renamed into place in the folder opened when the write began; on any failure the temporary is removed and
what was there before is left as it was."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Iterator

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.failures import write_errors
from mirrorbert.safeguards.writes.markers import files_below, mark_folder
from mirrorbert.safeguards.writes.paths import PathLike, check_no_dangling_link, existing_ancestor, locate, mode_words
from mirrorbert.safeguards.writes.replaceable import check_output_dir, check_replaceable_file
from mirrorbert.safeguards.writes.temporaries import (FILE_MODE, current_umask, fix_folder_mode, make_temporary,
                                                      open_temporary, replace_file, set_aside_name)


class _Folder:
    """The folder an output is written in, opened (never through a link) when the write starts: the final
    rename happens in this very folder, and only while its path still leads to it (a folder swapped for a
    link or another folder meanwhile is refused, the temporary removed from the folder it was made in)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def check(self, option: str, shown: Any) -> None:
        try:
            st = os.lstat(self.path)
            now = (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
            what = mode_words(st.st_mode)
        except OSError:
            now, what = None, "gone"
        if now != self.identity:
            what = "another folder" if now is not None else what
            raise UserError(f"{option} {shown}: its folder {self.path} was replaced while mirrorbert was writing "
                            f"(it is now {what}); nothing was written there")

    def explain(self, exc: BaseException, option: str, shown: Any) -> None:
        """A write that failed because its folder was swapped meanwhile fails as that (not as the error the
        swap caused, such as a temporary no longer found)."""
        if isinstance(exc, Exception):
            self.check(option, shown)  # raises the folder's own error when it was swapped

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove `name` from this folder (a folder with everything in it; a link is unlinked, never followed)."""
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if sys.version_info >= (3, 11):
                shutil.rmtree(name, dir_fd=self.fd, ignore_errors=True)
            else:  # pragma: no cover - Python 3.10: through the descriptor's /proc entry where there is one
                here = Path(f"/proc/self/fd/{self.fd}")
                shutil.rmtree((here if here.is_dir() else self.path) / name, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _open_folder(final: Path, shown: Any, option: str) -> _Folder:
    """Create `final`'s folder where needed and open it (see `_Folder`)."""
    check_no_dangling_link(shown, option)
    existing_ancestor(final.parent, option)  # a file where a folder should be: one line, not FileExistsError
    with write_errors(shown, option):
        final.parent.mkdir(parents=True, exist_ok=True)
        return _Folder(final.parent)


@contextlib.contextmanager
def atomic_output_dir(final: PathLike, overwrite: bool = False, kind: str = "output",
                      keep_empty: bool = True, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final` in (almost) one rename.

    Nothing the user had is lost: on failure the temporary folder is removed and `final` is untouched;
    an existing `final` (all of it mirrorbert's, checked) is moved aside first and only deleted after
    the new one is in place. A link at `final` is replaced (with `overwrite`), never followed.
    `keep_empty=False`: when nothing was written, nothing is created (an existing `final` stays).
    A full disk (or quota, read-only filesystem, name too long) is one UserError naming `final`.
    """
    shown, final = final, locate(final)
    check_output_dir(final, overwrite, option)
    folder = _open_folder(final, shown, option)
    try:
        with write_errors(shown, option):
            tmp = make_temporary(final, folder=True)
        try:
            with write_errors(shown, option):
                yield tmp
                if not keep_empty and not files_below(tmp):
                    folder.remove(tmp.name)
                    return
                mark_folder(tmp, kind, files_below(tmp))
                fix_folder_mode(tmp)
            check_output_dir(final, overwrite, option)  # a folder may have appeared there while we worked
            folder.check(option, shown)
            backup = None
            if os.path.lexists(final):
                backup = set_aside_name(final)
                folder.rename(final.name, backup.name)
            folder.rename(tmp.name, final.name)
        except BaseException as exc:
            folder.remove(tmp.name)
            folder.explain(exc, option, shown)
            raise
        if backup is not None:
            folder.remove(backup.name)
    finally:
        folder.close()


@contextlib.contextmanager
def atomic_output_file(final: PathLike, overwrite: bool = False, option: str = "--output") -> Iterator[Path]:
    """Yield a temporary path beside `final` (same suffix); on success it is renamed onto `final`.

    A link at `final` is replaced (with `overwrite`), never followed. Only a regular file is replaced (a
    device, FIFO or socket, or a link to one, is refused). A full disk (or quota, read-only filesystem, name
    too long) is one UserError naming `final`; the temporary is removed on any failure or interrupt.
    """
    shown, final = final, locate(final)
    check_replaceable_file(final, overwrite, option)
    folder = _open_folder(final, shown, option)
    try:
        with write_errors(shown, option):
            tmp = make_temporary(final, suffix=final.suffix)
        try:
            with write_errors(shown, option):
                yield tmp
            check_replaceable_file(final, overwrite, option)  # a file may have appeared there while we worked
            folder.check(option, shown)
            os.chmod(tmp.name, FILE_MODE & ~current_umask(), dir_fd=folder.fd)
            folder.rename(tmp.name, final.name)
        except BaseException as exc:
            folder.explain(exc, option, shown)
            raise
        finally:
            folder.remove(tmp.name)
    finally:
        folder.close()


def write_text_atomic(path: PathLike, text: str, overwrite: bool = False, option: str = "--output") -> Path:
    with atomic_output_file(path, overwrite, option) as tmp, open_temporary(tmp) as fh:
        fh.write(text.encode("utf-8"))
    return locate(path)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Write JSON under a temporary name and rename it (inside a folder this run owns; no policy checks)."""
    replace_file(path, jsonio.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
