"""Markers: how mirrorbert proves it wrote every file of a folder (its marker, or a checkpoint's manifest, lists
each with its size and SHA-256) before it replaces or removes it; a folder without a marker never is proven.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Iterable

import mirrorbert.jsonio as jsonio
from mirrorbert.safeguards.readback import NotRegularFile, loads_untrusted, open_checked, stream_sha256
from mirrorbert.safeguards.writes.paths import OWN_TEMPORARY, PathLike, locate
from mirrorbert.safeguards.writes.temporaries import remove_stale_temporaries, remove_tree, replace_file, set_aside_name

MARKER = ".mirrorbert-output"
MARKER_FORMAT = 1
# The marker's kind of a `reproduce` output: such a folder is continued (it is a cache) without --overwrite.
REPRODUCE_KIND = "reproduce"
# Where a resumable kind of output keeps its cache (see `foreign_file`).
RESUMABLE_CACHE: dict[str, str] = {REPRODUCE_KIND: "cells/"}
# Checkpoint folders inside an output (gloss-pretrain's `best-model` too): their manifests prove their files.
STEP_DIR = re.compile(r"^step-\d+$")
BEST_MODEL = "best-model"
# A marker or checkpoint manifest larger than this is not one of ours (it is read whole to check it).
RECORD_LIMIT = 64 << 20
# (device, inode, size, mtime, ctime) -> SHA-256 of a file this process read (a change to a file changes its ctime)
_DIGESTS: dict[tuple, str] = {}


def _read_record(path: Path) -> Any:
    """The JSON of the regular file (not a link) at `path`, of at most RECORD_LIMIT bytes; None for anything else."""
    try:
        fd = open_checked(path, follow=False, limit=RECORD_LIMIT)
    except NotRegularFile:
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(RECORD_LIMIT + 1)
    try:
        return loads_untrusted(raw)
    except ValueError:
        return None


def read_marker(folder: PathLike) -> dict[str, Any] | None:
    """The folder's marker (a JSON object listing file names in `files`), or None for anything else there."""
    data = _read_record(Path(folder) / MARKER)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list) \
            or not all(isinstance(name, str) for name in data["files"]):
        return None
    return data


def files_below(folder: Path, own: bool = False) -> list[str]:
    """Relative paths of every non-folder entry below `folder` but its marker (links are not followed), sorted;
    `own`: leaving out mirrorbert's locks and temporaries and the subfolders with a marker of their own."""
    found = set()
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        if own:
            dirs[:] = [d for d in dirs if not (base / d / MARKER).is_file() and not OWN_TEMPORARY.match(d)]
            files = [f for f in files if not OWN_TEMPORARY.match(f)]
        found.update((base / name).relative_to(folder).as_posix()
                     for name in files + [d for d in dirs if (base / d).is_symlink()])
    return sorted(found - {MARKER})


def _digest(path: Path) -> list | None:
    """[size, sha256] of a regular file, ["symlink", target] of a link (never followed), None for anything else."""
    try:
        if os.path.islink(path):
            return ["symlink", os.readlink(path)]
        fd = open_checked(path, follow=False)
    except (OSError, NotRegularFile):
        return None
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with os.fdopen(fd, "rb") as fh:
        if key not in _DIGESTS:
            try:
                _DIGESTS[key] = stream_sha256(fh)
            except OSError:
                return None
    return [st.st_size, _DIGESTS[key]]


def _is_digest(value: Any) -> bool:
    """A recorded [size, sha256] (or ["symlink", target] of a link mirrorbert made)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not isinstance(value[1], str):
        return False
    if value[0] == "symlink":
        return bool(value[1])
    return (isinstance(value[0], int) and not isinstance(value[0], bool) and value[0] >= 0
            and re.fullmatch(r"[0-9a-f]{64}", value[1]) is not None)


def proven(path: Path, recorded: Any) -> bool:
    """`path` is a regular file whose size and SHA-256 are the `recorded` ones, or a link to the recorded
    target (a real record: a missing, null or malformed one proves nothing)."""
    if not _is_digest(recorded):
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if recorded[0] == "symlink":
        return stat.S_ISLNK(st.st_mode) and _digest(path) == ["symlink", recorded[1]]
    if not stat.S_ISREG(st.st_mode) or st.st_size != recorded[0]:
        return False
    return _digest(path) == [recorded[0], recorded[1]]


def mark_folder(folder: PathLike, kind: str = "output", files: Iterable[str] = (),
                being_written: Iterable[str] = ()) -> None:
    """Claim a folder as ours, listing the files mirrorbert wrote there with their size and SHA-256;
    `being_written`: listed without a digest (a run may be killed halfway), proving nothing until recorded."""
    folder = Path(folder)
    pending = set(being_written)
    listed = sorted(set(files) | pending)
    digests = {name: None if name in pending else _digest(folder / name) for name in listed}
    text = jsonio.dumps({"written_by": "mirrorbert", "format": MARKER_FORMAT, "kind": kind, "files": listed,
                       "digests": digests}, indent=1) + "\n"
    replace_file(folder / MARKER, text)


def checkpoint_stray(folder: Path) -> Path | None:
    """The first file below a `step-N` checkpoint (or `best-model`) that its manifest does not prove: not
    listed, or not of the listed size and SHA-256. Without a readable manifest nothing is proven (the
    first file is returned); a checkpoint with its own marker is judged by that marker instead."""
    if os.path.lexists(folder / MARKER):
        return foreign_file(folder)
    manifest = _read_record(folder / "manifest.json")
    files = manifest.get("files") if isinstance(manifest, dict) else None
    for rel in files_below(folder):
        if rel == "manifest.json" and isinstance(files, dict):
            continue
        record = files.get(rel) if isinstance(files, dict) else None
        expected = [record.get("size"), record.get("sha256")] if isinstance(record, dict) else None
        if not proven(folder / rel, expected):
            return folder / rel
    return None


def foreign_file(folder: PathLike, cache_prefix: str | None = None) -> Path | None:
    """The first file below `folder` that its marker (a subfolder's own marker, a checkpoint's manifest) does not
    prove with the size and SHA-256 it still has, or None; mirrorbert's locks and temporaries are ours. Files
    under `cache_prefix` count by being listed (a continued run sets a damaged cache file aside itself)."""
    folder = Path(folder)
    marker = read_marker(folder)
    listed = set(marker["files"]) if marker else set()
    digests = marker.get("digests") if marker and isinstance(marker.get("digests"), dict) else {}

    def stray_in(current: Path) -> Path | None:
        for entry in sorted(current.iterdir()):
            if entry.name == MARKER or OWN_TEMPORARY.match(entry.name):
                continue
            if not entry.is_dir() or entry.is_symlink():
                rel = entry.relative_to(folder).as_posix()
                if cache_prefix and rel.startswith(cache_prefix) and rel in listed and not entry.is_symlink():
                    continue
                if rel not in listed or not proven(entry, digests.get(rel)):
                    return entry  # not listed, listed without a digest, or changed since: not provably ours
                continue
            if (entry / MARKER).is_file() and not (entry / MARKER).is_symlink():
                stray = foreign_file(entry)
            elif marker is not None and (STEP_DIR.match(entry.name) or entry.name == BEST_MODEL):
                stray = checkpoint_stray(entry)  # a checkpoint: its manifest proves it
            else:
                stray = stray_in(entry)
            if stray is not None:
                return stray
        return None

    return stray_in(folder)


def claim_files(folder: PathLike, rel_paths: Iterable[str], kind: str) -> None:
    """Add files to the folder's marker, without a digest, *before* writing them (`record_files` records them)."""
    marker = read_marker(folder) or {}
    old = marker.get("digests") if isinstance(marker.get("digests"), dict) else {}
    pending = {name for name, digest in old.items() if digest is None} | set(rel_paths)
    mark_folder(folder, kind, marker.get("files") or [], being_written=pending)


def record_files(folder: PathLike, kind: str) -> None:
    """List everything below `folder` in its marker (a subfolder with its own marker excepted); only for a
    folder this run holds the lock on and found holding nothing but mirrorbert's files."""
    folder = Path(folder)
    marker = read_marker(folder) or {}
    kept = {f for f in marker.get("files") or [] if (folder / f).exists()}
    mark_folder(folder, kind, set(files_below(folder, own=True)) | kept)


def discard_folder(folder: PathLike) -> None:
    """Remove a folder mirrorbert wrote (the caller checked `foreign_file`; a link loses only the link)."""
    folder = locate(folder)
    remove_stale_temporaries(folder)
    aside = set_aside_name(folder)
    os.replace(folder, aside)
    remove_tree(aside)
