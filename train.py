"""Command line: `python train.py --help`. The work is done in gptlite.cli."""

import sys

from gptlite.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
