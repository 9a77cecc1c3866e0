"""What a run of ``captioner prepare-features`` is asked to make (:class:`FeatureSettings`), and
the error it reports for a problem with its inputs or destination."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from data_prep.settings_files import check_integers

ON_ERROR = ("fail", "skip")


class FeatureExtractionError(ValueError):
    """A problem with the inputs or the destination; the message names it."""


@dataclass(frozen=True)
class FeatureSettings:
    """The encoder, the images and the way a cache is made: the ResNet ``arch`` up to stage
    ``layer`` with ``weights`` (None: random, ``seed``, batch-norm statistics of the first
    ``calibration_images`` training images), at ``image_size`` pixels, over ``splits``;
    ``on_error``: ``"fail"`` or ``"skip"`` unusable images. Checked when made.

    Raises:
        FeatureExtractionError: a value out of range or unknown (one line naming it).
    """

    arch: str = "resnet101"
    layer: str = "layer4"
    weights: str | None = "IMAGENET1K_V2"
    image_size: int = 256
    splits: tuple[str, ...] = ("train", "val", "test")
    batch_size: int = 32
    num_workers: int = 2
    device: str = "cpu"
    seed: int = 0
    calibration_images: int = 64
    on_error: str = "fail"

    def __post_init__(self) -> None:
        from captioner.model.encoder import ARCHITECTURES, LAYERS

        if self.on_error not in ON_ERROR:
            raise FeatureExtractionError(
                f"on_error must be one of {', '.join(ON_ERROR)}, got {self.on_error!r}")
        check_integers([("image size", self.image_size, 1), ("batch size", self.batch_size, 1),
                        ("number of workers", self.num_workers, 0)], FeatureExtractionError)
        for name, value, valid in (("arch", self.arch, ARCHITECTURES),
                                   ("layer", self.layer, LAYERS)):
            if value not in valid:
                raise FeatureExtractionError(
                    f"unknown encoder {name} {value!r}; valid: {', '.join(valid)}")

    def recorded(self, max_pixels: int) -> dict[str, Any]:
        """The settings that a cache's resume key records (those that make its rows, and the
        ones a partial cache is only resumed with: batch size and device type)."""
        import torch

        settings = {
            "arch": self.arch, "layer": self.layer, "weights": self.weights,
            "image_size": self.image_size, "batch_size": self.batch_size,
            "device": torch.device(self.device).type, "max_pixels": max_pixels,
        }
        if self.weights is None:
            settings.update(seed=self.seed, calibration_images=self.calibration_images)
        return settings
