"""Checkpoints that refer to a frozen encoder instead of holding a copy of it.

A frozen ResNet is fixed by the weights it was built from: a checkpoint that repeats it (170 MB
of a paper-config checkpoint's 249 MB) holds nothing that file does not. So a captioner
checkpoint of a frozen encoder keeps, in place of the encoder's tensors, an entry naming its
weights (an absolute file path, or torchvision's weights name) and the SHA-256 of their bytes;
whoever loads it builds the encoder from those weights, checks the hash and puts the tensors
back before the strict load. ``captioner export`` writes a self-contained copy for sharing.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from torch import nn

from captioner.checkpointing import CheckpointError

ENCODER_KEY = "frozen_encoder"
# The encoder's keys in a CaptioningModule's state_dict.
ENCODER_PREFIX = "model.encoder."
_SHA256 = re.compile(r"[0-9a-f]{64}")


def leave_out_encoder(checkpoint: MutableMapping[str, Any], encoder: nn.Module) -> None:
    """Drop a frozen ``encoder``'s tensors from ``checkpoint["state_dict"]`` and record its
    weights under :data:`ENCODER_KEY`; a trained or randomly initialized encoder (nothing to
    refer to) stays in."""
    if encoder.trainable or encoder.weights_sha256 is None:
        return
    checkpoint["state_dict"] = {key: value for key, value in checkpoint["state_dict"].items()
                                if not key.startswith(ENCODER_PREFIX)}
    checkpoint[ENCODER_KEY] = {"weights": encoder.weights_source,
                               "sha256": encoder.weights_sha256}


def recorded_weights(checkpoint: MutableMapping[str, Any], path: str | Path) -> str | None:
    """The weights (a file path or torchvision name) whose encoder ``checkpoint`` (read from
    ``path``) left out, or None when it holds its encoder; a malformed entry (the file is
    untrusted) raises CheckpointError naming ``path``."""
    entry = checkpoint.get(ENCODER_KEY)
    if entry is None:
        return None
    if not (isinstance(entry, dict) and isinstance(entry.get("weights"), str)
            and isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
        raise CheckpointError(
            f"{path}: entry {ENCODER_KEY!r} does not name encoder weights and their SHA-256")
    return entry["weights"]


def missing_weights_problem(checkpoint: MutableMapping[str, Any], path: str | Path) -> str | None:
    """Why the encoder that ``checkpoint`` refers to cannot be built here (its weights file is
    gone), in one line, or None."""
    weights = recorded_weights(checkpoint, path)
    if weights is None or "/" not in weights or Path(weights).is_file():
        return None
    return (f"{path}: its frozen encoder is not inside it but in {weights}, which does not "
            "exist; put that file back, or make a self-contained copy with 'captioner export' "
            "where it exists")


def put_back_encoder(checkpoint: MutableMapping[str, Any], encoder: nn.Module,
                     path: str | Path) -> None:
    """Put ``encoder``'s tensors into ``checkpoint["state_dict"]`` where the checkpoint (read
    from ``path``) left them out, once ``encoder`` is checked to be built from the very weights
    it names (same SHA-256); nothing to do for a checkpoint that holds its encoder."""
    weights = recorded_weights(checkpoint, path)
    if weights is None:
        return
    recorded = checkpoint[ENCODER_KEY]["sha256"]
    if encoder.weights_sha256 != recorded:
        built = (f"weights with SHA-256 {encoder.weights_sha256[:12]}..."
                 if encoder.weights_sha256 else "no weights")
        raise CheckpointError(
            f"{path}: its frozen encoder is {weights} with SHA-256 {recorded[:12]}..., but the "
            f"encoder here was built from {built}: the file changed since training, or another "
            "file was given; give the weights it was trained with")
    state = {f"{ENCODER_PREFIX}{key}": value for key, value in encoder.state_dict().items()}
    checkpoint["state_dict"] = {**checkpoint["state_dict"], **state}
    del checkpoint[ENCODER_KEY]


def export_self_contained(checkpoint_path: str | Path, out: str | Path) -> bool:
    """Write to ``out`` the checkpoint at ``checkpoint_path`` with its frozen encoder's tensors
    inside (built from the weights it names, their SHA-256 checked), for sharing: a file that
    loads where those weights are not. Everything else (weights, optimizer state, vocabulary)
    is copied as it is. Returns whether the encoder had to be put in (False: the checkpoint
    held it already, and ``out`` is a copy).

    Raises:
        CheckpointError: unreadable checkpoint, or weights that differ from the recorded ones.
        EncoderWeightsError: the recorded weights cannot be read.
    """
    from captioner.checkpointing import HYPERPARAMETERS_KEY, load_safely, save_atomically
    from captioner.model.encoder import build_encoder
    from captioner.model.hyperparameters import Hyperparameters, hparams_from_checkpoint

    checkpoint = load_safely(Path(checkpoint_path))
    weights = recorded_weights(checkpoint, checkpoint_path)
    if weights is not None:
        problem = missing_weights_problem(checkpoint, checkpoint_path)
        if problem is not None:
            raise CheckpointError(problem)
        settings = Hyperparameters(**hparams_from_checkpoint(
            checkpoint.get(HYPERPARAMETERS_KEY, {}), checkpoint_path))
        # The encoder of the checkpoint's settings, built from those weights.
        encoder = build_encoder(settings.encoder_arch, weights=weights,
                                trainable=settings.encoder_trainable, layer=settings.encoder_layer)
        put_back_encoder(checkpoint, encoder, checkpoint_path)
    save_atomically(checkpoint, Path(out))
    return weights is not None
