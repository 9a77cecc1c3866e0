"""One-line reports of a command's failure on stderr, shared by the commands and the library
functions they call: ``prog: [context: ]message``, with the exit status, and the progress bars
and warnings that would break that line."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator


def report_error(prog: str, exc: BaseException, context: str = "", status: int = 2,
                 after: str = "") -> int:
    """Report ``exc`` as one line on stderr, ``prog: [context: ]message[ after]``, and return
    ``status``: 2 for a user error (missing or corrupt file, malformed data, bad setting), 1 for
    a failure of the work itself. With the environment variable CAPTIONER_DEBUG set (to
    anything but 0), re-raise ``exc`` instead, for its traceback.

    Call it from the ``except`` block that caught ``exc``. The message is folded onto one line
    (a YAML parser's spans several); a KeyError shows its text, not its repr; an error of the
    operating system names its path first (``runs/x: read-only file system``).
    """
    if os.environ.get("CAPTIONER_DEBUG", "0") not in ("", "0"):
        raise exc
    close_progress_bars()
    message = " ".join(str(_describe(exc)).split())
    print(f"{prog}: {context}{': ' if context else ''}{message}{' ' if after else ''}{after}",
          file=sys.stderr)
    return status


def close_progress_bars() -> None:
    """Close the progress bars the command left open where it stopped (Lightning leaves its
    epoch bar open when the fit raises), so that each ends its line and the error line starts
    its own: a bar ends without a newline, on stdout or stderr, and on a terminal the line
    would follow it. tqdm keeps every open bar, of its subclasses too, in ``_instances``."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    sys.stdout.flush()


# torch re-raises an error of a DataLoader worker process with the worker's traceback in its
# message, whose last line is the error itself ("ValueError: ...").
_WORKER_TRACEBACK = "\nOriginal Traceback (most recent call last):\n"


def _describe(exc: BaseException) -> object:
    if _WORKER_TRACEBACK in str(exc):
        last = str(exc).rstrip().rsplit("\n", 1)[-1]
        return last.split(": ", 1)[1] if last.startswith(f"{type(exc).__name__}: ") else last
    if isinstance(exc, KeyError) and exc.args:
        return exc.args[0]
    if isinstance(exc, OSError) and exc.strerror and str(exc).startswith("[Errno"):
        # Python's "[Errno 30] Read-only file system: 'runs/x'" is written for programmers;
        # the other lines name the file first.
        reason = exc.strerror[:1].lower() + exc.strerror[1:]
        if exc.filename is None:
            return reason
        where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        return f"{where}: {reason}"
    return exc


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Print each UserWarning raised inside as one line, ``warning: MESSAGE``, on stderr, once
    the block has run (rather than Python's ``file:line: UserWarning`` and source line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        yield
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
