"""`python -m minipic_lite ...`: the `minipic-lite` command line (cli.py), without the console script."""

import sys

from minipic_lite.cli import main

sys.exit(main())
