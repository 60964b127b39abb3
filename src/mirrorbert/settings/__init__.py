"""The option vocabulary shared by every layer: allowed choices and defaults (`choices`), seed rules (`seeds`),
and config values checked against their dataclass field types (`typed`). Standard library only.
"""
