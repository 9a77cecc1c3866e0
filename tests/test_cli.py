"""The ``captioner`` console script: its command list, unknown commands, a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys

from captioner.cli import SIGPIPE_STATUS, main


def test_help_lists_the_commands_and_unknown_ones_are_refused(capsys):
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert "caption " in listed and "fit " in listed and "demo " in listed
    assert main(["nosuch"]) == 2
    assert "unknown command 'nosuch'" in capsys.readouterr().err


def test_a_reader_that_has_gone_ends_the_command_quietly(tmp_path):
    # `captioner runs | head -1`: the reading end is closed before the command writes.
    (tmp_path / "runs" / "a" / "version_0").mkdir(parents=True)
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "captioner.cli", "runs", "--root",
                              str(tmp_path / "runs")], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(write)
    assert run.returncode == SIGPIPE_STATUS, run.stderr
    assert run.stderr == ""
