"""One plan per command: everything it will write, checked against every rule before any work (what may be
replaced, room to write), then one lock per output; `guard_run` does the same for a training run."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.failures import file_size_limit, human_size, write_probe
from mirrorbert.safeguards.writes.locks import folder_lock
from mirrorbert.safeguards.writes.markers import (BEST_MODEL, MARKER, RESUMABLE_CACHE, STEP_DIR, checkpoint_stray,
                                                  foreign_file, read_marker)
from mirrorbert.safeguards.writes.paths import (OWN_TEMPORARY, Inputs, PathLike, check_append_folder, check_not_nested,
                                                check_not_overlapping, check_place, existing_ancestor, link_words,
                                                locate)


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
    """A folder output: an existing folder is replaced only with --overwrite, and only when mirrorbert can prove
    it wrote all of it (`foreign_file`); a link at `path` only as the link. `resume_kind`: an empty folder or one
    whose marker has this kind is continued without --overwrite."""
    shown, path = path, check_place(path, option)
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
    if marker is None:
        raise UserError(f"{option} {shown}: {'--overwrite' if overwrite else 'mirrorbert'} only replaces a folder "
                        f"mirrorbert wrote, listing its files (it has no {MARKER} that mirrorbert writes); move it "
                        f"away or choose another folder")
    continuing = resumable and not overwrite and marker.get("kind") == resume_kind
    stray = foreign_file(path, RESUMABLE_CACHE.get(resume_kind) if continuing else None)
    if stray is not None:
        raise UserError(f"{option} {shown}: holds {stray}, which mirrorbert did not write (or which changed "
                        f"since: its marker must record the size and SHA-256 it has); move it away or choose "
                        f"another folder")
    return path


def check_replaceable_file(path: PathLike, overwrite: bool, option: str = "--output") -> Path:
    """A file output: an existing file is replaced only with --overwrite (a link there: the link, never its
    target); a folder is never a file output."""
    shown, path = path, check_place(path, option)
    if not os.path.lexists(path) or _check_link_or_mount(path, shown, overwrite, option):
        return path
    if path.is_dir():
        raise UserError(f"{option} {shown} is a folder; expected a file name")
    if not overwrite:
        raise UserError(f"{option} {shown} already exists; pass --overwrite to replace it")
    return path


@dataclass
class _Output:
    option: str
    path: PathLike
    what: str  # "file" | "folder" | "append" (a log or cache folder: files are added) | "checkpoints"
    resume_kind: str | None = None
    needed_bytes: int = 0


@dataclass
class WritePlan:
    """Everything one command will write, checked in one call before any work.

    >>> plan = WritePlan({"--model": model, "--data-dir": data_dir}, overwrite=args.overwrite)
    >>> plan.file("--output", args.output).file("--report", args.report).folder("--plot-dir", plot_dir)
    >>> with plan.locked(): ...   # checks every rule, then holds one lock per output
    """

    inputs: Inputs
    overwrite: bool = False
    outputs: list[_Output] = field(default_factory=list)

    def file(self, option: str, path: PathLike | None) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "file"))
        return self

    def folder(self, option: str, path: PathLike | None, resume_kind: str | None = None,
               needed_bytes: int = 0) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "folder", resume_kind, needed_bytes))
        return self

    def append_folder(self, option: str, path: PathLike | None) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "append"))
        return self

    def check(self) -> dict[str, Path]:
        """Every rule for every output; returns option -> resolved path. Raises UserError on the first breach."""
        for out in self.outputs:
            check_not_overlapping(out.path, out.option, self.inputs)
        for i, a in enumerate(self.outputs):
            for b in self.outputs[i + 1:]:
                check_not_nested(a.path, a.option, b.path, b.option)
        for out in self.outputs:
            if out.what == "file":
                check_replaceable_file(out.path, self.overwrite, out.option)
            elif out.what == "folder":
                check_replaceable(out.path, self.overwrite, out.option, resume_kind=out.resume_kind)
            else:
                check_append_folder(out.path, out.option)
            check_writable(out.path, out.option, beside=out.what != "append", needed_bytes=out.needed_bytes)
        return {out.option: locate(out.path) for out in self.outputs}

    def lock(self, stack: contextlib.ExitStack) -> None:
        """One lock per output, held on `stack` (only rank 0 of a torchrun/accelerate job locks)."""
        if int(os.environ.get("RANK", "0") or 0) != 0:
            return
        for out in self.outputs:
            if out.what != "append":
                stack.enter_context(folder_lock(out.path, out.option))

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Path]]:
        paths = self.check()
        with contextlib.ExitStack() as stack:
            self.lock(stack)
            yield paths


def check_writable(path: PathLike, option: str, *, beside: bool = False, needed_bytes: int = 0,
                   largest_file: int | None = None) -> None:
    """Prove `path` can be written by creating (and removing) a file in its nearest existing folder (`beside`:
    from its parent up, where its temporary goes), with `needed_bytes` free there and the file-size limit
    (`ulimit -f`) above `largest_file` (default: all of `needed_bytes` in one file)."""
    path = locate(path)
    folder = existing_ancestor(path.parent if beside else path, option)
    try:
        write_probe(folder)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise UserError(f"{option} {path}: cannot write in {folder} ({reason})") from None
    limit = file_size_limit()
    largest = needed_bytes if largest_file is None else largest_file
    if limit is not None and largest > limit:
        raise UserError(f"{option} {path}: the file-size limit (ulimit -f) is {human_size(limit)}, and a file of "
                        f"about {human_size(largest)} is to be written there; raise the limit (ulimit -f "
                        f"unlimited) and run again")
    free = shutil.disk_usage(folder).free if needed_bytes > 0 else 0
    if free < needed_bytes:
        raise UserError(f"{option} {path}: only {human_size(free)} free in {folder}, about "
                        f"{human_size(needed_bytes)} needed")


def weights_size(model: PathLike | None) -> int:
    """Bytes of weight files in a local model folder (0 for a hub id: the estimate is then skipped)."""
    folder = Path(os.path.expanduser(str(model))) if model else None
    if folder is None or not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.iterdir()
               if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".pth"))


def check_outputs_avoid(inputs: Inputs, *outputs: tuple[str, PathLike | None]) -> None:
    """The path rules for inputs only the CLI knows about (e.g. --config)."""
    for option, location in outputs:
        if location:
            check_not_overlapping(location, option, inputs)


def check_checkpoints_proven(root: PathLike, option: str = "--checkpoint-dir") -> None:
    """Before `--overwrite` discards the `step-N` checkpoints and `best-model` of a checkpoint folder, each
    must prove every file in it (`checkpoint_stray`); a link there loses only the link."""
    root = locate(root)
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if not (STEP_DIR.match(entry.name) or entry.name == BEST_MODEL) or entry.is_symlink() or not entry.is_dir():
            continue
        stray = checkpoint_stray(entry)
        if stray is not None:
            raise UserError(f"{option} {root}: --overwrite would discard {entry.name}, which holds {stray}, a file "
                            f"mirrorbert cannot prove it wrote (its manifest must record the size and SHA-256 it "
                            f"has); move it away or choose another folder")


@dataclass(frozen=True)
class RunPaths:
    """What a training run reads and writes, for `guard_run`; `extra_outputs` are folders files are added to,
    `model_bytes` the starting weights' size (the output needs one copy, a checkpoint three: AdamW's moments)."""

    output: PathLike
    inputs: Inputs
    checkpoint_dir: PathLike | None = None
    checkpoint_option: str = "--checkpoint-dir"
    extra_outputs: Sequence[tuple[str, PathLike | None]] = ()
    extra_files: Sequence[tuple[str, PathLike | None]] = ()
    model_bytes: int = 0


def guard_run(stack: contextlib.ExitStack, paths: RunPaths, *, overwrite: bool, resuming: bool = False) -> None:
    """All output checks of a training command, before anything is loaded; locks live on `stack`."""
    plan = WritePlan(paths.inputs, overwrite=overwrite).folder("--output", paths.output, needed_bytes=paths.model_bytes)
    for option, location in paths.extra_outputs:
        plan.append_folder(option, location)
    for option, location in paths.extra_files:
        plan.file(option, location)
    plan.check()
    root, option = paths.checkpoint_dir, paths.checkpoint_option
    if root is not None:  # may be the --resume root: its own rules are check_checkpoint_root's
        if overwrite and not resuming:
            check_checkpoints_proven(root, option)
        for out in plan.outputs:
            check_not_nested(root, option, out.path, out.option)
        check_not_overlapping(root, option, {k: v for k, v in paths.inputs.items() if k != "--resume"})
        check_place(root, option)
        check_writable(root, option, needed_bytes=3 * paths.model_bytes, largest_file=2 * paths.model_bytes)
        plan.outputs.append(_Output(option, root, "checkpoints"))
    plan.lock(stack)  # under torchrun/accelerate the job's rank 0 holds the locks and owns the checkpoint folder
