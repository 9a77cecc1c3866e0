"""Running the Java programs behind the coco-caption metrics (PTB tokenizer, METEOR, SPICE).

Every JVM is started through :func:`run_java` or :func:`start_java`, which ask the kernel to
kill it when the process that started it ends (``prctl(PR_SET_PDEATHSIG)``, Linux): a
``captioner score`` killed by the OOM killer or ``kill -9`` leaves no JVM of gigabytes running
on. Their work folders (:func:`java_work_folder`) carry the owner's process id, so that the
next run removes those of a killed one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class JavaToolError(RuntimeError):
    """A Java tool is missing, failed, or timed out; the message carries Java's stderr."""


def java_executable() -> str:
    """Path of ``java`` on PATH, or JavaToolError explaining how to get one."""
    java = shutil.which("java")
    if java is None:
        raise JavaToolError(
            "'java' was not found on PATH; the coco-caption metrics (PTB tokenizer, METEOR, "
            "SPICE) need a Java runtime, e.g. 'apt-get install openjdk-17-jre-headless'."
        )
    return java


@functools.cache
def _major_version(java: str) -> int:
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr)
    if proc.returncode != 0 or match is None:
        raise JavaToolError(
            f"could not read the Java version from '{java} -version':\n{proc.stderr}"
        )
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    return minor if major == 1 else major


def java_modules() -> frozenset[str] | None:
    """Names of the modules of the Java runtime on PATH, as ``java --list-modules`` lists them
    ("java.base@17.0.15" -> "java.base"); None when the runtime has no ``--list-modules``
    (Java 8 and older, which have no modules). Probed once per java executable: a runtime
    jlinked without a module lacks it whatever its version says."""
    return _list_modules(java_executable())


@functools.cache
def _list_modules(java: str) -> frozenset[str] | None:
    proc = subprocess.run([java, "--list-modules"], capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        return frozenset(line.split("@")[0].strip() for line in proc.stdout.splitlines() if line)
    version = _major_version(java)
    if version <= 8:
        return None
    raise JavaToolError(
        f"could not list the modules of Java {version} with '{java} --list-modules':\n"
        f"{_tail(proc.stderr)}"
    )


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _what_java_said(stderr: str) -> str:
    """The tail of Java's stderr under a heading, or a line saying it wrote nothing."""
    tail = _tail(stderr)
    return f"Java stderr (last lines):\n{tail}" if tail else "Java wrote nothing to stderr"


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess`` that has the kernel send SIGKILL to the child when
    this process ends, however it ends (``prctl(PR_SET_PDEATHSIG)``); None where the system
    has no such call (not Linux). The signal follows the thread that started the child: start
    it from the thread that waits for it."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def set_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent ended before the call: nothing would tell
            os._exit(1)

    return set_death_signal


def start_java(args: Sequence[str], *, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``java ARGS`` in ``cwd`` with pipes for stdin, stdout and stderr (bytes), to die
    with this process (:func:`dies_with_this_process`)."""
    return subprocess.Popen([java_executable(), *args], cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=dies_with_this_process())


def how_it_ended(returncode: int | None) -> str:
    """A process's end in words: "exit status 1", "killed by SIGKILL", "still running"."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


_WORK_PREFIX = "captioner-{tool}-{pid}-"


@contextmanager
def java_work_folder(tool: str) -> Iterator[Path]:
    """A temporary folder for the files of the Java tool ``tool`` ("ptb", "spice"), removed at
    the end; first the folders of this tool that processes which no longer run left behind
    (killed before they could remove theirs) are removed. Each name holds its owner's id."""
    root = Path(tempfile.gettempdir())
    for folder in root.glob(_WORK_PREFIX.format(tool=tool, pid="*") + "*"):
        pid = folder.name.removeprefix(f"captioner-{tool}-").split("-")[0]
        if pid.isdecimal() and _owned_by_us(folder) and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=_WORK_PREFIX.format(tool=tool, pid=os.getpid()),
                                     dir=root) as work:
        yield Path(work)


def _owned_by_us(path: Path) -> bool:
    try:
        return path.lstat().st_uid == os.getuid() and path.is_dir() and not path.is_symlink()
    except OSError:
        return False


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process of that id
    return True


def run_java(
    args: Sequence[str], *, tool: str, cwd: Path, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    """Run ``java ARGS`` in ``cwd`` and return the finished process (stdout/stderr as text);
    the JVM dies with this process (:func:`dies_with_this_process`).

    Raises JavaToolError naming ``tool`` with the tail of Java's stderr when the exit status
    is not 0, and when ``timeout`` seconds pass (the JVM is killed then)."""
    cmd = [java_executable(), *args]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, encoding="utf-8", timeout=timeout,
            preexec_fn=dies_with_this_process(),
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise JavaToolError(
            f"{tool} did not finish within {timeout:.0f} s and was stopped.\n"
            f"command: {' '.join(cmd)}\n{_what_java_said(stderr or '')}"
        ) from exc
    if proc.returncode != 0:
        raise JavaToolError(
            f"{tool} failed with exit status {proc.returncode}.\n"
            f"command: {' '.join(cmd)}\n{_what_java_said(proc.stderr)}"
        )
    return proc
