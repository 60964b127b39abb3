"""Checkpoints that survive crashes and bit rot: `CheckpointManager` writes `root/step-N/` through a temporary
folder, every file's size and SHA-256 in `manifest.json` (written last), everything fsynced before the rename;
a checkpoint counts only when its manifest verifies. Also the run rules of a checkpoint folder and of a resume.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import open_checked, opening, set_aside, stream_sha256
from mirrorbert.safeguards.writes import (MARKER, checkpoint_stray, fix_folder_mode, library_path, make_temporary,
                                          mark_folder, remove_tree, write_errors, write_json_atomic)
from mirrorbert.runtime.randomness import rng_state, set_rng_state
from mirrorbert.training.state_format import load_state, save_state

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHECKPOINT_META = "checkpoint.json"
TRAINING_STATE = "training_state"  # .safetensors (tensors) + .json (the rest); no pickle
TRAINING_STATE_FILES = (f"{TRAINING_STATE}.safetensors", f"{TRAINING_STATE}.json")
STEP_DIR = re.compile(r"^step-(\d+)$")
BEST_MODEL = "best-model"  # gloss-pretrain keeps its best epoch here
# Temporary folders of an interrupted write (CheckpointManager.save, gloss-pretrain's best model).
STALE_TEMP = re.compile(r"^\.(step-\d+|best-model)\.tmp-")
KIND = "checkpoint"  # what a refusal says a path leads out of
META_LIMIT = 64 << 20  # checkpoint.json: the run's options and history
MANIFEST_LIMIT = 64 << 20  # manifest.json: a name, size and SHA-256 per file


class CheckpointDamaged(UserError):
    """A checkpoint whose files do not match its manifest (truncated, missing, unreadable)."""


def _sha256(path: Path) -> str:
    """SHA-256 of a file this run has just written (opened as a regular file, never through a link)."""
    with os.fdopen(open_checked(path, follow=False), "rb") as fh:
        return stream_sha256(fh, 1 << 20)


def fsync_path(path: Path) -> None:
    """Flush a file or a folder entry to disk (a folder fsync makes its renames durable)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0) | os.O_NOFOLLOW
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on folders; the data files were synced
        with opening():
            fd = os.open(path, flags)
        try:
            os.fsync(fd)
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


def checkpoint_folder(folder: str | os.PathLike, option: str = "checkpoint") -> ConfinedFolder:
    """The reader of one `step-N` folder: every file of it, and every path its manifest names, inside it."""
    return ConfinedFolder(folder, option, KIND)


def verify_checkpoint(folder: str | os.PathLike) -> dict[str, Any]:
    """Return the checkpoint's meta, or raise CheckpointDamaged naming the first bad file (and, for a path its
    manifest names, that path): every file read inside the folder, a regular file, JSON bounded."""
    folder = Path(folder)
    try:
        return _verify(checkpoint_folder(folder))
    except CheckpointDamaged:
        raise
    except UserError as exc:  # a refusal of the confined reader: it names the file (and the path named)
        raise CheckpointDamaged(f"checkpoint {folder} is damaged: {str(exc).removeprefix('checkpoint ')}") from None


def _verify(ck: ConfinedFolder) -> dict[str, Any]:
    folder = ck.given
    if not ck.exists(CHECKPOINT_META):
        raise CheckpointDamaged(f"checkpoint {folder} is incomplete: {CHECKPOINT_META} is missing")
    meta = ck.read_json(CHECKPOINT_META, limit=META_LIMIT)
    if not isinstance(meta.get("step"), int) or isinstance(meta.get("step"), bool) or meta["step"] < 0:
        raise CheckpointDamaged(f"checkpoint {folder} is damaged: {folder / CHECKPOINT_META} has no step")
    if not ck.exists(MANIFEST):
        raise CheckpointDamaged(f"checkpoint {folder} is incomplete: {folder / MANIFEST} is missing (not a finished "
                                "mirrorbert checkpoint)")
    for name, (size, sha256) in _manifest_files(ck).items():
        _check_listed(ck, name, size, sha256)
    return meta


def _manifest_files(ck: ConfinedFolder) -> dict[str, tuple[int, str]]:
    """The manifest's `files`: relative name -> (size, SHA-256), each entry well-formed."""
    files = ck.read_json(MANIFEST, limit=MANIFEST_LIMIT).get("files")
    if not isinstance(files, dict):
        raise ck.refuse(MANIFEST, "damaged (no \"files\" object)")
    out = {}
    for name, entry in files.items():
        size, sha256 = (entry.get("size"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(sha256, str):
            raise ck.refuse(str(name)[:200], "has no size and SHA-256", named_in=MANIFEST)
        out[name] = (size, sha256)
    return out


def _check_listed(ck: ConfinedFolder, name: str, size: int, sha256: str) -> None:
    """One file the manifest lists: inside the folder, a regular file of its size and SHA-256, read once."""
    folder = ck.given
    ck.resolve(name, named_in=MANIFEST)  # leads out: refused naming the manifest and the path
    if not ck.exists(name):
        raise CheckpointDamaged(f"checkpoint {folder} is incomplete: {folder / name} is missing")
    with os.fdopen(ck.open(name, named_in=MANIFEST), "rb") as fh:
        actual = os.fstat(fh.fileno()).st_size
        if actual != size:
            raise CheckpointDamaged(f"checkpoint {folder} is damaged: {folder / name} has {actual} bytes, "
                                    f"{size} were written")
        if stream_sha256(fh, 1 << 20) != sha256:
            raise CheckpointDamaged(f"checkpoint {folder} is damaged: {folder / name} does not match its SHA-256")


def step_folders(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """`(step, folder)` for every `step-N` folder under root, newest first (intact or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    matches = ((STEP_DIR.match(child.name), child) for child in root.iterdir())
    return sorted(((int(match.group(1)), child) for match, child in matches if match and child.is_dir()), reverse=True)


def set_aside_damaged(folder: Path) -> Path | None:
    """Rename a damaged checkpoint out of the `step-N` namespace (kept for inspection); None if it is gone."""
    try:
        return set_aside(folder, "--checkpoint-dir")
    except OSError:  # another process of the job set it aside first, or the folder is read-only
        return None


def remove_stale_temps(root: str | os.PathLike) -> None:
    """Remove temporary folders left by an interrupted checkpoint write (the run holding the lock is us)."""
    root = Path(root)
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.is_dir() and STALE_TEMP.match(child.name):
            logger.info("removing the unfinished checkpoint write %s", child)
            remove_tree(child)


def check_checkpoint_root(root: str | os.PathLike, resuming: bool, overwrite: bool) -> None:
    """A checkpoint folder belongs to one run: a new run over it must say --resume or --overwrite (which removes
    only the earlier run's `step-N` folders and `best-model`)."""
    root = Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise UserError(f"--checkpoint-dir {root} exists and is not a folder")
    remove_stale_temps(root)  # the caller holds the folder's lock: nobody else is writing there
    ours = [folder for _, folder in step_folders(root)] + [p for p in (root / BEST_MODEL,) if p.is_dir()]
    if resuming or not ours:
        return
    if not overwrite:
        raise UserError(f"--checkpoint-dir {root} holds checkpoints of an earlier run; pass --resume {root} to "
                        f"continue it or --overwrite to discard them")
    logger.warning("--overwrite: discarding the earlier run's checkpoints in %s", root)
    for folder in ours:  # only what mirrorbert wrote; anything else in the folder stays (a link: only the link)
        remove_tree(folder)


def check_resume_config(where: str | os.PathLike, saved: Mapping[str, Any] | None, current: Mapping[str, Any],
                        harmless: Iterable[str]) -> None:
    """Refuse, in one line naming each changed option, to resume with options other than the checkpoint's,
    except the `harmless` ones (bookkeeping that cannot change the result)."""
    if not saved:
        return
    harmless = set(harmless)
    changed = [key for key, value in current.items()
               if key not in harmless and key in saved and saved[key] != value]
    if changed:
        detail = ", ".join(f"--{k.replace('_', '-')} ({saved[k]!r} -> {current[k]!r})" for k in sorted(changed))
        raise UserError(f"--resume {where}: cannot resume with changed options: {detail}; use the checkpoint's "
                        f"values or start a new run")


@dataclass
class Checkpoint:
    """What a resumed run needs besides the model weights (which live in `path/model`)."""

    path: Path
    step: int
    meta: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


class CheckpointManager:
    """Writes `root/step-N/{model/, training_state.{safetensors,json}, checkpoint.json}` atomically and keeps the
    newest few."""

    def __init__(self, root: str | Path, keep: int = 2, every: int = 0, at_end: bool = False):
        self.root = Path(root)
        self.keep = keep
        self.every = every  # a checkpoint every N steps (0: none on a schedule)
        self.at_end = at_end  # one at the end of the run and whenever the method says one is due (epoch ends)

    def save(self, step: int, save_model, optimizer: torch.optim.Optimizer, *, scheduler=None, scaler=None,
             meta: dict[str, Any] | None = None, extra_state: dict[str, Any] | None = None) -> Path:
        """`save_model(folder)` writes the weights (and tokenizer); the rest goes to safetensors + JSON."""
        with write_errors(self.root, "--checkpoint-dir"):
            self.root.mkdir(parents=True, exist_ok=True)
            if not (self.root / MARKER).exists():
                mark_folder(self.root)
            remove_stale_temps(self.root)
            tmp = make_temporary(self.root / f"step-{step}", folder=True)
        final = self.root / f"step-{step}"
        try:
            with write_errors(self.root / f"step-{step}", "--checkpoint-dir"), library_path(tmp) as where:
                save_model(where / "model")  # `where`: `tmp`, or its descriptor's path where `tmp` is not UTF-8
                state = {
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "rng": rng_state(),
                    "extra": extra_state or {},
                }
                save_state(where, TRAINING_STATE, state)
                write_json_atomic(tmp / CHECKPOINT_META, {"step": step, **(meta or {})})
                write_manifest(tmp)  # sizes and SHA-256 of every file, fsynced, written last
                fix_folder_mode(tmp)
                verify_checkpoint(tmp)  # it counts only once every file reads back as written
        except BaseException:
            remove_tree(tmp)
            raise
        if final.is_symlink():  # a link planted in the step-N namespace: removed, its target left alone
            remove_tree(final)
        if final.exists():  # the same step written again (a resumed run passing an older run's step)
            try:
                verify_checkpoint(final)
                remove_tree(final)
            except CheckpointDamaged:
                set_aside_damaged(final)
        os.replace(tmp, final)
        fsync_path(self.root)
        self._prune(step)
        logger.info("checkpoint written: %s", final)
        return final

    def _prune(self, current: int) -> None:
        """Keep the newest `keep` checkpoints up to `current`, the one just written and verified; newer ones (an
        earlier run's steps that this resumed run has not reached yet) are left alone."""
        steps = sorted(s for s in self.all_steps() if s < current)
        for step in steps[: max(0, len(steps) + 1 - max(1, self.keep))]:
            folder = self.root / f"step-{step}"
            stray = None if folder.is_symlink() else checkpoint_stray(folder)  # a link: only the link goes
            if stray is not None:  # not provably ours: left where it is
                logger.warning("--checkpoint-dir: %s is not a checkpoint mirrorbert can prove it wrote (%s); "
                               "left in place", folder, stray)
                continue
            remove_tree(folder)

    def all_steps(self) -> list[int]:
        return [step for step, _ in step_folders(self.root)]

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; each damaged newer one (or a `step-N` link leading out of the root)
        is skipped with one warning and, by rank 0, set aside (`step-N.damaged-<time>`, never deleted), so that
        it is never counted as the newest again: `step-N` folders appear by one rename once complete."""
        for _, folder in step_folders(self.root):
            try:
                checkpoint_folder(self.root, "checkpoint").subfolder(folder.name)
                meta = verify_checkpoint(folder)
                return Checkpoint(path=folder, step=int(meta["step"]), meta=meta)
            except UserError as exc:  # CheckpointDamaged, or a step-N leading out of the root
                aside = set_aside_damaged(folder) if int(os.environ.get("RANK", "0") or 0) == 0 else None
                logger.warning("skipping %s%s", exc, f"; set aside as {aside.name}" if aside else "")
        return None


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Accept either one `step-N` folder (or anything holding checkpoint files; verified, one line naming a bad file)
    or a checkpoint root (its newest intact checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"--resume {path}: no such checkpoint folder")
    if not (STEP_DIR.match(path.name) or (path / CHECKPOINT_META).exists() or (path / MANIFEST).exists()):
        latest = CheckpointManager(path).latest()
        if latest is None:
            raise UserError(f"--resume {path}: no intact checkpoint found (expected step-N folders with "
                            f"{CHECKPOINT_META})")
        return latest
    try:
        meta = verify_checkpoint(path)
    except CheckpointDamaged as exc:
        raise UserError(f"--resume {path}: {exc}") from None
    return Checkpoint(path=path, step=int(meta["step"]), meta=meta)


def restore_training_state(ckpt: Checkpoint, optimizer, scheduler=None, scaler=None) -> dict[str, Any]:
    """Load optimiser/scheduler/scaler/RNG state; returns the trainer's extra state (epoch, batch...)."""
    state = read_training_state(ckpt.path)
    try:
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler") is not None:
            scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError, AttributeError) as exc:
        raise UserError(f"--resume {ckpt.path}: its training state does not fit this run's optimiser "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    extra = state.get("extra", {})
    if not isinstance(extra, dict):
        raise UserError(f"--resume {ckpt.path}: the training state is damaged (its extra state is not a mapping)")
    return extra


def read_training_state(folder: Path, option: str = "--resume") -> dict[str, Any]:
    """The state `CheckpointManager.save` wrote, read only inside the checkpoint folder, regular files
    (`checkpoint_folder`)."""
    folder = Path(folder)
    ck = checkpoint_folder(folder, f"{option}")
    missing = [name for name in TRAINING_STATE_FILES if not ck.exists(name)]
    if missing:
        raise UserError(f"{option} {folder}: checkpoint is incomplete: {folder / missing[0]} is missing")
    state = load_state(folder, TRAINING_STATE, f"{option} {folder}")
    if not isinstance(state, dict) or not isinstance(state.get("optimizer"), dict) or not isinstance(
            state.get("rng"), dict):
        raise UserError(f"{option} {folder}: the training state is damaged (no optimizer or RNG state)")
    return state
