"""One plan per command: everything it will write, checked against every rule in one call before any work,
then one lock per output; `guard_run` does the same for a training run and its checkpoint folder."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from mirrorbert.errors import UserError
from mirrorbert.safeguards.writes.locks import folder_lock
from mirrorbert.safeguards.writes.markers import BEST_MODEL, STEP_DIR, checkpoint_stray
from mirrorbert.safeguards.writes.paths import (Inputs, PathLike, check_append_folder, check_not_nested,
                                                check_not_overlapping, locate)
from mirrorbert.safeguards.writes.replaceable import check_replaceable, check_replaceable_file
from mirrorbert.safeguards.writes.space import check_writable


@dataclass
class _Output:
    option: str
    path: PathLike
    what: str  # "file" | "folder" | "append" (a log or cache folder: files are added, nothing is replaced)
    resume_kind: str | None = None
    needed_bytes: int = 0
    lock: bool = True


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

    def folder(self, option: str, path: PathLike | None, resume_kind: str | None = None, needed_bytes: int = 0,
               lock: bool = True) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "folder", resume_kind, needed_bytes, lock))
        return self

    def append_folder(self, option: str, path: PathLike | None) -> "WritePlan":
        if path:
            self.outputs.append(_Output(option, path, "append", lock=False))
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
                check_writable(out.path, out.option, is_file=True)
            elif out.what == "folder":
                check_replaceable(out.path, self.overwrite, out.option, resume_kind=out.resume_kind)
                check_writable(out.path, out.option, needed_bytes=out.needed_bytes, probe_parent=True)
            else:
                check_append_folder(out.path, out.option)
                check_writable(out.path, out.option)
        return {out.option: locate(out.path) for out in self.outputs}

    def lock(self, stack: contextlib.ExitStack) -> None:
        """One lock per output, held on `stack` (only rank 0 of a torchrun/accelerate job locks)."""
        if int(os.environ.get("RANK", "0") or 0) != 0:
            return
        for out in self.outputs:
            if out.lock and out.what != "append":
                stack.enter_context(folder_lock(out.path, out.option))

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Path]]:
        paths = self.check()
        with contextlib.ExitStack() as stack:
            self.lock(stack)
            yield paths


def check_outputs_avoid(inputs: Inputs, *outputs: tuple[str, PathLike | None]) -> None:
    """The path rules for inputs only the CLI knows about (e.g. --config)."""
    for option, location in outputs:
        if location:
            check_not_overlapping(location, option, inputs)


def check_checkpoints_proven(root: PathLike, option: str = "--checkpoint-dir") -> None:
    """Before `--overwrite` discards the `step-N` checkpoints and `best-model` of a checkpoint folder, each
    must prove every file in it (`checkpoint_stray`: its manifest's sizes and SHA-256); a link there loses
    only the link, and nothing else in the folder is touched."""
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
    """What a training run reads and writes, for `guard_run`.

    `inputs`: option -> path (or paths) it reads; `extra_outputs`: log and cache folders (files are added there,
    nothing is replaced); `extra_files`: single files it writes; `model_bytes` (size of the starting weights)
    gives the rough free-space estimate: the output needs about one copy, each checkpoint about three
    (weights plus AdamW's two moments).
    """

    output: PathLike
    inputs: Inputs
    checkpoint_dir: PathLike | None = None
    checkpoint_option: str = "--checkpoint-dir"
    extra_outputs: Sequence[tuple[str, PathLike | None]] = ()
    extra_files: Sequence[tuple[str, PathLike | None]] = ()
    model_bytes: int = 0


def guard_run(stack: contextlib.ExitStack, paths: RunPaths, *, overwrite: bool, resuming: bool = False) -> None:
    """All output checks of a training command, before anything is loaded; locks live on `stack`."""
    checkpoint_dir, checkpoint_option = paths.checkpoint_dir, paths.checkpoint_option
    plan = WritePlan(paths.inputs, overwrite=overwrite).folder("--output", paths.output, needed_bytes=paths.model_bytes)
    for option, location in paths.extra_outputs:
        plan.append_folder(option, location)
    for option, location in paths.extra_files:
        plan.file(option, location)
    plan.check()
    if checkpoint_dir is not None and overwrite and not resuming:
        check_checkpoints_proven(checkpoint_dir, checkpoint_option)
    if checkpoint_dir is not None:  # may be the --resume root: its own rules are check_checkpoint_root's
        check_not_nested(checkpoint_dir, checkpoint_option, paths.output, "--output")
        for option, location in [*paths.extra_outputs, *paths.extra_files]:
            if location:
                check_not_nested(checkpoint_dir, checkpoint_option, location, option)
        check_not_overlapping(checkpoint_dir, checkpoint_option,
                              {k: v for k, v in paths.inputs.items() if k != "--resume"})
        check_writable(checkpoint_dir, checkpoint_option, needed_bytes=3 * paths.model_bytes)
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return  # under torchrun/accelerate the job's rank 0 holds the locks and owns the checkpoint folder
    plan.lock(stack)
    if checkpoint_dir is not None:
        stack.enter_context(folder_lock(checkpoint_dir, checkpoint_option))
