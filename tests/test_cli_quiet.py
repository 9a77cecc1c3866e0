"""What the libraries say to their own developers stays off the user's terminal: Lightning's
advertisements of its cloud services and the deprecation warning its own use of torch raises,
both from the real library code, while Lightning's other messages are still shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A Trainer logs the litlogger tip when it sets up its loggers; Lightning's tree flattening
# makes a LeafSpec, which torch deprecates.
_LIGHTNING_AT_WORK = (
    "import lightning.pytorch as pl\n"
    "from lightning.pytorch.utilities._pytree import _tree_flatten\n"
    "pl.Trainer(accelerator='cpu', logger=False, enable_progress_bar=False,\n"
    "           enable_checkpointing=False)\n"
    "_tree_flatten(1.0)\n"
)


def _stderr_of(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300, check=True)
    return done.stderr


@pytest.mark.parametrize("quiet", [False, True], ids=["as-lightning-says", "as-captioner-says"])
def test_lightning_advertisements_and_torch_deprecations_are_not_shown(quiet):
    # Every warning shown once where it is raised, then the CLI's filters, as a command starts.
    setup = "import warnings\nwarnings.simplefilter('default')\n"
    if quiet:
        setup += "import captioner.cli\ncaptioner.cli._quiet_dependencies()\n"
    stderr = _stderr_of(setup + _LIGHTNING_AT_WORK)
    assert "GPU available:" in stderr  # Lightning's messages to the user are kept
    # Without the filters both appear: the test sees the libraries' real output.
    assert ("litlogger" in stderr) is not quiet
    assert ("LeafSpec" in stderr) is not quiet


def test_other_warnings_of_the_same_kind_are_still_shown():
    stderr = _stderr_of(
        "import warnings, captioner.cli\n"
        "warnings.simplefilter('default')\n"
        "captioner.cli._quiet_dependencies()\n"
        "warnings.warn('`isinstance(treespec, LeafSpec)` is deprecated', FutureWarning)\n"
        "warnings.warn('a future change', FutureWarning)\n"
    )
    # Raised here, not by Lightning: shown.
    assert "LeafSpec" in stderr
    assert "a future change" in stderr
