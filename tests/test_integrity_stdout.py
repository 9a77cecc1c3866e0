"""Standard output that cannot take the output (closed, on a full device, or of an encoding
without the characters): one line, never a traceback. The process boundary (file descriptor
1 as the shell hands it over) is what is tested, so each runs the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _runs(root, *, stdout, env=None, close_stdout=False):
    def close():
        os.close(1)

    return subprocess.run([sys.executable, "-m", "captioner.cli", "runs", "--root", str(root)],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
                          env={**os.environ, **(env or {})},
                          preexec_fn=close if close_stdout else None, check=False)


@pytest.fixture
def runs_root(tmp_path):
    (tmp_path / "café" / "version_0" / "checkpoints").mkdir(parents=True)
    return tmp_path


def test_stdout_on_a_full_device_is_one_line(runs_root):
    with open("/dev/full", "w") as full:
        done = _runs(runs_root, stdout=full)
    assert done.returncode == 1 and done.stderr == (
        "captioner runs: cannot write to standard output (No space left on device)\n")


def test_a_closed_stdout_is_one_line(runs_root):
    done = _runs(runs_root, stdout=None, close_stdout=True)
    assert done.returncode == 2 and done.stderr == (
        "captioner runs: standard output is closed; give the command one (> FILE or > "
        "/dev/null)\n")


def test_an_ascii_stdout_shows_what_it_cannot_hold_as_escapes(runs_root):
    done = _runs(runs_root, stdout=subprocess.PIPE, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
    assert "caf\\xe9 " in done.stdout
