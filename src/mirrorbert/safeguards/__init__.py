"""The trust boundary: every file mirrorbert did not just write is read here, and every write goes through here.

Modules: `writes` (a package: the one write policy, path rules, markers, locks, atomic files and folders, links
and devices never followed or replaced), `readback` (regular files only, bounded size and JSON nesting,
checksums; what fails a check is set aside, never deleted), `confined` (the reader of a stranger's folder,
relative to its descriptor), `model_files` (a model folder checked file by file through it, once), `snapshot`
(the private folder of checked files that libraries are handed), `preflight` (cheap checks of names and values).
Where a model comes in is `mirrorbert.encoder.source.open_model`, above these.
"""
