"""The write policy: every path any mirrorbert command writes goes through here, checked before any work
(rules: docs/guide/training.md, docs/guide/security.md). Modules, lowest first: `paths` (the path rules), `held`,
`failures` (a failed write as one line), `temporaries`, `markers` (proving a folder is mirrorbert's), `locks`,
`plan` (one plan per command, `guard_run` per training run), `atomic` (atomic writers of files and folders).
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
