"""What may be replaced: an existing file only with --overwrite; a folder only with --overwrite and only when
mirrorbert can prove it wrote all of it (`markers.foreign_file`); a link at an output's name only as a link,
never its target; a device, FIFO, socket or mount point never."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.markers import MARKER, RESUMABLE_CACHE, foreign_file, read_marker
from mirrorbert.safeguards.writes.paths import (OWN_TEMPORARY, PathLike, check_name_length, check_not_special,
                                                link_words, locate)


def _check_link_or_mount(path: Path, shown: Any, overwrite: bool, option: str, into: bool = False) -> bool:
    """True when `path` is a link (replaced only with --overwrite, and then as a link: never followed);
    a mount point is refused (a rename cannot replace it) unless the output is written `into` it."""
    if path.is_symlink():
        if not overwrite:
            raise UserError(f"{option} {shown} already exists ({link_words(path)}); pass --overwrite to replace "
                            f"the link (mirrorbert never writes through it)")
        return True
    if not into and path.is_dir() and os.path.ismount(path):
        raise UserError(f"{option} {shown} is a mount point: it cannot be replaced atomically (mirrorbert writes "
                        f"beside an output and renames it into place); name a new folder inside it instead")
    return False


def check_replaceable(path: PathLike, overwrite: bool, option: str = "--output", resume_kind: str | None = None
                      ) -> Path:
    """An existing folder is replaced only with --overwrite, and only when mirrorbert can prove it wrote all
    of it (`foreign_file`); a link at `path` only with --overwrite, and then only the link.

    `resume_kind`: an empty folder, or one whose marker has this kind (and nothing foreign), is continued
    without --overwrite (reproduce's cache).
    """
    check_name_length(path, option)
    shown, path = path, locate(path)
    check_not_special(path, option, shown)
    into = resume_kind is not None and not overwrite  # a continued output is written into, never renamed
    if not os.path.lexists(path) or _check_link_or_mount(path, shown, overwrite, option, into):
        return path
    if not path.is_dir():
        raise UserError(f"{option} {shown} exists and is not a folder")
    empty = all(OWN_TEMPORARY.match(p.name) for p in path.iterdir())  # nothing, or only our leftovers
    marker = read_marker(path)
    resumable = resume_kind is not None and (empty or (marker is not None and marker.get("kind") == resume_kind))
    if not overwrite and not resumable:
        raise UserError(f"{option} {shown} already exists; pass --overwrite to replace it")
    if empty:
        return path  # an empty folder loses nothing
    if marker is None or marker.get("files") is None:
        why = "it has no " + MARKER if marker is None else f"its {MARKER} (older mirrorbert) lists no files"
        raise UserError(f"{option} {shown}: {'--overwrite' if overwrite else 'mirrorbert'} only replaces a folder "
                        f"mirrorbert wrote, listing its files ({why}); move it away or choose another folder")
    continuing = resumable and not overwrite and marker.get("kind") == resume_kind
    stray = foreign_file(path, RESUMABLE_CACHE.get(resume_kind) if continuing else None)
    if stray is not None:
        raise UserError(f"{option} {shown}: holds {stray}, which mirrorbert did not write (or which changed "
                        f"since: its marker must record the size and SHA-256 it has); move it away or choose "
                        f"another folder")
    return path


def check_replaceable_file(path: PathLike, overwrite: bool, option: str = "--output") -> Path:
    """An existing file is replaced only with --overwrite (a link there: the link, never its target); a folder
    is never a file output."""
    check_name_length(path, option)
    shown, path = path, locate(path)
    check_not_special(path, option, shown)
    if not os.path.lexists(path) or _check_link_or_mount(path, shown, overwrite, option):
        return path
    if path.is_dir():
        raise UserError(f"{option} {shown} is a folder; expected a file name")
    if not overwrite:
        raise UserError(f"{option} {shown} already exists; pass --overwrite to replace it")
    return path


def check_output_dir(path: PathLike, overwrite: bool, option: str = "--output") -> Path:
    """Refuse early (before any training) to clobber a user's folder (or, with --overwrite, a foreign one)."""
    return check_replaceable(path, overwrite, option)
