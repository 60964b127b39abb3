"""The option vocabulary: allowed choices (`choices`), options declared on their field (`fields`), the wording
several share (`option_help`), typed config values (`typed`), the one check and the `Options` base of every
command's options (`validation`), the run options every trainer shares (`run_options`). Standard library only."""
