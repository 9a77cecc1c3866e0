"""What ``captioner pretrain-encoder`` trains and how (:class:`PretrainingSettings`), where its
report goes and how it reads: plain data, so that the command's options and help need neither
torch nor torchvision. The training itself is :mod:`captioner.features.pretraining`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

STRIDES = {"layer3": 16, "layer4": 32}


@dataclass(frozen=True)
class PretrainingSettings:
    """What ``captioner pretrain-encoder`` trains and how (its options; defaults: the demo's).

    Attributes:
        arch: ResNet depth.
        layer: last ResNet stage: layer3 (stride 16) or layer4 (stride 32).
        image_size: images are resized to this many pixels square.
        crop: training crop side in pixels, a multiple of the stride.
        epochs: passes over the training split.
        batch_size: crops per step.
        lr: AdamW learning rate (cosine decay to 0).
        seed: seed of the initialization, crops and order.
    """

    arch: str = "resnet18"
    layer: str = "layer3"
    image_size: int = 256
    crop: int = 128
    # Shapes are learned late and only with many steps: on the demo's data (seed 0), the
    # validation shape accuracy on object cells was 36% after 8 epochs of batches of 32, 65%
    # with batches of 8, 79% after 10 epochs and 95% after 16 (colour and size: over 96% from
    # 10 epochs on).
    epochs: int = 16
    batch_size: int = 8
    lr: float = 1e-3
    seed: int = 0

    def check(self) -> None:
        """ValueError naming the first inconsistent setting."""
        from captioner.model.encoder import ARCHITECTURES

        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown encoder arch {self.arch!r}; valid: "
                             f"{', '.join(ARCHITECTURES)}")
        if self.layer not in STRIDES:
            raise ValueError(f"layer must be one of {sorted(STRIDES)}, got {self.layer!r}")
        stride = STRIDES[self.layer]
        if self.image_size % stride or self.image_size < stride:
            raise ValueError(f"image size must be a multiple of {stride} (the stride of "
                             f"{self.layer}), got {self.image_size}")
        if self.crop % stride or not stride <= self.crop <= self.image_size:
            raise ValueError(f"crop must be a multiple of {stride} between {stride} and the image "
                             f"size {self.image_size}, got {self.crop}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', ' ')} must be at least 1, got "
                                 f"{getattr(self, name)}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")


def describe_accuracy(report: dict) -> str:
    """The report's per-cell validation accuracy, one line per attribute, in %."""
    accuracy = report["val_cell_accuracy"]
    lines = [f"per-cell accuracy on the validation split ({report['images']['val']} images):"]
    for attribute in report["classes"]:
        lines.append(f"  {attribute:<9} {_percent(accuracy[f'{attribute}_accuracy'])} of all "
                     f"cells, {_percent(accuracy[f'{attribute}_accuracy_on_objects'])} of "
                     "cells on an object")
    lines.append(f"  all attributes right on {_percent(accuracy['all_accuracy_on_objects'])} "
                 "of the cells on an object")
    if accuracy["all_accuracy_on_objects"] is None:
        lines.append("  (n/a: no cell of the validation images lies on an object)")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "  n/a " if value is None else f"{100 * value:5.1f}%"


def pretrain_encoder_file(
    data: Path,
    images: Path,
    train_instances: Path,
    val_instances: Path,
    out: Path,
    overwrite: bool = False,
    settings: PretrainingSettings | None = None,
    progress: bool = True,
) -> int:
    """Pretrain a ResNet grid encoder on per-cell labels from COCO instance masks and write its
    weights to ``out`` and its report beside them; the exit status: 0, or 2 for a user error
    (one line, before the training).

    Args:
        data: Karpathy-split JSON file.
        images: image root folder.
        train_instances: COCO instances file of the training split's images.
        val_instances: COCO instances file of the validation split's images.
        out: weights file to write (.pt).
        overwrite: replace an existing --out file (default: refuse it).
        settings: what is trained and how (default: the demo's).
        progress: show progress bars.
    """
    import sys

    from captioner.features.pretraining import pretrain_encoder
    from captioner.model.encoder import pretraining_report_path
    from data_prep.paths import OutputPathError, check_output_file

    out, images = Path(out), Path(images)
    reads = [("dataset file", data), ("instances file", train_instances),
             ("instances file", val_instances)]
    try:
        if pretraining_report_path(out) == out:
            raise OutputPathError(f"--out {out}: the report is written beside the weights "
                                  "as NAME.json; give the weights another name, such as "
                                  f"{out.with_suffix('.pt').name}")
        for path in (out, pretraining_report_path(out)):
            # Before the training: weights that caches and checkpoints were made with are
            # replaced only when asked to.
            check_output_file(path, reads, overwrite=overwrite)
            if path.resolve().is_relative_to(images.resolve()):
                raise OutputPathError(f"{path}: lies inside the image folder {images} this "
                                      "command reads, where it could replace an image; write "
                                      "it elsewhere")
        report = pretrain_encoder(data, images, {"train": train_instances, "val": val_instances},
                                  out, settings or PretrainingSettings(), progress=progress)
    except (ValueError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"captioner pretrain-encoder: {message}", file=sys.stderr)
        return 2
    print(describe_accuracy(report))
    print(f"wrote {out} and {pretraining_report_path(out)}")
    return 0
