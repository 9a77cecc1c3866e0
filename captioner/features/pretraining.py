"""Pretraining a ResNet grid encoder on a dataset's instance masks: the offline stand-in for
ImageNet weights (library of ``captioner pretrain-encoder``; the demo pretrains on its
synthetic scenes).

The paper's encoder is an ImageNet ResNet, frozen while the captioner trains (TVmax paper,
Sec. 4). Without a download, a network that has learned the images' domain plays that role:
the ResNet up to the captioner's stage (``layer3`` or ``layer4``) is trained with a dense
per-cell objective, a 1x1 convolution per attribute on its grid predicting which object covers
each cell (its category and, on the synthetic data, colour and size; class 0: no object;
``data_prep.cell_labels``), with summed cross-entropies. Only the training split is used;
accuracy is reported on the validation split. The result is a plain torchvision ``state_dict``
of the ResNet up to ``layer`` (and ``fc``, untrained; the stages after ``layer`` are left out,
so that a grid encoder of a later layer refuses the file rather than read an untrained stage),
so ``prepare-features --weights FILE --layer LAYER`` and ``model.encoder_weights: FILE`` load it
as any other weights; its batch-norm statistics are those of the training images.

Training sees random crops of ``crop`` pixels (a multiple of the stride, so that the crop's
grid cells are cells of the whole image's grid) with random horizontal flips: four times fewer
pixels per step at 128 of 256 px, and different object positions at every epoch. The split is
held in memory as uint8 (the synthetic demo's 500 images at 256 px: 98 MB), so this is meant for
datasets of thousands of images, not for COCO, whose encoder is ImageNet's.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torchvision
from PIL import Image
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.functional import pil_to_tensor

from captioner.checkpointing import save_atomically
from captioner.features.pretraining_settings import STRIDES, PretrainingSettings
from captioner.model.encoder import GridEncoder, later_stages, pretraining_report_path
from data_prep.atomic import write_json
from data_prep.cell_labels import CellLabeller
from data_prep.images import IMAGENET_MEAN, IMAGENET_STD, load_image
from data_prep.karpathy import ImageEntry, load_karpathy
from data_prep.machine import available_memory
from data_prep.paths import check_output_file
from data_prep.stop_signals import stops_as_keyboard_interrupt, stops_held


class CellLabelledImages(Dataset):
    """The images of one split resized to ``image_size`` (uint8, (N, 3, S, S)) and their
    per-cell labels ((N, A, S/s, S/s) int64). With ``crop`` set, items are random aligned crops
    with random horizontal flips; otherwise whole images."""

    def __init__(self, images: Tensor, labels: Tensor, stride: int, crop: int | None = None):
        self.images, self.labels, self.stride, self.crop = images, labels, stride, crop

    @classmethod
    def load(cls, entries: list[ImageEntry], labeller: CellLabeller,
             settings: PretrainingSettings, crop: int | None) -> CellLabelledImages:
        """The images of Karpathy ``entries`` with their labels (the ``labeller`` loaded for
        them); image errors name the file."""
        size, stride = settings.image_size, STRIDES[settings.layer]
        grid = (size // stride, size // stride)
        needed, free = len(entries) * size * size * 3, available_memory()
        if free is not None and needed > free:  # else the kernel's OOM killer, without a word
            raise MemoryError(f"{len(entries):,} images of {size} px need {needed / 2**30:.2f} "
                              f"GiB in memory, and {free / 2**30:.2f} GiB is free")
        # Bilinear, as data_prep.images.imagenet_transform resizes for the feature cache.
        # Filled in place: a stack of the resized images, or a permuted copy, would hold them
        # twice at once.
        images = torch.empty((len(entries), 3, size, size), dtype=torch.uint8)
        for row, entry in zip(images, entries, strict=True):
            resized = load_image(entry.path).resize((size, size), Image.BILINEAR)
            row.copy_(pil_to_tensor(resized))
        labels = torch.from_numpy(np.stack([labeller.labels(e.image_id, grid) for e in entries]))
        return cls(images, labels, stride, crop)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, labels = self.images[index], self.labels[index]
        if self.crop is None:
            return image, labels
        cells = self.crop // self.stride
        top, left = (int(torch.randint(0, n - cells + 1, ())) for n in labels.shape[1:])
        image = image[:, top * self.stride:, left * self.stride:][:, :self.crop, :self.crop]
        labels = labels[:, top:top + cells, left:left + cells]
        if torch.rand(()) < 0.5:
            image, labels = image.flip(-1), labels.flip(-1)
        return image, labels


class CellClassifier(L.LightningModule):
    """A ResNet grid encoder with one 1x1-convolution head per attribute.

    forward: images (B, 3, H, W) uint8 -> logits (B, sum of class counts, H/s, W/s) float32.
    """

    def __init__(self, classes: dict[str, list[str]], arch: str = "resnet18",
                 layer: str = "layer3", lr: float = 1e-3, epochs: int = 16):
        super().__init__()
        self.save_hyperparameters()
        resnet = torchvision.models.get_model(arch, weights=None)
        self.encoder = GridEncoder(resnet, arch, trainable=True, layer=layer)
        # The whole ResNet, to save the state_dict that build_encoder loads; in a tuple, so
        # that its modules are not registered a second time.
        self._resnet = (resnet,)
        self.counts = [len(names) for names in classes.values()]
        self.heads = nn.Conv2d(self.encoder.channels, sum(self.counts), kernel_size=1)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255)

    def forward(self, images: Tensor) -> Tensor:
        grid = self.encoder((images.float() - self.mean) / self.std)
        return self.heads(grid.permute(0, 3, 1, 2))

    def resnet_state_dict(self) -> dict[str, Tensor]:
        """The trained ResNet's state_dict up to its layer: the stages after it were not
        trained, and loaded as the next stage's weights they would pass for trained ones."""
        later = later_stages(self.hparams.layer)
        return {k: v.detach().cpu().clone() for k, v in self._resnet[0].state_dict().items()
                if not k.startswith(later)}

    def _per_attribute(self, images: Tensor) -> list[Tensor]:
        return list(self(images).split(self.counts, dim=1))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        logits = self._per_attribute(images)
        loss = sum(F.cross_entropy(lg, labels[:, a]) for a, lg in enumerate(logits))
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        predicted = torch.stack([lg.argmax(1) for lg in self._per_attribute(images)], dim=1)
        right = predicted == labels  # (B, A, h, w)
        on_object = labels[:, 0] > 0  # the category's class 0: no object covers the cell
        n = labels[:, 0].numel()
        for a, name in enumerate(self.hparams.classes):
            self.log(f"val/{name}_accuracy", right[:, a].float().mean(), batch_size=n)
            self.log(f"val/{name}_accuracy_on_objects", right[:, a][on_object].float().mean(),
                     batch_size=int(on_object.sum()))
        self.log("val/all_accuracy_on_objects", right.all(1)[on_object].float().mean(),
                 batch_size=int(on_object.sum()), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.hparams.epochs)
        return [optimizer], [schedule]


def pretrain_encoder(karpathy_json, image_root, instances: dict[str, Path], out: str | Path,
                     settings: PretrainingSettings, *, progress: bool = True) -> dict:
    """Train the encoder on the ``train`` split's cells, measure per-cell accuracy on ``val``,
    and write the ResNet ``state_dict`` to ``out`` and the report to
    :func:`~captioner.model.encoder.pretraining_report_path` (both atomically).
    ``instances``: split -> COCO instances file. Returns the report.

    Raises ValueError / KeyError / OSError naming the bad setting, file or image, before any
    training when they can be known then (an unwritable ``out`` included)."""
    settings.check()
    reads = [("dataset file", karpathy_json),
             *((f"{split} instances file", path) for split, path in instances.items())]
    for path in (out, pretraining_report_path(out)):
        check_output_file(path, reads)
    karpathy = load_karpathy(karpathy_json, image_root)
    splits = {split: karpathy.split(split) for split in ("train", "val")}
    for split, entries in splits.items():
        if not entries:
            raise ValueError(f"{karpathy_json}: the {split} split is empty")
    images = {split: {e.image_id: e.path for e in entries} for split, entries in splits.items()}
    train_labeller = CellLabeller.load(instances["train"], images["train"])
    labellers = {"train": train_labeller,
                 "val": CellLabeller.load(instances["val"], images["val"], train_labeller.classes)}
    classes = {a: list(names) for a, names in train_labeller.classes.items()}
    L.seed_everything(settings.seed, verbose=False)
    data = {
        split: CellLabelledImages.load(entries, labellers[split], settings,
                                       settings.crop if split == "train" else None)
        for split, entries in splits.items()
    }
    model = CellClassifier(classes, settings.arch, settings.layer, settings.lr, settings.epochs)
    trainer = L.Trainer(
        max_epochs=settings.epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=progress, enable_model_summary=False, num_sanity_val_steps=0,
        check_val_every_n_epoch=settings.epochs, deterministic=True,
    )
    loaders = {
        split: DataLoader(d, batch_size=settings.batch_size, shuffle=split == "train")
        for split, d in data.items()
    }
    with stops_as_keyboard_interrupt(trainer):
        trainer.fit(model, loaders["train"], loaders["val"])
    # An accuracy over no cells (no validation cell on an object) is undefined: None (null).
    accuracy = {k.removeprefix("val/"): round(value, 4) if math.isfinite(value := float(v))
                else None for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    report = {
        **asdict(settings), "classes": classes,
        "images": {split: len(d) for split, d in data.items()},
        "val_cell_accuracy": accuracy,
    }
    with stops_held():  # the weights and the report that describes them, or neither
        save_atomically(model.resnet_state_dict(), out)
        write_json(pretraining_report_path(out), report, indent=2)
    return report
