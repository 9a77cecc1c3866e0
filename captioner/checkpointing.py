"""Checkpoint files written atomically and read safely.

A checkpoint is first written to a temporary file in the destination folder, flushed to disk,
then renamed over the destination with :func:`os.replace` (atomic on POSIX and Windows within
one file system). An interrupted run therefore leaves either the previous checkpoint or the new
one, never a truncated file that a resume would choke on.

Loading uses ``torch.load(weights_only=True)``: our checkpoints hold only tensors and plain
Python containers (the vocabulary is stored as lists and strings), so no pickled code runs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to ``path`` through a temporary file in the same folder + ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(checkpoint, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def load_safely(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; a missing file names the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not a readable captioner checkpoint ({exc})") from exc


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO plugin: atomic writes, ``weights_only=True`` reads."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        save_atomically(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None):
        if weights_only is False:
            raise ValueError(
                f"{type(self).__name__} only loads checkpoints with weights_only=True"
            )
        return load_safely(path, map_location="cpu" if map_location is None else map_location)
