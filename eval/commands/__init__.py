"""Sub-commands of the ``captioner`` console script that need the evaluation layer."""
