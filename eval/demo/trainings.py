"""The record of the captioners a demo run has finished training, ``OUT/trainings.json``.

A demo run stopped before its results (Ctrl-C, a crash) loses no finished training: run again
into the same folder, it reuses every captioner whose training is recorded with the same
resolved config (the YAML that ``captioner fit`` saves as the run's ``config.yaml``, includes
and command-line options applied) and the same encoder weights (SHA-256 of the file), and
trains only the others.

Format: ``{"trainings": [{"config": YAML text, "encoder_sha256": hex, "checkpoint": path of
the best checkpoint, "val_CIDEr": float}, ...]}``, rewritten atomically after each training.
Paths inside the folder are written relative to it (``<OUT>/`` in the config), so that a
folder moved or copied elsewhere goes on as well.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from data_prep.atomic import write_json
from data_prep.settings_files import parse_json

FILE_NAME = "trainings.json"


@dataclass(frozen=True)
class Training:
    """One finished training: what it trained (``config``, ``encoder_sha256``), its best
    checkpoint and that checkpoint's val/CIDEr."""

    config: str
    encoder_sha256: str
    checkpoint: str
    val_CIDEr: float


class TrainingRecord:
    """The finished trainings of the demo run in ``out`` (:data:`FILE_NAME`).

    Raises (on construction):
        ValueError: the file exists but is not such a record (it names the file and the
            entry); ``--overwrite`` starts the run over without it.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out / FILE_NAME
        self.trainings = _read(self.path)

    def find(self, config: str, encoder_sha256: str) -> Training | None:
        """The latest finished training of ``config`` with that encoder whose checkpoint is
        still there, or None."""
        config = self._portable(config)
        for training in reversed(self.trainings):
            checkpoint = self.out / training.checkpoint  # recorded relative to the folder
            if ((self._portable(training.config), training.encoder_sha256)
                    == (config, encoder_sha256) and checkpoint.is_file()):
                return replace(training, config=config, checkpoint=str(checkpoint))
        return None

    def add(self, training: Training) -> None:
        """Record a finished training (the file is rewritten at once)."""
        checkpoint = Path(training.checkpoint)
        if checkpoint.is_relative_to(self.out):
            checkpoint = checkpoint.relative_to(self.out)
        self.trainings.append(replace(training, config=self._portable(training.config),
                                      checkpoint=str(checkpoint)))
        write_json(self.path, {"trainings": [asdict(t) for t in self.trainings]})

    def _portable(self, config: str) -> str:
        """``config`` with this folder's paths written as ``<OUT>/...``."""
        return config.replace(f"{self.out}{os.sep}", f"{_OUT}{os.sep}")


_OUT = "<OUT>"  # the demo's folder, in a recorded config


def _read(path: Path) -> list[Training]:
    if not path.exists():
        return []

    def damaged(why: str) -> ValueError:
        return ValueError(f"{path}: is not the demo's record of finished trainings ({why}); "
                          "pass --overwrite to start the run over")

    try:
        document = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise damaged(str(exc)) from None
    entries = document.get("trainings") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise damaged("no list 'trainings'")
    trainings = []
    for index, entry in enumerate(entries):
        try:
            training = Training(**entry)
        except TypeError:
            training = None
        if training is None or not _well_typed(training):
            raise damaged(f"entry {index} is not {{config, encoder_sha256, checkpoint, "
                          "val_CIDEr}")
        trainings.append(training)
    return trainings


def _well_typed(training: Training) -> bool:
    texts = (training.config, training.encoder_sha256, training.checkpoint)
    score = training.val_CIDEr
    return (all(isinstance(text, str) for text in texts)
            and isinstance(score, int | float) and not isinstance(score, bool)
            and math.isfinite(score))
