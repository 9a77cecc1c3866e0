"""Running Triton kernels on the CPU in CI: Triton chooses its interpreter when it is imported,
so a test runs its kernels in a child process with ``TRITON_INTERPRET=1``; the child prints its
results as JSON on its last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_interpreted(source: str, *args: str) -> dict:
    """The JSON that the Python ``source``, run with ``args`` under Triton's interpreter, prints
    last; fails the test with the child's error output if it fails."""
    child = subprocess.run(
        [sys.executable, "-c", source, *args],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=900,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.splitlines()[-1])
