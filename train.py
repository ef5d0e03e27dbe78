"""Command line: `python train.py --help`. The work is done in gptlite.cli;
gptlite_launch first applies --backend, before Keras is imported."""

import sys

from gptlite_launch import train

if __name__ == "__main__":
    sys.exit(train())
