"""`python -m mirrorbert` runs the same command line as the `mirrorbert` script."""

import sys

from mirrorbert.cli import main

sys.exit(main())
