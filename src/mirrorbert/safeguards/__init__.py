"""The trust boundary: every file mirrorbert did not just write is read here, and every write goes through here.

Modules: `writes` (a package: the one write policy), `readback` (regular files only, bounded size and JSON
nesting, checksums; what fails a check is set aside, never deleted), `confined` (the reader of a stranger's
folder), `model_files` (a model folder checked through it, once), `snapshot` (the private folder libraries are
handed), `preflight` (cheap checks of names and values). Models come in at `encoder.source.open_model`, above.
"""
