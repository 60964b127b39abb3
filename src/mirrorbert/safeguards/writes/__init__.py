"""The write policy: every path any mirrorbert command writes goes through this package.

Everything is checked before a model or any data is loaded, so that a mistake costs a second, not a
finished run. The rules (also in docs/guide/training.md, "What mirrorbert will and will not write"):

* An output (model folder, checkpoint folder, .npy/JSON/Markdown file, report, plot folder, log
  folder, cache) may not be, contain or lie inside any input (`--model`, `--data`, `--data-dir`,
  `--corpus`, `--config`, `--resume`, ...), and may not be or contain the current or the home
  directory (a fresh subfolder of either, such as `./out`, is fine).
* Two outputs of one command are never the same path, nor one inside the other.
* An existing file or folder is replaced only with `--overwrite`; a folder only when mirrorbert can prove
  it wrote everything in it: its marker (`MARKER`, JSON) lists the files mirrorbert wrote with their size
  and SHA-256, and a folder holding any other file, a listed file whose content no longer matches, or one
  listed without a digest, is refused, naming the first one. A `step-N` checkpoint (or `best-model`)
  proves its files the same way through its manifest. A folder without a marker is never replaced: what
  a file says about itself is not proof.
* A link at an output's own name is never followed: without `--overwrite` it is refused like any
  existing file, with it the link itself is replaced (its target, even a missing one, is never written).
  Links among the folders above an output are resolved as usual. The folder an output is written in is
  opened at the start and must still be that folder at the final rename (a folder swapped for a link
  meanwhile is refused). A mount point is never replaced: a rename cannot replace it.
* Only a regular file or a folder is ever replaced: a device, FIFO or socket (or a link to one) is
  refused, with or without `--overwrite`; a folder is removed with `remove_tree`, which unlinks a
  symlink instead of following it (a symlinked `step-N` loses the link, never the target's files).
* One run at a time per output: an `fcntl.flock` on a lock file beside it, released by the kernel
  when the process ends (so a killed run never leaves a stale lock). The lock file is created with
  `O_CREAT|O_EXCL|O_NOFOLLOW`; a symlink or anything but a regular file at its path is refused, and an
  existing regular file there is locked read-only and never written, truncated or removed unless it
  is a lock record of mirrorbert's own (a run killed before it could remove it).
* Files and folders are written under a temporary name beside the target, created exclusively without
  following links (`mkstemp`/`mkdtemp`), and renamed into place; a temporary name that would pass the
  filesystem's name limit is shortened (a hash of the name), so any name the filesystem accepts works.
  The name carries its writer's owner record (pid, boot and start time: `make_temporary`), so the next
  writer of the same target removes what a killed run left there (`kill -9` runs no cleanup), and only
  that: this user's files and folders of that exact pattern whose writer is gone, never a link.
* A write that fails for want of space, quota, a writable filesystem or a name the filesystem accepts
  (`ENOSPC`, `EDQUOT`, `EROFS`, `ENAMETOOLONG`, ...), or because the path to it cannot hold a folder (a
  file or a missing link target in it, `/proc`), ends in one `UserError` line naming the output and
  what was missing; its temporaries are removed and what was there before is left as it was. A file
  written through a memory map is preallocated (`posix_fallocate`) first, so a full disk is that error,
  not a SIGBUS.
* What goes out of a model folder (push, its dry run) is regular files inside it only: a symlink,
  device, FIFO or socket there is refused, naming it (`mirrorbert.publish.hub` lists and copies it).

Modules, lowest first: `paths` (where an output is, the path rules), `failures` (a failed write as one line),
`removal` (remove without following a link), `temporaries` (temporaries and their owner
records, the atomic replace of a file), `markers` (proving a folder is mirrorbert's), `replaceable` (what may be
replaced), `atomic` (atomic writers of files and folders), `space` (writable, with room), `locks` (one run per
output), `plan` (one plan per command, `guard_run` per training run). Everything is importable from here.
"""

from __future__ import annotations

from mirrorbert.safeguards.writes.atomic import (atomic_output_dir, atomic_output_file, write_json_atomic,
                                                 write_text_atomic)
from mirrorbert.safeguards.writes.failures import WRITE_ERRNOS, preallocate, write_error, write_errors, write_failure
from mirrorbert.safeguards.writes.locks import LOCK_RECORD, folder_lock, lock_path
from mirrorbert.safeguards.writes.markers import (BEST_MODEL, MARKER, MARKER_FORMAT, RECORD_LIMIT, REPRODUCE_KIND,
                                                  RESUMABLE_CACHE, STEP_DIR, checkpoint_stray, claim_files,
                                                  discard_folder, foreign_file, mark_folder, proven, read_marker,
                                                  record_files)
from mirrorbert.safeguards.writes.paths import (NAME_MAX, OWN_TEMPORARY, Inputs, PathLike, check_append_folder,
                                                check_name_length, check_no_dangling_link, check_not_nested,
                                                check_not_overlapping, check_not_special, kind_of, locate, name_max,
                                                own_name, resolve)
from mirrorbert.safeguards.writes.plan import (RunPaths, WritePlan, check_checkpoints_proven, check_outputs_avoid,
                                               guard_run)
from mirrorbert.safeguards.writes.removal import remove_tree
from mirrorbert.safeguards.writes.replaceable import check_output_dir, check_replaceable, check_replaceable_file
from mirrorbert.safeguards.writes.space import check_writable, weights_size
from mirrorbert.safeguards.writes.temporaries import (FILE_MODE, FOLDER_MODE, OWNER_ROOM, boot_id, fix_folder_mode,
                                                      make_temporary, open_temporary, owner_gone, owner_record,
                                                      remove_stale_temporaries, replace_file, set_aside_name,
                                                      start_ticks)

__all__ = [
    "BEST_MODEL", "FILE_MODE", "FOLDER_MODE", "LOCK_RECORD", "MARKER", "MARKER_FORMAT", "NAME_MAX", "OWNER_ROOM",
    "OWN_TEMPORARY", "RECORD_LIMIT", "REPRODUCE_KIND", "RESUMABLE_CACHE", "STEP_DIR", "WRITE_ERRNOS", "Inputs",
    "PathLike", "RunPaths", "WritePlan", "atomic_output_dir", "atomic_output_file", "boot_id", "check_append_folder",
    "check_checkpoints_proven", "check_name_length", "check_no_dangling_link", "check_not_nested",
    "check_not_overlapping", "check_not_special", "check_output_dir", "check_outputs_avoid", "check_replaceable",
    "check_replaceable_file", "check_writable", "checkpoint_stray", "claim_files",
    "discard_folder", "fix_folder_mode", "folder_lock", "foreign_file", "guard_run", "kind_of", "locate",
    "lock_path", "make_temporary", "mark_folder", "name_max", "open_temporary", "own_name", "owner_gone",
    "owner_record", "preallocate", "proven", "read_marker", "record_files", "remove_stale_temporaries",
    "remove_tree", "replace_file", "resolve", "set_aside_name", "start_ticks", "weights_size",
    "write_error", "write_errors", "write_failure", "write_json_atomic", "write_text_atomic",
]
