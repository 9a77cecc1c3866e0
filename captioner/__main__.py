"""``python -m captioner COMMAND ...``: the console script, for environments without it on PATH."""

from captioner.cli import console

console()
