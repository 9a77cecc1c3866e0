"""Which annotated object covers each cell of an image's feature grid: the dense targets of
encoder pretraining (``captioner.features.pretraining``) and the masks of attention precision
(``eval.metrics.objects``), from COCO instance annotations.

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
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.images import orient, stored_layout
from data_prep.paths import require_file
from data_prep.settings_files import parse_json
from data_prep.wording import first_names, shown

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
            file (:func:`check_instances`); the message names the file and the field. (The
            RLE masks of the images used are checked further by :func:`mask_orientations`.)
    """
    from pycocotools.coco import COCO

    path = require_file(path, "instances file")
    try:
        with path.open(encoding="utf-8") as handle:
            document = parse_json(handle.read())
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
    "annotations": (("id", True), ("image_id", True), ("category_id", True),
                    ("segmentation", False)),
}
_NUMBERS = {int, float}  # exactly these types: bool is not a coordinate


def check_instances(document, path: Path) -> None:
    """Raise ValueError naming ``path`` and the field unless ``document`` is a COCO instances
    file as the masks need it (:data:`_INSTANCE_FIELDS`), each annotation's ``image_id`` and
    ``category_id`` among its images and categories, its ``id`` its own, its ``iscrowd`` (if
    any) 0 or 1, and its ``segmentation`` one that pycocotools can draw (:func:`_segmentation`),
    checked here before pycocotools' C code sees it: some bad masks crash or hang it."""
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
    known = {key: {entry["id"]: entry for entry in document[key]}
             for key in ("images", "categories")}
    first_of_id: dict[int, int] = {}
    for index, entry in enumerate(document["annotations"]):
        for field, key in (("image_id", "images"), ("category_id", "categories")):
            if entry[field] not in known[key]:
                raise ValueError(f"{path}: annotations[{index}].{field} {entry[field]} is not "
                                 f"the id of any of its {key}")
        first = first_of_id.setdefault(entry["id"], index)
        if first != index:  # pycocotools would keep only the last of them
            raise ValueError(f"{path}: annotations[{index}].id {entry['id']} is also the id of "
                             f"annotations[{first}]")
        crowd = entry.get("iscrowd", 0)
        if type(crowd) is not int or crowd not in (0, 1):
            raise ValueError(f"{path}: annotations[{index}].iscrowd must be 0 or 1, got "
                             f"{shown(crowd)}")
        problem = _segmentation(entry["segmentation"], known["images"][entry["image_id"]])
        if problem:
            raise ValueError(f"{path}: annotations[{index}].segmentation{problem}")


def _segmentation(segmentation, image: dict) -> str | None:
    """What is wrong with an annotation's ``segmentation`` (the rest of the message, after
    ``.segmentation``), or None when pycocotools can draw it over ``image`` (its images entry):

    * polygons: a non-empty list of flat lists of at least 6 (an even number of) finite x, y
      coordinates within [-W, 2W] x [-H, 2H] of the W x H image (COCO's own polygons overshoot
      an edge by a pixel at times; pycocotools crashes on huge or NaN ones);
    * RLE: ``{"size": [h, w], "counts": ...}``, the counts a list of run lengths (uncompressed)
      or pycocotools' compressed string (:func:`_compressed_counts`), summing to h * w
      (pycocotools would read past the mask, or leave it undefined). That [h, w] is the image's
      size is checked with the photo's (:func:`mask_orientations`).
    """
    if isinstance(segmentation, list):
        if not segmentation:
            return " is an empty list of polygons"
        width, height = image["width"], image["height"]
        for number, polygon in enumerate(segmentation):
            if not isinstance(polygon, list) or len(polygon) < 6 or len(polygon) % 2:
                return (f"[{number}] must be a flat list of an even number (at least 6) of x, y "
                        f"coordinates, got {shown(polygon)}")
            if _usual_polygon(polygon, width, height):
                continue
            for place, value in enumerate(polygon):
                if type(value) not in _NUMBERS or (type(value) is float
                                                   and not math.isfinite(value)):
                    return f"[{number}][{place}] must be a finite number, got {shown(value)}"
            for place in range(0, len(polygon), 2):
                x, y = polygon[place], polygon[place + 1]
                if not (-width <= x <= 2 * width and -height <= y <= 2 * height):
                    return (f"[{number}] has the point ({shown(x, 24)}, {shown(y, 24)}) far "
                            f"outside its image ({width} x {height})")
        return None
    if not isinstance(segmentation, dict):
        return (f" must be a list of polygons or an RLE object (size, counts), got "
                f"{type(segmentation).__name__} {shown(segmentation)}")
    for field in ("size", "counts"):
        if field not in segmentation:
            return f" (RLE) lacks field {field!r}"
    size, counts = segmentation["size"], segmentation["counts"]
    if (not isinstance(size, list) or len(size) != 2
            or any(type(v) is not int or v < 0 for v in size)):
        return f".size must be [height, width], got {shown(size)}"
    pixels = size[0] * size[1]
    if isinstance(counts, list):
        for place, value in enumerate(counts):
            if type(value) is not int or value < 0:
                return f".counts[{place}] must be a non-negative integer, got {shown(value)}"
        runs = counts
    elif isinstance(counts, str):
        runs = _compressed_counts(counts)
        if runs is None:
            return f".counts {shown(counts)} is not a compressed RLE string (pycocotools')"
    else:
        return (f".counts must be a list of run lengths or a compressed RLE string, got "
                f"{type(counts).__name__} {shown(counts)}")
    if sum(runs) != pixels:
        return (f".counts {shown(counts)} covers {sum(runs)} pixels, not the {pixels} of its "
                f"size {size[0]} x {size[1]}")
    return None


def _usual_polygon(polygon: list, width: int, height: int) -> bool:
    """Whether ``polygon`` is all finite numbers within [-W, 2W] x [-H, 2H], checked at C
    speed (a COCO file holds millions of coordinates); False for :func:`_segmentation` to say
    what is wrong. A finite sum means no NaN or infinity among the numbers."""
    xs, ys = polygon[0::2], polygon[1::2]
    try:
        return (set(map(type, polygon)) <= _NUMBERS and math.isfinite(sum(polygon))
                and -width <= min(xs) and max(xs) <= 2 * width
                and -height <= min(ys) and max(ys) <= 2 * height)
    except OverflowError:  # an integer too large for a float
        return False


def _compressed_counts(counts: str) -> list[int] | None:
    """The run lengths that pycocotools reads from the compressed RLE string ``counts`` (its
    ``rleFrString``: 5 bits a character from "0", a sixth that says more follow, each run
    after the third given as the difference from the one two before), or None where the
    string is not one its encoder writes: a character out of "0".."o", a number of over 6
    characters or cut off at the end, a run below 0 or of 2**32 or more (which the C code
    would read past the string, overflow or wrap)."""
    runs: list[int] = []
    value = shift = 0
    for char in counts:
        code = ord(char) - 48
        if not 0 <= code < 64 or shift == 30:
            return None
        value |= (code & 0x1F) << shift
        shift += 5
        if not code & 0x20:
            if code & 0x10:
                value |= -1 << shift
            if len(runs) > 2:
                value += runs[-2]
            if not 0 <= value < 2**32:
                return None
            runs.append(value)
            value = shift = 0
    return runs if shift == 0 else None


def mask_orientations(coco, instances: Path, images: Mapping[int, Path]) -> dict[int, int]:
    """For each image id of ``images`` (id -> image file), the EXIF orientation
    (``data_prep.images.orient``) that lays its masks from the instances file ``instances``
    (``coco``) over the image as ``load_image`` shows it.

    COCO's masks follow the pixels as stored, whatever the file's EXIF orientation, and the
    file gives their size: the image's orientation then. Some tools annotate the image as
    shown and give that size: 1 (nothing to turn) when the size is the shown size alone.
    Flips and half turns keep the size, so for them the masks are taken as COCO's.

    Raises:
        ValueError: ids missing from the instances file (the first named, and how many), an
            id given a size that is neither the stored nor the shown size of its image (the
            message names both files and sizes), or an RLE mask of these images that is not of
            the size its image is given or cannot be decoded (:func:`check_rle_masks`).
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
    check_rle_masks(coco, instances, orientations)
    return orientations


def check_rle_masks(coco, instances: Path, image_ids: Collection[int]) -> None:
    """Raise ValueError naming the instances file ``instances`` (``coco``) and the annotation
    unless each RLE mask of the images ``image_ids`` has the size [height, width] its image is
    given, and each compressed one decodes (pycocotools' ``mask.decode``) to a mask of that
    size and of the area its run lengths give. Run after :func:`mask_orientations` has checked
    that size with the photo's, so that a wrong size is told as the image's, and after
    :func:`check_instances` has checked the run lengths, which makes decoding safe."""
    from pycocotools import mask as mask_utils

    for index, annotation in enumerate(coco.dataset["annotations"]):
        segmentation, image_id = annotation["segmentation"], annotation["image_id"]
        if image_id not in image_ids or not isinstance(segmentation, dict):
            continue
        info = coco.imgs[image_id]
        size, counts = [info["height"], info["width"]], segmentation["counts"]
        where = f"{instances}: annotations[{index}].segmentation"
        if segmentation["size"] != size:
            raise ValueError(f"{where}.size {segmentation['size']} is not {size}, the height "
                             f"and width of its image {image_id}")
        if not isinstance(counts, str):
            continue
        try:
            decoded = mask_utils.decode({"size": size, "counts": counts})
        except Exception as exc:  # whatever pycocotools raises: told as the annotation's
            raise ValueError(f"{where}.counts {shown(counts)} cannot be decoded "
                             f"(pycocotools: {exc})") from None
        area = sum(_compressed_counts(counts)[1::2])
        if decoded.shape != tuple(size) or int(decoded.sum()) != area:
            raise ValueError(f"{where}.counts {shown(counts)} decodes to a {decoded.shape} "
                             f"mask of {int(decoded.sum())} pixels, not {tuple(size)} and {area}")


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
