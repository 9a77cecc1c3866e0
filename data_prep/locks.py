"""Exclusive holds on files and folders, which the kernel drops when the holder ends or is
killed: a second writer is refused at once, in one line.

:func:`held_alone` runs a block under a lock file (``filelock``), and removes the file at the
end, so that a finished command leaves no trace. :func:`hold_exclusively` holds a folder itself
(a run folder, which ``filelock`` cannot lock: it locks files it opens for writing) or a file,
for as long as the caller keeps the descriptor it returns."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from data_prep.atomic import file_mode
from data_prep.paths import OutputPathError

# Descriptors of the files and folders this process holds (hold_exclusively).
_HELD: set[int] = set()


def _let_go_in_child() -> None:
    # A forked process (a loader worker) shares each lock until it closes its copy, and outlives
    # a killed parent by about a second: the rerun that follows would be refused.
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


def hold_exclusively(path: Path) -> int | None:
    """Take an exclusive ``flock`` on the folder or file ``path`` (a file is made if missing):
    returns its descriptor, for :func:`let_go`, or None when another process holds it. The
    kernel drops the lock when the process ends, also when it is killed; processes forked
    while it is held let go of their copy at once.

    Raises:
        OSError: the file system cannot lock ``path`` (it names ``path``): NFS emulates
            ``flock`` with byte-range locks, and refuses an exclusive one on a descriptor not
            open for writing, as a folder's always is (EBADF); some mounts lock nothing.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY if path.is_dir() else os.O_RDWR | os.O_CREAT
    fd = os.open(path, flags, file_mode())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        raise OSError(exc.errno, f"cannot be locked ({exc.strerror})", str(path)) from None
    _HELD.add(fd)
    return fd


def let_go(fd: int) -> None:
    """Release a hold of :func:`hold_exclusively` (in a forked process: nothing left to do)."""
    if fd in _HELD:
        _HELD.discard(fd)
        os.close(fd)


@contextmanager
def held_alone(lock: Path, busy: str) -> Iterator[None]:
    """Run the block holding the lock file ``lock`` (made, then removed at the end), so that
    no other process runs such a block on the same ``lock`` meanwhile.

    Raises:
        OutputPathError: ``busy``, when another process holds ``lock``.
    """
    hold = FileLock(lock, timeout=0)
    try:
        hold.acquire()
    except Timeout:
        raise OutputPathError(busy) from None
    try:
        yield
    finally:
        try:
            # Removed before letting go: a process that opened this file meanwhile finds it
            # unlinked once it locks it (filelock checks), and the next one makes a new file.
            lock.unlink(missing_ok=True)
        finally:
            hold.release()
