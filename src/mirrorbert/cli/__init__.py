"""The commands: `main` parses the command line, one module per command, every shared option defined once in `options`.

Nothing below this package imports it: commands call the methods and the library, never the other way.
"""


def main(argv=None):
    """`mirrorbert ...` (the console script and `python -m mirrorbert`)."""
    from mirrorbert.cli.app import main as run

    return run(argv)
