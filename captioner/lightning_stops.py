"""How a Lightning run stopped by Ctrl-C (or by SIGTERM / SIGHUP, which ``captioner.cli``
turns into Ctrl-C) ends in captioner's commands: as :class:`KeyboardInterrupt`, which each
command answers with its one line and status 130.

Lightning catches the KeyboardInterrupt of a running fit, shuts the run down and then calls
``exit(1)``: a command would end with status 1 and no line of its own. Its notes on the stop
("Detected KeyboardInterrupt, attempting graceful shutdown ...", "Received SIGTERM") are not
printed either: the command's line says what was kept and how to go on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L

_LIGHTNING_NOTES = ("Detected KeyboardInterrupt, attempting graceful shutdown",
                    "Received SIGTERM")


class _NoStopNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(note in str(record.msg) for note in _LIGHTNING_NOTES)


for _logger in ("lightning.pytorch.utilities.rank_zero",
                "lightning.pytorch.trainer.connectors.signal_connector"):
    logging.getLogger(_logger).addFilter(_NoStopNotes())


@contextmanager
def stops_as_keyboard_interrupt(trainer: L.Trainer) -> Iterator[None]:
    """Inside, a run of ``trainer`` (fit, validate, test) that Lightning ends with ``exit(1)``
    after a Ctrl-C raises KeyboardInterrupt instead; any other exit goes on as it was."""
    try:
        yield
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
