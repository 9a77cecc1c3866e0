"""A photo stored sideways with an EXIF orientation, and a COCO instances file of its one
object: the case where masks and pixels can part ways."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from data_prep.images import load_image


def turned_photo(folder: Path, orientation: int, annotated: str = "stored",
                 given_size: tuple[int, int] | None = None) -> tuple[Path, dict, np.ndarray]:
    """(instances file, {1: photo}, the object's mask (bool) over the photo as load_image
    shows it). The photo is red on the object, black elsewhere. ``annotated``: whether the
    file's mask and size follow the ``"stored"`` pixels (COCO) or the ``"shown"`` ones;
    ``given_size`` (width, height) overrides the size the file gives."""
    stored = np.zeros((8, 12, 3), dtype=np.uint8)  # 12 wide, 8 high
    stored[:2, :9, 0] = 255  # no symmetry maps it onto itself
    exif = Image.Exif()
    exif[0x0112] = orientation
    photo = folder / "photo.png"
    Image.fromarray(stored).save(photo, exif=exif)
    shown = np.asarray(load_image(photo))[..., 0] > 127
    mask = stored[..., 0] > 127 if annotated == "stored" else shown
    encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    given_width, given_height = given_size or mask.shape[::-1]
    instances = folder / "instances.json"
    instances.write_text(json.dumps({
        "images": [{"id": 1, "width": given_width, "height": given_height,
                    "file_name": photo.name}],
        "categories": [{"id": 1, "name": "square"}],
        "annotations": [{
            "id": 1, "image_id": 1, "category_id": 1, "area": float(mask.sum()),
            "segmentation": {"size": [int(v) for v in encoded["size"]],
                             "counts": encoded["counts"].decode("ascii")},
            "bbox": [0, 0, 1, 1], "iscrowd": 0,
        }],
    }))
    return instances, {1: photo}, shown
