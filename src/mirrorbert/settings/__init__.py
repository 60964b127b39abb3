"""The option vocabulary shared by every layer: allowed choices and defaults (`choices`), seed rules (`seeds`),
config values checked against their dataclass field types (`typed`), options declared once on their field
(`fields`), the wording several options share (`option_help`) and the run options every trainer shares
(`run_options`). Standard library only.
"""
