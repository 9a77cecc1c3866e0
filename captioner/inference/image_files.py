"""Image files named on a command line: folders expanded, files read one by one.

Used by every command that captions image files (caption, heatmaps, rating-kit). A file that
cannot be read (missing, corrupt, too large, a FIFO or device, ...) is reported by name and
skipped; it never stops the other images.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from data_prep.images import IMAGE_SUFFIXES, ImageLoadError, load_image
from data_prep.paths import refuse_repeated

_COCO_ID = re.compile(r"(?:^|_)(\d+)$")


@dataclass
class ImageResult:
    """One file: its decoded RGB ``image``, or None and the ``error`` saying why."""

    path: Path
    image: Image.Image | None
    error: str | None = None


def collect_images(inputs: Sequence[str | Path]) -> list[Path]:
    """Expand files and folders into image paths: folders recursively, sorted, by suffix;
    files named explicitly are kept as given. A folder's entries with an image suffix are kept
    whatever they are but folders (a FIFO, a device, a broken link), so that reading them
    reports each by name instead of skipping it unseen.

    Raises:
        FileNotFoundError: an input does not exist. ValueError: a folder holds no images, or
            an image comes twice (as two spellings of its path, or by a folder and by name).
    """
    paths: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(
                p for p in item.rglob("*")
                if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir()
            )
            if not found:
                raise ValueError(
                    f"{item}: folder holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})"
                )
            paths.extend(found)
        elif item.exists() or item.is_symlink():
            paths.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such file or folder")
    refuse_repeated(paths, "image")
    return paths


def load_images(paths: Sequence[Path]) -> list[ImageResult]:
    """Read every file of ``paths`` (see :func:`data_prep.images.load_image`), in order."""
    results = []
    for path in paths:
        try:
            results.append(ImageResult(path, load_image(path)))
        except ImageLoadError as exc:
            results.append(ImageResult(path, None, str(exc)))
    return results


def coco_image_ids(paths: Sequence[Path]) -> tuple[list[int], bool]:
    """COCO image ids of ``paths``: the file stem when it is all digits (``391895.jpg``) or the
    digits after its last underscore (``COCO_val2014_000000391895.jpg``). When any file has no
    such id or two files share one, every image gets its 1-based position in ``paths``.

    Returns the ids and whether they come from the file names (False: positions).
    """
    matches = [_COCO_ID.search(Path(p).stem) for p in paths]
    ids = [int(m.group(1)) if m else None for m in matches]
    if all(i is not None for i in ids) and len(set(ids)) == len(ids):
        return ids, True
    return list(range(1, len(paths) + 1)), False
