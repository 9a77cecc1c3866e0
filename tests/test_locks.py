"""data_prep.locks: the lock a command holds on its output (held_alone, through filelock) refuses
a second holder at once, never outlives a killed holder, is not kept by the holder's forked
children, and leaves no file behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from data_prep.locks import held_alone
from data_prep.paths import OutputPathError

# A process that holds the lock ``argv[1]``, forks a child that sleeps on (a loader worker)
# and waits to be killed. The child prints its process id: by then its at-fork handlers have
# run (a parent printing it could be killed before the child was ever scheduled, and the test
# would see the child's copy of the lock, which it has not yet had the chance to drop).
_HOLDER = """
import os, sys, time
from pathlib import Path
from data_prep.locks import held_alone
with held_alone(Path(sys.argv[1]), "busy"):
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
"""


def test_a_second_holder_is_refused_at_once_and_the_file_goes_at_the_end(tmp_path):
    lock = tmp_path / ".out.lock"
    with held_alone(lock, "another run holds it"):
        assert lock.is_file()
        started = time.monotonic()
        with pytest.raises(OutputPathError, match="^another run holds it$"):
            with held_alone(lock, "another run holds it"):
                pass
        assert time.monotonic() - started < 1
    assert not lock.exists()
    with held_alone(lock, "free again"):
        pass


@pytest.mark.subprocess
def test_a_killed_holder_never_blocks_even_while_its_forked_child_lives(tmp_path):
    lock = tmp_path / ".out.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock)],
                              stdout=subprocess.PIPE, text=True)
    child = int(holder.stdout.readline())
    try:
        with pytest.raises(OutputPathError):
            with held_alone(lock, "busy"):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        # The child forked while the lock was held lives on, and holds nothing.
        os.kill(child, 0)
        with held_alone(lock, "busy"):
            pass
    finally:
        os.kill(child, signal.SIGKILL)
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()
