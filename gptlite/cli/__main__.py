"""`python -m gptlite.cli COMMAND ...`: the `gptlite` command."""

import sys

from gptlite.cli import main

sys.exit(main())
