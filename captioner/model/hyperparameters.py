"""The hyperparameters of a captioner, as :class:`captioner.training.module.CaptioningModule`
takes them and every checkpoint stores them, without Lightning: inference reads a checkpoint's
hyperparameters with the same checks and defaults as training, and imports no Lightning.

:class:`Hyperparameters` is the one place of their names, order and defaults; the constructor
of the LightningModule takes its defaults from here (LightningCLI reads that signature).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from captioner.checkpointing import constructor_arguments
from captioner.model.caption_model import build_caption_model
from captioner.model.decoding_options import DecodingOptions
from data_prep.images import MAX_IMAGE_SIZE

# The paper's Adam settings (Sec. 4): the defaults of CaptioningModule and the benchmarks' model.
PAPER_LR = 1e-4
PAPER_BETAS = (0.8, 0.999)

# Hyperparameters of earlier versions that became fields of ``decoding``.
_LEGACY_DECODING_KEYS = ("beam_size", "max_length")


@dataclass(frozen=True)
class Hyperparameters:
    """A captioner's settings (documented at
    :class:`captioner.training.module.CaptioningModule`), read back from a checkpoint."""

    vocab_size: int
    encoder_arch: str = "resnet101"
    encoder_weights: str | None = "IMAGENET1K_V2"
    encoder_trainable: bool = False
    encoder_layer: str = "layer4"
    image_size: int = 256
    input_attention: str = "softmax"
    input_attention_kwargs: dict[str, Any] | None = None
    output_attention: str = "softmax"
    output_attention_kwargs: dict[str, Any] | None = None
    output_mapping: str = "softmax"
    feature_dim: int = 512
    embed_dim: int = 256
    hidden_dim: int = 512
    attention_dim: int = 512
    dropout: float = 0.5
    lr: float = PAPER_LR
    betas: tuple[float, float] = PAPER_BETAS
    lr_decay: float = 0.99
    lr_decay_after: int = 10
    gradient_clip_norm: float | None = 5.0
    decoding: DecodingOptions = DecodingOptions()


# The default of every hyperparameter but vocab_size, by name.
DEFAULTS = {item.name: item.default for item in fields(Hyperparameters)
            if item.name != "vocab_size"}


def model_arguments(hparams: Any) -> dict[str, Any]:
    """The arguments of :func:`captioner.model.caption_model.build_caption_model` among
    ``hparams`` (a :class:`Hyperparameters` or a LightningModule's ``hparams``), by the
    builder's own parameter names."""
    return {name: getattr(hparams, name)
            for name in inspect.signature(build_caption_model).parameters}


def check_settings(image_size: int, lr: float, betas: Any, lr_decay: float,
                   lr_decay_after: int, clip_norm: float | None) -> None:
    """ValueError naming a setting that cannot train: torch would say so only once the fit has
    begun, in its own words, or (an image_size from a checkpoint) take all memory."""

    def finite(value: Any) -> bool:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value))

    for name, value, ok, rule in (
        ("image_size", image_size, isinstance(image_size, int) and not isinstance(
            image_size, bool) and 1 <= image_size <= MAX_IMAGE_SIZE,
         f"an integer in [1, {MAX_IMAGE_SIZE}]"),
        ("lr", lr, finite(lr) and lr >= 0, "a number >= 0"),  # 0: weights kept, as torch
        ("betas", betas, isinstance(betas, list | tuple) and len(betas) == 2
         and all(finite(b) and 0 <= b < 1 for b in betas), "two numbers in [0, 1)"),
        ("lr_decay", lr_decay, finite(lr_decay) and lr_decay > 0, "a number > 0"),
        ("lr_decay_after", lr_decay_after, isinstance(lr_decay_after, int)
         and not isinstance(lr_decay_after, bool) and lr_decay_after >= 0, "an integer >= 0"),
        ("gradient_clip_norm", clip_norm, clip_norm is None
         or (finite(clip_norm) and clip_norm > 0), "a number > 0, or null"),
    ):
        if not ok:
            raise ValueError(f"model.{name} must be {rule}, got {value!r}")


def hparams_from_checkpoint(stored: Any, source: str | Path) -> dict[str, Any]:
    """Constructor arguments from a checkpoint's hyperparameters, checked as untrusted
    plain data (:func:`captioner.checkpointing.constructor_arguments`) against
    :class:`Hyperparameters`; earlier versions' ``beam_size`` / ``max_length`` become the
    ``decoding`` options.

    Raises:
        CheckpointError: an unknown key or a value that is not plain data.
    """
    if isinstance(stored, dict) and any(key in stored for key in _LEGACY_DECODING_KEYS):
        stored = dict(stored)
        legacy = {key: stored.pop(key) for key in _LEGACY_DECODING_KEYS if key in stored}
        decoding = stored.get("decoding")
        stored["decoding"] = {**legacy, **decoding} if isinstance(decoding, dict) else legacy
    return constructor_arguments(stored, Hyperparameters, source)
