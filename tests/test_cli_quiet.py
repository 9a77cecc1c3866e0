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


def test_a_fit_of_fewer_batches_than_the_logging_interval_is_not_warned_of(tmp_path):
    # Lightning counts log_every_n_steps over the whole fit (train/loss is still logged every N
    # steps); its warning that an epoch has fewer batches is only noise on a small dataset.
    fit = (
        "import torch, lightning.pytorch as pl\n"
        "class Tiny(pl.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(2, 1)\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return self.layer(batch).sum()\n"
        "    def train_dataloader(self):\n"
        "        return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=0.1)\n"
        "pl.Trainer(accelerator='cpu', max_epochs=1, log_every_n_steps=10,\n"
        "           default_root_dir={root!r}, enable_progress_bar=False,\n"
        "           enable_checkpointing=False, enable_model_summary=False).fit(Tiny())\n"
    )
    fit = fit.format(root=str(tmp_path))
    as_lightning_says = _stderr_of(fit)
    as_captioner_says = _stderr_of("import captioner.training.cli\n" + fit)
    message = "is smaller than the logging interval"
    assert message in as_lightning_says  # the test sees Lightning's real warning
    assert message not in as_captioner_says
    assert "max_epochs=1` reached" in as_captioner_says  # Lightning's other lines are kept
