"""How a Lightning run stopped by Ctrl-C (or by SIGTERM / SIGHUP, which ``captioner.cli``
turns into Ctrl-C) ends in captioner's commands: as :class:`KeyboardInterrupt`
(:func:`data_prep.stop_signals.stops_as_keyboard_interrupt`, :class:`Interrupted` of the CLI),
which each command answers with its one line and status 130; and how a DDP run ends whose process
started here is lost (:class:`TellLostProcesses`). Lightning's own SIGTERM handler is left
out of the runs (:class:`KeepStopSignals`).

Lightning catches the KeyboardInterrupt of a running fit, shuts the run down and then calls
``exit(1)``: a command would end with status 1 and no line of its own. Its note on the stop
("Detected KeyboardInterrupt, attempting graceful shutdown ...") is not printed either: the
command's line says what was kept and how to go on.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import Callback

_LIGHTNING_NOTE = "Detected KeyboardInterrupt, attempting graceful shutdown"


class _NoStopNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _LIGHTNING_NOTE not in str(record.msg)


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoStopNote())


class KeepStopSignals(Callback):
    """Keeps SIGTERM what the command made it, a Ctrl-C (``captioner.cli``), in every run.

    Lightning's own SIGTERM handler, set once a run's modules are restored, broadcasts a
    tensor from the first process inside the handler: a collective that can wait for ever
    while another process is in another one (DDP's all-reduce in backward). The first hook of
    each stage puts the command's handler back; Lightning's teardown restores it too."""

    def __init__(self) -> None:
        self._kept = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if threading.current_thread() is threading.main_thread():
            self._kept = signal.getsignal(signal.SIGTERM)

    def _put_back(self, *_) -> None:
        # Signals are set from the main thread alone; None: a handler set outside Python.
        if threading.current_thread() is threading.main_thread() and self._kept is not None:
            signal.signal(signal.SIGTERM, self._kept)

    on_sanity_check_start = on_train_start = on_validation_start = _put_back
    on_test_start = on_predict_start = _put_back


class TellLostProcesses(Callback):
    """Tells ``tell`` of a process that Lightning's DDP launcher started here and that ends
    with an error (killed, out of memory), as "local rank R, pid P, was killed by SIGKILL",
    once the other started processes are stopped; ``tell`` should end this process.

    Lightning's own observer of those processes polls them every few seconds and, at the
    first that failed, sends SIGKILL to the others and to this process: status 137 and no
    line, unless a collective here failed first (it may wait for the lost process instead).
    A thread here waits on each process and tells at once. Not during a stop of this process
    (Ctrl-C to the whole group): that ends as a stop.
    """

    def __init__(self, tell: Callable[[str], None]) -> None:
        self.tell = tell

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # The launcher has started the other processes by now (this is the first process).
        processes = list(getattr(getattr(trainer.strategy, "launcher", None), "procs", []))
        for rank, process in enumerate(processes, 1):
            threading.Thread(target=self._watch, args=(trainer, rank, process, processes),
                             daemon=True).start()

    def _watch(self, trainer: L.Trainer, rank: int, process, processes: list) -> None:
        returncode = process.wait()
        if returncode == 0 or trainer.interrupted:
            return
        for other in processes:
            if other.poll() is None:
                other.kill()
        self.tell(f"local rank {rank}, pid {process.pid}, {_how_it_ended(returncode)}")


def _how_it_ended(returncode: int) -> str:
    """'was killed by SIGKILL' for a Popen return code of -9, 'exited with status 1' for 1."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"
