"""The write policy: every path any mirrorbert command writes goes through this package, checked before a model
or any data is loaded. The rules are in docs/guide/training.md ("What mirrorbert will and will not write") and
docs/guide/security.md.

Modules, lowest first: `paths` (where an output is, the path rules), `held` (signals held across a write's two
states), `failures` (what failed, decided by what happened; a failed write as one line), `temporaries`
(temporaries and their owner records, the atomic replace of a file, removal without following a link),
`markers` (proving a folder is mirrorbert's), `locks` (one run per output), `plan` (one plan per command: what
may be replaced, room to write, `guard_run` per training run), `atomic` (atomic writers of files and folders).
This package exports what other packages use; the rest is imported from its module.
"""

from __future__ import annotations

from mirrorbert.safeguards.writes.atomic import (atomic_output_dir, atomic_output_file, library_path,
                                                 write_json_atomic, write_text_atomic)
from mirrorbert.safeguards.writes.failures import WRITE_ERRNOS, preallocate, write_error, write_errors
from mirrorbert.safeguards.writes.markers import (MARKER, REPRODUCE_KIND, checkpoint_stray, claim_files,
                                                  discard_folder, mark_folder, read_marker, record_files)
from mirrorbert.safeguards.writes.plan import RunPaths, WritePlan, check_outputs_avoid, guard_run, weights_size
from mirrorbert.safeguards.writes.temporaries import (fix_folder_mode, make_temporary, open_temporary, remove_tree,
                                                      replace_file)

__all__ = [
    "MARKER", "REPRODUCE_KIND", "RunPaths", "WRITE_ERRNOS", "WritePlan", "atomic_output_dir", "atomic_output_file",
    "check_outputs_avoid", "checkpoint_stray", "claim_files", "discard_folder", "fix_folder_mode", "guard_run",
    "library_path", "make_temporary", "mark_folder", "open_temporary", "preallocate", "read_marker", "record_files",
    "remove_tree", "replace_file", "weights_size", "write_error", "write_errors", "write_json_atomic",
    "write_text_atomic",
]
