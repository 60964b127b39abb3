"""The commands: `main` parses the command line, one module per command, every shared option defined once in `options`,
a trainer's flags made from its config's fields in `field_options`.

Nothing below this package imports it: commands call the methods and the library, never the other way.
"""


def main(argv=None):
    """`mirrorbert ...` (the console script and `python -m mirrorbert`)."""
    from mirrorbert.cli.app import main as run

    return run(argv)
