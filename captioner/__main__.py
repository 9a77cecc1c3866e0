"""``python -m captioner COMMAND ...``: the console script, for environments without it on PATH."""

import sys

from captioner.cli import main

sys.exit(main())
