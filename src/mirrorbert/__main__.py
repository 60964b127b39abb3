"""`python -m mirrorbert ...` is the `mirrorbert` command (what `torchrun ... -m mirrorbert train` runs)."""

import sys

from mirrorbert.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
