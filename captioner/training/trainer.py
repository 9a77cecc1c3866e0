"""Lightning's Trainer as ``captioner fit|validate|test`` run it: SIGTERM stops a run as
Ctrl-C does (:class:`~captioner.training.stops.KeepStopSignals`), the help of ``--ckpt_path``
says what it takes here, and the warnings Lightning gives of what captioner does on purpose
are not shown (each with its reason).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from lightning.pytorch import Trainer as LightningTrainer

from captioner.training.stops import KeepStopSignals


class Trainer(LightningTrainer):
    """Lightning's Trainer, whose signals are handled by
    :class:`~captioner.training.stops.KeepStopSignals` (SIGTERM stops a run as Ctrl-C does)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # Added here, not through the callbacks argument, which stays Lightning's own option
        # (--trainer.callbacks) of the parser that reads this signature.
        self.callbacks.append(KeepStopSignals())

    # fit, validate and test as Lightning's, their docstrings saying what --ckpt_path takes
    # here (the CLI's help for each sub-command is read from them).
    def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None,
            ckpt_path: str | Path | None = None, weights_only: bool | None = None) -> None:
        """Train the model.

        Args:
            ckpt_path: resume: 'last' (the newest runs/NAME/version_N with a last.ckpt, or
                the run whose config.yaml is --config, continued in its folder; without a
                logger, of ./checkpoints or --checkpoint.dirpath) or a checkpoint file.
            weights_only: as Lightning's Trainer.fit (captioner reads tensors only).
        """
        super().fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path,
                    weights_only)

    def validate(self, model=None, dataloaders=None, ckpt_path: str | Path | None = None,
                 verbose: bool = True, datamodule=None, weights_only: bool | None = None):
        """Score a checkpoint on the validation split.

        Args:
            ckpt_path: 'best' or 'last' of the newest runs/NAME/version_N (or of the run
                whose config.yaml is --config; without a logger, of ./checkpoints or
                --checkpoint.dirpath), or a checkpoint file.
            verbose: print the scores.
            weights_only: as Lightning's Trainer.validate (captioner reads tensors only).
        """
        return super().validate(model, dataloaders, ckpt_path, verbose, datamodule,
                                weights_only)

    def test(self, model=None, dataloaders=None, ckpt_path: str | Path | None = None,
             verbose: bool = True, datamodule=None, weights_only: bool | None = None):
        """Score a checkpoint on the test split.

        Args:
            ckpt_path: 'best' or 'last' of the newest runs/NAME/version_N (or of the run
                whose config.yaml is --config; without a logger, of ./checkpoints or
                --checkpoint.dirpath), or a checkpoint file.
            verbose: print the scores.
            weights_only: as Lightning's Trainer.test (captioner reads tensors only).
        """
        return super().test(model, dataloaders, ckpt_path, verbose, datamodule, weights_only)


for _message in (
    # The frozen encoder stays in eval mode on purpose (fixed batch-norm statistics, as in the
    # paper); Lightning warns about it at the start of every fit.
    r"Found \d+ module\(s\) in eval mode",
    # The demo hands its own arguments to the CLI on purpose.
    r"LightningCLI's args parameter is intended to run from within Python",
    # A resume holds the earlier metrics.csv back first (hold_metrics_for_resume): nothing is lost.
    r"Experiment logs directory .* exists and is not empty",
    # A resume writes into its own checkpoints, as it should; a new fit into a folder of
    # checkpoints is refused before this.
    r"Checkpoint directory .* exists and is not empty",
    # The monitor is checked against the metrics the model logs before a fit (_check_monitor),
    # and Lightning raises where validation has run: this warning only says that a fit that
    # max_steps or max_time stopped before its first validation has no score to pick a best
    # checkpoint by, and none is due.
    r"`ModelCheckpoint\(monitor=.*\)` could not find the monitored key",
    # validate/test on several devices: the DistributedSampler repeats a few images to even
    # out the batches, but the captions are gathered by image id (CaptioningModule._gather),
    # so each image counts once and the metrics equal one device's.
    r"Using `DistributedSampler` with the dataloaders. During `trainer\.(validate|test)\(\)`",
    # On a small dataset: Lightning counts log_every_n_steps in steps of the whole fit, not of
    # an epoch, so train/loss is still logged every N steps; the scores, every epoch.
    r"The number of training batches \(\d+\) is smaller than the logging interval",
):
    warnings.filterwarnings("ignore", message=_message)
