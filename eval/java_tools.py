"""Running the Java programs behind the coco-caption metrics (PTB tokenizer, SPICE)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Sequence
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


def java_major_version() -> int:
    """Feature version of the Java runtime on PATH (8 for 1.8.0_x, 17 for 17.0.x)."""
    return _major_version(java_executable())


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


def run_java(
    args: Sequence[str], *, tool: str, cwd: Path, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    """Run ``java ARGS`` in ``cwd`` and return the finished process (stdout/stderr as text).

    Raises JavaToolError naming ``tool`` with the tail of Java's stderr when the exit status
    is not 0, and when ``timeout`` seconds pass (the JVM is killed then)."""
    cmd = [java_executable(), *args]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, encoding="utf-8", timeout=timeout
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
