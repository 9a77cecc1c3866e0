"""Which annotated object covers each cell of an image's feature grid: the dense targets of
encoder pretraining (``captioner.encoder_pretraining``) and the masks of attention precision
(``eval.objects``), from COCO instance annotations.

A cell is labelled with the object that covers the largest share of it when that share is at
least ``MIN_COVER`` (half the cell), and with class 0 (``"none"``) otherwise. Each label is a
tuple of attributes: the annotation's category, then each of :data:`ATTRIBUTE_FIELDS` that every
annotation of the file carries (the synthetic dataset's ``"colour"`` and ``"size"``; COCO's own
files have neither, so their labels are the category alone).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import first_names, require_file
from .images import orient, stored_layout

ATTRIBUTE_FIELDS = ("colour", "size")
NONE = "none"  # class 0 of every attribute: no object covers the cell
MIN_COVER = 0.5


def area_weights(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) matrix: row i holds the fraction of output cell i covered by each input
    pixel (cells of n_in / n_out pixels, fractional at their borders); rows sum to 1."""
    edges = np.linspace(0.0, n_in, n_out + 1)
    pixel = np.arange(n_in)
    overlap = np.clip(
        np.minimum(edges[1:, None], pixel[None, :] + 1)
        - np.maximum(edges[:-1, None], pixel[None, :]),
        0.0,
        None,
    )
    return overlap / (n_in / n_out)


def downsample_mask(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Fraction (h, w) float64 of each cell of an (h, w) grid covered by the binary (H, W)
    ``mask``."""
    rows = area_weights(grid[0], mask.shape[0])
    cols = area_weights(grid[1], mask.shape[1])
    return rows @ mask.astype(np.float64) @ cols.T


def load_coco(path: str | Path):
    """``pycocotools.coco.COCO`` of an instances file, without its progress prints.

    Raises:
        FileNotFoundError: no such file. ValueError: a FIFO or device, or not a COCO instances
            file (:func:`check_instances`); the message names the file and the field.
    """
    from pycocotools.coco import COCO

    path = require_file(path, "instances file")
    try:
        with path.open(encoding="utf-8") as handle:
            document = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON file ({exc})") from None
    check_instances(document, path)
    coco = COCO()
    coco.dataset = document
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


# The fields of a COCO instances file that the masks need, per list: (name, an integer?).
_INSTANCE_FIELDS = {
    "images": (("id", True), ("height", True), ("width", True)),
    "categories": (("id", True), ("name", False)),
    "annotations": (("image_id", True), ("category_id", True), ("segmentation", False)),
}


def check_instances(document, path: Path) -> None:
    """Raise ValueError naming ``path`` and the field unless ``document`` is a COCO instances
    file as the masks need it (:data:`_INSTANCE_FIELDS`), each annotation's ``image_id`` and
    ``category_id`` among its images and categories."""
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a COCO instances file (a JSON object with images, "
                         f"annotations and categories), got a {type(document).__name__}")
    for key, fields in _INSTANCE_FIELDS.items():
        entries = document.get(key)
        if entries is None:
            raise ValueError(f"{path}: not a COCO instances file: it lacks the list {key!r}")
        if not isinstance(entries, list):
            raise ValueError(f"{path}: not a COCO instances file: field {key!r} must be a "
                             f"list, got {type(entries).__name__}")
        for index, entry in enumerate(entries):
            for field, integer in fields:
                if not isinstance(entry, dict) or field not in entry:
                    raise ValueError(f"{path}: {key}[{index}] lacks field {field!r}")
                value = entry[field]
                if integer and (isinstance(value, bool) or not isinstance(value, int)):
                    raise ValueError(f"{path}: {key}[{index}].{field} must be an integer, "
                                     f"got {value!r}")
    known = {key: {entry["id"] for entry in document[key]} for key in ("images", "categories")}
    for index, entry in enumerate(document["annotations"]):
        for field, key in (("image_id", "images"), ("category_id", "categories")):
            if entry[field] not in known[key]:
                raise ValueError(f"{path}: annotations[{index}].{field} {entry[field]} is not "
                                 f"the id of any of its {key}")


def mask_orientations(coco, instances: Path, images: Mapping[int, Path]) -> dict[int, int]:
    """For each image id of ``images`` (id -> image file), the EXIF orientation
    (``data_prep.images.orient``) that lays its masks from the instances file ``instances``
    (``coco``) over the image as ``load_image`` shows it.

    COCO's masks follow the pixels as stored, whatever the file's EXIF orientation, and the
    file gives their size: the image's orientation then. Some tools annotate the image as
    shown and give that size: 1 (nothing to turn) when the size is the shown size alone.
    Flips and half turns keep the size, so for them the masks are taken as COCO's.

    Raises:
        ValueError: ids missing from the instances file (the first named, and how many), or
            an id given a size that is neither the stored nor the shown size of its image (the
            message names both files and sizes).
        ImageLoadError: an image that cannot be read.
    """
    missing = [image_id for image_id in images if image_id not in coco.imgs]
    if missing:
        raise ValueError(f"{instances}: has no image {missing[0]} ({images[missing[0]]}); "
                         f"{len(missing)} of the {len(images)} images asked for are missing")
    orientations = {}
    for image_id, image in images.items():
        info = coco.imgs[image_id]
        (width, height), orientation = stored_layout(image)
        stored, given = (width, height), (info["width"], info["height"])
        shown = stored[::-1] if orientation >= 5 else stored
        if given != stored and given != shown:
            raise ValueError(
                f"{instances}: image {image_id} is {given[0]}x{given[1]} there, but {image} is "
                f"{width}x{height} (width x height"
                + (f"; shown turned, {shown[0]}x{shown[1]}, by its EXIF orientation "
                   f"{orientation})" if shown != stored else ")")
            )
        orientations[image_id] = orientation if given == stored else 1
    return orientations


@dataclass(frozen=True)
class CellLabeller:
    """Per-cell labels of some images of one COCO instances file.

    Attributes:
        coco: the ``pycocotools.coco.COCO`` of the file.
        path: the file.
        classes: attribute name ("category", then the carried :data:`ATTRIBUTE_FIELDS`) ->
            class names, ``classes[a][0] == "none"``.
        orientations: image id -> :func:`mask_orientations`, for the images labelled.
    """

    coco: object
    path: Path
    classes: dict[str, tuple[str, ...]]
    orientations: dict[int, int]

    @classmethod
    def load(cls, path: str | Path, images: Mapping[int, Path],
             classes: dict[str, tuple[str, ...]] | None = None) -> CellLabeller:
        """The labeller of the instances file ``path`` for ``images`` (id -> image file; each
        checked by :func:`mask_orientations`), with the ``classes`` of another split's
        labeller when given (ValueError naming a class that split does not have)."""
        coco = load_coco(path)
        annotations = list(coco.anns.values())
        own = {"category": (NONE, *(c["name"] for c in coco.loadCats(coco.getCatIds())))}
        for field in ATTRIBUTE_FIELDS:
            if annotations and all(isinstance(a.get(field), str) for a in annotations):
                own[field] = (NONE, *sorted({a[field] for a in annotations}))
        if classes is not None:
            for attribute, names in own.items():
                unknown = sorted(set(names) - set(classes.get(attribute, ())))
                if unknown:
                    raise ValueError(
                        f"{path}: {attribute} {first_names(unknown)} not among the training "
                        f"classes ({first_names(classes.get(attribute, ()))})")
        orientations = mask_orientations(coco, Path(path), images)
        return cls(coco, Path(path), own if classes is None else dict(classes), orientations)

    def labels(self, image_id: int, grid: tuple[int, int]) -> np.ndarray:
        """(A, h, w) int64 class indices of every attribute (in ``classes`` order) for each
        cell of the (h, w) grid over the image as shown. KeyError for an image not loaded."""
        if image_id not in self.orientations:
            raise KeyError(f"image {image_id} was not loaded from the instances file {self.path}")
        annotations = self.coco.loadAnns(self.coco.getAnnIds(imgIds=[image_id], iscrowd=None))
        labels = np.zeros((len(self.classes), *grid), dtype=np.int64)
        if not annotations:
            return labels
        orientation = self.orientations[image_id]
        cover = np.stack([downsample_mask(orient(self.coco.annToMask(a), orientation), grid)
                          for a in annotations])
        best = cover.argmax(axis=0)
        covered = cover.max(axis=0) >= MIN_COVER
        for row, (attribute, names) in enumerate(self.classes.items()):
            values = [self.coco.cats[a["category_id"]]["name"] if attribute == "category"
                      else a[attribute] for a in annotations]
            per_object = np.array([names.index(v) for v in values], dtype=np.int64)
            labels[row] = np.where(covered, per_object[best], 0)
        return labels
