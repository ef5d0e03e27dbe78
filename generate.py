"""Command line: `python generate.py --help`. The work is done in gptlite.cli."""

import sys

from gptlite.cli import generate_main

if __name__ == "__main__":
    sys.exit(generate_main())
