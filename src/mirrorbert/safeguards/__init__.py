"""The trust boundary: every file mirrorbert did not just write is read here, and every write goes through here.

Modules: `writes` (a package: the one write policy, path rules, markers, locks, atomic files and folders, links
and devices never followed or replaced), `readback` (regular files only, bounded size and JSON nesting,
checksums; what fails a check is set aside, never deleted), `confined` (the reader of a stranger's folder),
`model_folder` (a model folder checked through it), `model_loading` (the one place configs, tokenizers and
weights are loaded: no code from files), `preflight` (cheap checks of a model folder before its weights load).
"""
