"""Sub-commands of the ``captioner`` console script (one module each; see ``captioner.cli``)."""
