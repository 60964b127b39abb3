"""Checkpoints that survive crashes and bit rot: manifests, fsync, verification, stale temp folders.

`runtime.CheckpointManager` writes `root/step-N/` through a temporary folder; this module adds what
makes the result trustworthy: every file's size and SHA-256 in `manifest.json` (written last), fsync of
files and folders before the rename, a check on load that names the first bad file, and the rules for
reusing a checkpoint folder (`check_checkpoint_root`) and for resuming with changed options
(`check_resume_config`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping

from mirrorbert import jsonio
from mirrorbert.errors import UserError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHECKPOINT_META = "checkpoint.json"
TRAINING_STATE = "training_state.pt"
STEP_DIR = re.compile(r"^step-(\d+)$")
BEST_MODEL = "best-model"  # gloss-pretrain keeps its best epoch here
# Temporary folders of an interrupted write (CheckpointManager.save, gloss-pretrain's best model).
STALE_TEMP = re.compile(r"^\.(step-\d+|best-model)\.tmp-")


class CheckpointDamaged(UserError):
    """A checkpoint whose files do not match its manifest (truncated, missing, unreadable)."""


# --------------------------------------------------------------------------- writing
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file or a folder entry to disk (a folder fsync makes its renames durable)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders; the data files were synced
        pass
    finally:
        os.close(fd)


def write_manifest(folder: str | os.PathLike) -> Path:
    """Record size and SHA-256 of every file, fsync them all, and write the manifest last."""
    folder = Path(folder)
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        fsync_path(path)
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = folder / MANIFEST
    with open(manifest, "w", encoding="utf-8") as fh:
        fh.write(jsonio.dumps({"format_version": 1, "files": files}, indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync_path(sub)
    fsync_path(folder)
    return manifest


# --------------------------------------------------------------------------- reading
def verify_checkpoint(folder: str | os.PathLike) -> dict[str, Any]:
    """Return the checkpoint's meta, or raise CheckpointDamaged naming the first bad file."""
    folder = Path(folder)
    meta_path = folder / CHECKPOINT_META
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        int(meta["step"])
    except FileNotFoundError:
        raise CheckpointDamaged(f"checkpoint {folder} is incomplete: {CHECKPOINT_META} is missing") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"checkpoint {folder} is damaged: {meta_path} cannot be read "
                                f"({type(exc).__name__})") from None
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        # Written by mirrorbert before manifests existed: check only that the parts are there.
        for needed in (TRAINING_STATE, "model"):
            if not (folder / needed).exists():
                raise CheckpointDamaged(f"checkpoint {folder} is incomplete: {folder / needed} is missing")
        logger.warning("checkpoint %s has no %s (older mirrorbert): its files cannot be verified", folder, MANIFEST)
        return meta
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointDamaged(f"checkpoint {folder} is damaged: {manifest_path} cannot be read") from None
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointDamaged(f"checkpoint {folder} is incomplete: {path} is missing")
        size = path.stat().st_size
        if size != expected.get("size"):
            raise CheckpointDamaged(f"checkpoint {folder} is damaged: {path} has {size} bytes, "
                                    f"{expected.get('size')} were written")
        if _sha256(path) != expected.get("sha256"):
            raise CheckpointDamaged(f"checkpoint {folder} is damaged: {path} does not match its SHA-256")
    return meta


def step_folders(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """`(step, folder)` for every `step-N` folder under root, newest first (intact or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found, reverse=True)


def newest_intact(root: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies; each damaged newer one is skipped with one warning."""
    for _, folder in step_folders(root):
        try:
            return folder, verify_checkpoint(folder)
        except CheckpointDamaged as exc:
            logger.warning("skipping %s", exc)
    return None


def is_named_checkpoint(path: Path) -> bool:
    """A `step-N` folder (or anything holding checkpoint files) rather than a checkpoint root."""
    return bool(STEP_DIR.match(path.name)) or (path / CHECKPOINT_META).exists() or (path / MANIFEST).exists()


def remove_stale_temps(root: str | os.PathLike) -> None:
    """Remove temporary folders left by an interrupted checkpoint write (the run holding the lock is us)."""
    root = Path(root)
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.is_dir() and STALE_TEMP.match(child.name):
            logger.info("removing the unfinished checkpoint write %s", child)
            shutil.rmtree(child, ignore_errors=True)


# --------------------------------------------------------------------------- run rules
def check_checkpoint_root(root: str | os.PathLike, resuming: bool, overwrite: bool,
                          option: str = "--checkpoint-dir") -> None:
    """A checkpoint folder belongs to one run: a new run over it must say --resume or --overwrite.

    Without this rule the old and the new run's checkpoints mix, pruning deletes the new ones and a
    later --resume silently continues the old run.
    """
    root = Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise UserError(f"{option} {root} exists and is not a folder")
    remove_stale_temps(root)  # the caller holds the folder's lock: nobody else is writing there
    ours = [folder for _, folder in step_folders(root)] + [p for p in (root / BEST_MODEL,) if p.is_dir()]
    if resuming or not ours:
        return
    if not overwrite:
        raise UserError(f"{option} {root} holds checkpoints of an earlier run; pass --resume {root} to continue "
                        f"it or --overwrite to discard them")
    logger.warning("--overwrite: discarding the earlier run's checkpoints in %s", root)
    for folder in ours:  # only what mirrorbert wrote; anything else in the folder stays
        shutil.rmtree(folder)


def check_resume_config(where: str | os.PathLike, saved: Mapping[str, Any] | None, current: Mapping[str, Any],
                        harmless: Iterable[str]) -> None:
    """Refuse to resume with changed options, except bookkeeping ones that cannot change the result.

    Applying a changed lr or batch size halfway would leave the optimiser with the old value while the
    output records the new one; refusing is the honest choice.
    """
    if not saved:
        return
    harmless = set(harmless)
    changed = [key for key, value in current.items()
               if key not in harmless and key in saved and saved[key] != value]
    if changed:
        detail = ", ".join(f"--{k.replace('_', '-')} ({saved[k]!r} -> {current[k]!r})" for k in sorted(changed))
        raise UserError(f"--resume {where}: cannot resume with changed options: {detail}; use the checkpoint's "
                        f"values or start a new run")


def default_checkpoint_dir(output: str | Path, checkpoint_dir: str | Path | None = None) -> Path:
    """Checkpoints live beside the output (`<output>.checkpoints`) so the final folder can be written atomically."""
    if checkpoint_dir:
        return Path(checkpoint_dir)
    return Path(f"{Path(output).as_posix().rstrip('/')}.checkpoints")


__all__ = [
    "CheckpointDamaged", "MANIFEST", "check_checkpoint_root", "check_resume_config", "fsync_path",
    "is_named_checkpoint", "newest_intact", "remove_stale_temps", "step_folders", "verify_checkpoint",
    "write_manifest", "default_checkpoint_dir",
]
