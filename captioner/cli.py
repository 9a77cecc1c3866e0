"""The ``captioner`` console script.

Every sub-command is a module registered under the ``captioner.commands`` entry-point group
(see ``pyproject.toml``) that defines ``HELP`` (a line, or a dict of lines by command name when
one module serves several commands) and ``main(argv: list[str]) -> int``.
Plugins keep the layering intact: commands that evaluate captions live in the ``eval``
package, which this module never imports by name. A command module is imported only when
it runs; ``captioner --help`` reads each ``HELP`` from the module's source, so that it starts
at once. A command module imports torch, Lightning and the like inside ``main``, after its
arguments are parsed, so that ``captioner COMMAND --help`` starts at once too.
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import errno
import importlib
import importlib.util
import logging
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path

from data_prep.disk_space import DISK_FULL
from data_prep.stop_signals import STOP_SIGNALS

# Errors of a path that no file can have: a name past the file system's limit, a file where a
# folder must be, a loop of links.
UNUSABLE_PATH = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP})

GROUP = "captioner.commands"
SIGPIPE_STATUS = 141  # 128 + SIGPIPE, as a shell reports a process that signal ended
SIGINT_STATUS = 130  # 128 + SIGINT


def _commands() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def _help_of(module_name: str) -> str | dict[str, str]:
    """The ``HELP`` of a command module: the literal its source assigns, read without running
    the module (which finds its parent packages but imports nothing else); the module's
    attribute, imported, where its source gives no literal."""
    spec = importlib.util.find_spec(module_name)
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        source = Path(spec.origin).read_text(encoding="utf-8")
        for statement in ast.parse(source, spec.origin).body:
            if (isinstance(statement, ast.Assign)
                    and any(isinstance(target, ast.Name) and target.id == "HELP"
                            for target in statement.targets)):
                with contextlib.suppress(ValueError):
                    return ast.literal_eval(statement.value)
    return importlib.import_module(module_name).HELP


def _usage(commands: dict[str, str]) -> str:
    lines = ["usage: captioner COMMAND [ARGS...]", "", "commands:"]
    for name in sorted(commands):
        try:
            help_text = _help_of(commands[name])
            if isinstance(help_text, dict):
                help_text = help_text[name]
        except Exception as exc:  # a broken plugin must not hide the others
            help_text = f"(unavailable: {exc})"
        lines.append(f"  {name:<18} {help_text}")
    lines += ["", "Run 'captioner COMMAND --help' for the options of a command."]
    return "\n".join(lines)


class _NoAdvertisements(logging.Filter):
    """Drops Lightning's tips that advertise its cloud services (litlogger, litmodels), logged
    at INFO at the start of every fit, validate and test, and of the encoder's pretraining."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip:")


_NO_ADVERTISEMENTS = _NoAdvertisements()
# Lightning logs its messages through lightning_utilities' rank_zero_info, under the logger of
# whichever of its two packages was imported last.
_LIGHTNING_INFO_LOGGERS = ("lightning.pytorch.utilities.rank_zero",
                           "lightning.fabric.utilities.rank_zero")


def _quiet_dependencies() -> None:
    """Keep what the libraries say to their own developers off the user's terminal, for every
    command: Lightning's advertisements, and deprecation warnings that Lightning's own use of
    torch raises, which no user can act on. Each is dropped by its message and where it comes
    from; every other warning and message is shown. Installed before a command is imported, so
    that it holds in every process the command starts (loader workers fork from it)."""
    for name in _LIGHTNING_INFO_LOGGERS:
        logging.getLogger(name).addFilter(_NO_ADVERTISEMENTS)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.")


_stop_came = False  # whether a Ctrl-C or stop signal came while the command runs


def _raise_keyboard_interrupt(signum, frame) -> None:
    global _stop_came
    _stop_came = True
    raise KeyboardInterrupt


def _unraisable(previous, unraisable) -> None:
    """``sys.unraisablehook`` while a command runs. A Ctrl-C or stop signal that lands while
    Python runs a finalizer (a loader's iterator ending its workers in ``__del__``, at every
    epoch's end) is swallowed there, with an "Exception ignored" traceback: it is raised again
    in the command. Once a stop has come, the finalizers of objects it left half made fail
    too (torch's iterator without its workers' status): a consequence of the stop, not
    reported. Anything else goes to the ``previous`` hook."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        # Sent again as a signal whose handler raises it (SIGINT is ignored in a background
        # job), from another thread a moment later: raised from here, inside the hook, it
        # would be swallowed again.
        number = next((number for number in STOP_SIGNALS
                       if callable(signal.getsignal(number))), None)
        if number is not None:
            again = threading.Timer(0.05, signal.pthread_kill,
                                    (threading.main_thread().ident, number))
            again.daemon = True
            again.start()
    elif not _stop_came:
        previous(unraisable)


@contextmanager
def _stopped_as_by_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while a command runs, so that they stop it
    as Ctrl-C does (finished records kept, half results removed, one line, status 130): by
    default they end the process at once, leaving half-written folders and temporary files.
    SIGINT gets the same handler, so that every stop is noted for :func:`_unraisable`, the
    ``sys.unraisablehook`` meanwhile. A signal ignored when the command starts stays ignored
    (``nohup``'s SIGHUP, a background job's SIGINT). Lightning's own SIGTERM handling is kept
    out of fits (``captioner.training.stops.KeepStopSignals``)."""
    global _stop_came
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stop_came = False
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    for number, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(number, _raise_keyboard_interrupt)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = partial(_unraisable, previous_hook)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for number, handler in previous.items():
            if handler is not None:  # None: set outside Python, left as it is
                signal.signal(number, handler)


def _allocation_refused(exc: BaseException) -> str | None:
    """What an allocation that failed asked for, when ``exc`` says one did: Python's
    MemoryError (its message, when it has one), torch's CPU allocator ("can't allocate memory:
    you tried to allocate N bytes") or torch.OutOfMemoryError on a GPU ("Tried to allocate
    20.00 GiB"). None for any other error."""
    text = str(exc)
    if isinstance(exc, MemoryError):  # one raised on purpose says what was asked
        asked = re.match(r"Unable to allocate ([\d.]+ [KMGTPE]?i?B)", text)  # numpy's
        return f"{asked.group(1)} asked at once" if asked else text or "an allocation failed"
    if type(exc).__name__ == "OutOfMemoryError" or "can't allocate memory" in text:
        asked = re.search(r"allocate (\d+) bytes", text)
        if asked:
            return f"{int(asked.group(1)) / 2**30:.2f} GiB asked at once"
        asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", text)
        return f"{asked.group(1)} asked at once" if asked else text.split(".")[0]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if not commands:
        print(
            "captioner: no commands are registered; install the package with "
            "'pip install -e .' so that its entry points exist.",
            file=sys.stderr,
        )
        return 2
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(commands))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        import difflib  # only for a name that is no command

        close = difflib.get_close_matches(name, commands, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(f"captioner: unknown command {name!r}; {hint}'captioner --help' lists them",
              file=sys.stderr)
        return 2
    problem = _environment_problem()
    if problem is not None:
        print(f"captioner {name}: {problem}", file=sys.stderr)
        return 2
    _prepare_stdout()
    _quiet_dependencies()
    module = importlib.import_module(commands[name])
    # LightningCLI commands need to know which sub-command they were called as.
    args = [name, *rest] if getattr(module, "NEEDS_COMMAND_NAME", False) else rest
    return _run(name, module, args)


def _environment_problem() -> str | None:
    """What keeps any command from starting, in one line, or None."""
    if any(key.startswith("CAPTIONER_TVMAX_") for key in os.environ):
        # TVmax's benchmark overrides (CAPTIONER_TVMAX_SOLVER, CAPTIONER_TVMAX_OVERLAP) are
        # read when its module is imported, inside a command's work; a bad value is the user's
        # error, so say so before any command starts, not in a traceback.
        try:
            importlib.import_module("captioner.attention.tvmax")
        except ValueError as exc:
            return str(exc)
    if sys.stdout is None:  # started with standard output closed (>&-)
        return "standard output is closed; give the command one (> FILE or > /dev/null)"
    return None


def _prepare_stdout() -> None:
    if hasattr(sys.stdout, "reconfigure"):
        # A file name of bytes that are not UTF-8 reaches Python as surrogate escapes: printed
        # as the bytes it is (as ls prints it), not a UnicodeEncodeError once the work is done.
        # Another encoding (PYTHONIOENCODING=ascii, a C locale) shows what it cannot hold as
        # escapes, rather than failing on the first caption that holds it.
        utf8 = codecs.lookup(sys.stdout.encoding).name == "utf-8"
        sys.stdout.reconfigure(errors="surrogateescape" if utf8 else "backslashreplace")


def _run(name: str, module, args: list[str]) -> int:
    """The command's ``main(args)``, with the failures it does not report itself as one line
    and the exit status a shell expects."""
    try:
        with _stopped_as_by_ctrl_c():
            code = int(module.main(args) or 0)
            sys.stdout.flush()
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM, SIGHUP) in a command that does not say more itself (caption,
        # prepare-features and fit say what they kept): one line, not a traceback, and the
        # status a shell gives a process that SIGINT ended.
        from captioner.reporting import close_progress_bars

        close_progress_bars()  # so that the line starts a line of its own
        print(f"captioner {name}: interrupted", file=sys.stderr)
        return SIGINT_STATUS
    except (MemoryError, RuntimeError) as exc:
        asked = _allocation_refused(exc)
        if asked is None:
            raise
        # One line, as for any failure the user can act on: the settings of the command or
        # of its checkpoint (a beam of 10^9) asked for more memory than the device has.
        print(f"captioner {name}: out of memory ({asked}); a smaller batch size, beam size or "
              "image size needs less", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader of the output has gone (`captioner caption ... | head`): stop quietly, as
        # command-line tools do, with the status of a process ended by SIGPIPE. Python would
        # otherwise print a traceback, and again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_STATUS
    except OSError as exc:
        status = _os_error_status(name, exc)
        if status is None:
            raise
        return status
    return code


def _os_error_status(name: str, exc: OSError) -> int | None:
    """The status of a command ended by ``exc`` once it is said in one line, or None for an
    error that is not the user's to act on (its traceback is kept)."""
    if exc.filename is not None and (exc.errno in DISK_FULL or exc.errno in UNUSABLE_PATH):
        # A file the command names, with an error it did not report itself: a full disk (or
        # ulimit -f) under a file it writes, naming the folder and what was kept (disk_full),
        # or a path given that no file can have (status 2: the user's to change, as the
        # commands' own checks of their paths say).
        from captioner.reporting import report_error

        return report_error(f"captioner {name}", exc,
                            status=2 if exc.errno in UNUSABLE_PATH else 1)
    if exc.errno not in DISK_FULL:
        return None
    # Standard output on a full device (> /dev/full): the commands name every file they
    # write, so a write error without a file name is one of standard output's.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush
    print(f"captioner {name}: cannot write to standard output ({os.strerror(exc.errno)})",
          file=sys.stderr)
    return 1


def console() -> None:
    """The console script and ``python -m captioner``: :func:`main`, then exit with its status.
    Once a command has returned its work is done (and said), so a Ctrl-C while Python shuts
    down, running the exit handlers of torch and Lightning, is ignored: it ended a finished
    command with status 130 and no line, or with a traceback from an exit handler."""
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    console()
