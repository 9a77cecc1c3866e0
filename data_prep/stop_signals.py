"""The signals that stop a command, held while writes that must all happen or none run."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The signals that stop a command: Ctrl-C, and those that captioner.cli turns into Ctrl-C
# (`kill`, `timeout`, a closed terminal).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stops_held() -> Iterator[None]:
    """Hold the stop signals (Ctrl-C, SIGTERM, SIGHUP) that arrive inside the block and deliver
    them once it has ended: writes that must all happen or none (a result and its key, renames
    that replace an earlier result, torch.save's zip writer, which turns a KeyboardInterrupt
    into a RuntimeError) are not cut midway (kill -9 still can). Signal handlers belong to the
    main thread; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # A handler installed outside Python (getsignal gives None) cannot be put back: not held.
    held = [number for number in STOP_SIGNALS if signal.getsignal(number) is not None]
    previous = {number: signal.signal(number, lambda signum, frame: received.append(signum))
                for number in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)


@contextmanager
def stops_as_keyboard_interrupt(trainer) -> Iterator[None]:
    """Inside, a run of a Lightning ``trainer`` (fit, validate, test) that Lightning ends with
    ``exit(1)`` after a Ctrl-C (its graceful shutdown) raises KeyboardInterrupt instead, which
    each command answers with its one line and status 130; any other exit goes on as it was."""
    try:
        yield
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
