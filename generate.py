"""Command line: `python generate.py --help`. The work is done in gptlite.cli;
gptlite_launch first applies --backend, before Keras is imported."""

import sys

from gptlite_launch import generate

if __name__ == "__main__":
    sys.exit(generate())
