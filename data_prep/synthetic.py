"""The embedded synthetic captioning dataset: coloured shapes on textured backgrounds.

Each image shows 1-3 objects of distinct shapes (:data:`CATEGORIES`) and distinct colours
(:data:`COLOURS`), each small (17-24 % of the image side, 44-61 px at 256 px) or large
(31-43 %, 79-110 px), placed without overlap on a mottled, striped or gradient background. An
8x8 attention grid (the TVmax paper's 256 px input through a ResNet, 32 px cells) therefore
sees every object over at least one full cell. Five captions per image name colours, shapes,
sizes and spatial relations (:mod:`data_prep.synthetic_captions`).

The files mimic COCO so that the demo and the tests run the real loaders:

* ``dataset_synthetic.json``: Karpathy split format (``"dataset": "synthetic"``), written
  last and atomically, so its presence means the dataset is complete;
* ``images/{split}/synthetic_{split}_{cocoid:06d}.png``: lossless RGB PNGs, so the instance
  masks match the painted pixels exactly;
* ``instances_{split}.json``: COCO instance annotations (categories = shapes, RLE segmentation
  masks, boxes, areas; image ids = the Karpathy ``cocoid``), loadable by
  ``pycocotools.coco.COCO``. Annotations also carry ``"colour"`` and ``"size"``.

Every image is drawn from its own random stream ``default_rng([seed, split, index])``, so the
dataset is a pure function of the seed and one split's size does not change another's images.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from data_prep.atomic import atomic_write
from data_prep.disk_space import DISK_FULL, disk_full
from data_prep.karpathy import SPLITS, tokenize
from data_prep.locks import held_alone
from data_prep.output_folders import STAGING_PREFIX
from data_prep.stop_signals import stops_held
from data_prep.synthetic_captions import (
    BACKGROUND_WORDS,
    CAPTIONS_PER_IMAGE,
    CATEGORY_WORDS,
    DescribedObject,
    describe_scene,
)

__all__ = [
    "CATEGORIES",
    "CATEGORY_WORDS",
    "COLOURS",
    "KARPATHY_FILENAME",
    "SyntheticDataset",
    "generate",
]

CATEGORIES: tuple[str, ...] = tuple(CATEGORY_WORDS)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (35, 165, 50),
    "blue": (35, 75, 225),
    "yellow": (245, 215, 25),
    "purple": (145, 50, 195),
    "orange": (250, 135, 15),
}
# Object extent (side of its bounding square) as a fraction of the image side.
SIZE_FRACTIONS: dict[str, tuple[float, float]] = {"small": (0.17, 0.24), "large": (0.31, 0.43)}
BACKGROUNDS: tuple[str, ...] = tuple(BACKGROUND_WORDS)
_COCO_CATEGORIES = [
    {"id": index + 1, "name": name, "supercategory": "shape"}
    for index, name in enumerate(CATEGORIES)
]
KARPATHY_FILENAME = "dataset_synthetic.json"
LOCK_NAME = ".synthetic.lock"  # held by the one run rendering into the folder
MIN_IMAGE_SIZE = 64
# Each image is drawn from float32 layers of its size: 100,000 px would ask 37 GiB a layer.
MAX_IMAGE_SIZE = 4096

_OBJECT_COUNT_PROBABILITIES = (0.3, 0.4, 0.3)  # of 1, 2, 3 objects
_GAP_FRACTION = 0.025  # minimum empty space between object boxes, as a fraction of the side
_COLOUR_JITTER = 12
_PLACEMENT_TRIES = 100
_GENERATOR_VERSION = 1


@dataclass(frozen=True)
class SyntheticDataset:
    """Paths of a generated dataset: the Karpathy JSON, the image root to pass to
    :func:`data_prep.karpathy.load_karpathy`, and the COCO instances file of each split."""

    karpathy_json: Path
    image_root: Path
    instances: dict[str, Path]

    @classmethod
    def from_dir(cls, out_dir: str | Path) -> SyntheticDataset:
        """The dataset previously generated in ``out_dir``; FileNotFoundError naming the first
        missing file when it is absent or incomplete."""
        dataset = _paths(Path(out_dir))
        for path in (dataset.karpathy_json, dataset.image_root, *dataset.instances.values()):
            if not path.exists():
                raise FileNotFoundError(
                    f"no complete synthetic dataset in {out_dir}: {path} is missing "
                    "(run 'captioner prepare-synthetic --out DIR')"
                )
        return dataset


@dataclass(frozen=True)
class _Object:
    category: str
    colour: str
    size: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive), pixels
    points: tuple[tuple[float, float], ...] | None  # polygon; None for a circle inscribed in box


def generate(
    out_dir: str | Path,
    *,
    n_train: int,
    n_val: int,
    n_test: int,
    seed: int = 0,
    image_size: int = 256,
    progress: bool = True,
) -> SyntheticDataset:
    """Render the synthetic dataset into ``out_dir`` (created if needed) and return its paths.
    Deterministic from ``seed``.

    The dataset is rendered into a hidden staging folder inside ``out_dir`` and moved into
    place only once every file is written, replacing the files of an earlier run (its images
    of an earlier, larger run too); other files are left alone. The Karpathy file marks a
    complete dataset: an earlier run's is removed first, so that a run that fails leaves none.
    A run that fails (a full disk, ``ulimit -f``, Ctrl-C) removes its staging folder, leaving
    no image of its own; one killed outright leaves its staging folder, which the next run
    removes.

    Raises:
        OSError: a full disk or the file size limit, naming ``out_dir`` in one line.
        OutputPathError: another run is rendering into ``out_dir`` now.
    """
    counts = {"train": n_train, "val": n_val, "test": n_test}
    named = [(f"n_{split}", n) for split, n in counts.items()]
    for name, value, low in [*((name, n, 0) for name, n in named), ("seed", seed, 0),
                             ("image_size", image_size, MIN_IMAGE_SIZE)]:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer of at least {low}, got {value!r}")
    if image_size > MAX_IMAGE_SIZE:
        raise ValueError(f"image_size must be at most {MAX_IMAGE_SIZE}, got {image_size}")
    if sum(counts.values()) == 0:
        raise ValueError("n_train + n_val + n_test must be at least 1")

    dataset = _paths(Path(out_dir))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    busy = f"{out_dir}: another run is rendering a synthetic dataset there now"
    # One run at a time: each removes the staging folders it finds, as a killed run's.
    with held_alone(Path(out_dir) / LOCK_NAME, busy):
        _generate(dataset, counts, seed, image_size, progress)
    return dataset


def _generate(dataset: SyntheticDataset, counts: dict[str, int], seed: int, image_size: int,
              progress: bool) -> None:
    from tqdm.auto import tqdm

    # The Karpathy file marks a complete dataset: remove an earlier one until this run ends.
    dataset.karpathy_json.unlink(missing_ok=True)
    out_dir = dataset.karpathy_json.parent
    try:
        with _staging_folder(Path(out_dir)) as staging, tqdm(
            total=sum(counts.values()),
            desc="rendering synthetic images",
            unit="img",
            disable=not progress,
        ) as bar:
            staged = _paths(staging)
            _render_dataset(staged, counts, seed, image_size, bar.update)
            _move_into_place(staged, dataset)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        # Named after the dataset's folder, not the staging folder or a file in it, which are
        # gone.
        raise disk_full(exc.errno, dataset.karpathy_json, None) from exc


def _render_dataset(staged: SyntheticDataset, counts: dict[str, int], seed: int,
                    image_size: int, rendered: Callable[[], Any]) -> None:
    """Render every image of the dataset into ``staged`` with its instances files and, last,
    its Karpathy file; ``rendered()`` is called after each image."""
    info = _info(seed, image_size, counts)
    karpathy_images: list[dict[str, Any]] = []
    annotation_count = 0
    for split_index, split in enumerate(SPLITS):
        split_dir = staged.image_root / split
        split_dir.mkdir(parents=True)
        coco_images: list[dict[str, Any]] = []
        annotations: list[dict[str, Any]] = []
        for index in range(counts[split]):
            rng = np.random.default_rng([seed, split_index, index])
            imgid = len(karpathy_images)
            cocoid = imgid + 1
            filename = f"synthetic_{split}_{cocoid:06d}.png"
            background, objects = _sample_scene(rng, image_size)
            pixels, masks = _render(rng, background, objects, image_size)
            Image.fromarray(pixels).save(split_dir / filename, compress_level=1)
            described = [_described(obj, image_size) for obj in objects]
            captions = describe_scene(described, background, rng)
            karpathy_images.append(_karpathy_record(split, filename, imgid, cocoid, captions))
            coco_images.append(
                {"id": cocoid, "file_name": filename, "width": image_size, "height": image_size}
            )
            annotations += _annotations(objects, masks, cocoid, first_id=annotation_count + 1)
            annotation_count += len(objects)
            rendered()
        instances = {
            "info": info,
            "licenses": [],
            "images": coco_images,
            "annotations": annotations,
            "categories": _COCO_CATEGORIES,
        }
        with atomic_write(staged.instances[split]) as handle:
            json.dump(instances, handle)
    with atomic_write(staged.karpathy_json) as handle:
        json.dump({"images": karpathy_images, "dataset": "synthetic", "info": info}, handle)


@contextmanager
def _staging_folder(out_dir: Path) -> Iterator[Path]:
    """A new hidden folder inside ``out_dir`` (on its file system, so that its files move by
    renaming), removed at the end of the block, whatever ends it. The staging folders that
    runs killed outright left there are removed first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for leftover in out_dir.glob(f"{STAGING_PREFIX}synthetic-*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}synthetic-", dir=out_dir))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staged: SyntheticDataset, dataset: SyntheticDataset) -> None:
    """Move the whole dataset ``staged`` onto ``dataset`` by renames, replacing an earlier
    run's files; its Karpathy file, which marks a complete dataset, comes last."""
    with stops_held():
        for split in SPLITS:
            split_dir = dataset.image_root / split
            split_dir.mkdir(parents=True, exist_ok=True)
            new = {path.name: path for path in (staged.image_root / split).iterdir()}
            for stale in split_dir.glob("synthetic_*.png"):  # an earlier, larger run's
                if stale.name not in new:
                    stale.unlink()
            for name, path in new.items():
                path.replace(split_dir / name)
            staged.instances[split].replace(dataset.instances[split])
        staged.karpathy_json.replace(dataset.karpathy_json)


def _karpathy_record(
    split: str, filename: str, imgid: int, cocoid: int, captions: list[str]
) -> dict[str, Any]:
    """One image of the Karpathy file, with the same fields as ``dataset_coco.json``."""
    sentids = [CAPTIONS_PER_IMAGE * imgid + k for k in range(len(captions))]
    return {
        "filepath": split,
        "filename": filename,
        "imgid": imgid,
        "cocoid": cocoid,
        "split": split,
        "sentids": sentids,
        "sentences": [
            {"tokens": tokenize(raw), "raw": raw, "imgid": imgid, "sentid": sentid}
            for raw, sentid in zip(captions, sentids, strict=True)
        ],
    }


def _annotations(
    objects: list[_Object], masks: list[np.ndarray], image_id: int, *, first_id: int
) -> list[dict[str, Any]]:
    """COCO instance annotations with compressed-RLE masks, as pycocotools writes them."""
    from pycocotools import mask as mask_utils

    annotations = []
    for offset, (obj, mask) in enumerate(zip(objects, masks, strict=True)):
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        annotations.append(
            {
                "id": first_id + offset,
                "image_id": image_id,
                "category_id": CATEGORIES.index(obj.category) + 1,
                "segmentation": {
                    "size": [int(v) for v in rle["size"]],
                    "counts": rle["counts"].decode("ascii"),
                },
                "area": float(mask_utils.area(rle)),
                "bbox": [float(v) for v in mask_utils.toBbox(rle)],
                "iscrowd": 0,
                "colour": obj.colour,
                "size": obj.size,
            }
        )
    return annotations


def _paths(out_dir: Path) -> SyntheticDataset:
    return SyntheticDataset(
        karpathy_json=out_dir / KARPATHY_FILENAME,
        image_root=out_dir / "images",
        instances={split: out_dir / f"instances_{split}.json" for split in SPLITS},
    )


def _info(seed: int, image_size: int, counts: dict[str, int]) -> dict[str, Any]:
    return {
        "description": "captioner synthetic shapes",
        "generator_version": _GENERATOR_VERSION,
        "seed": seed,
        "image_size": image_size,
        "images_per_split": counts,
    }


def _sample_scene(rng: np.random.Generator, image_size: int) -> tuple[str, list[_Object]]:
    background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    n_objects = 1 + int(rng.choice(len(_OBJECT_COUNT_PROBABILITIES), p=_OBJECT_COUNT_PROBABILITIES))
    while True:
        categories = rng.choice(len(CATEGORIES), n_objects, replace=False)
        colours = rng.choice(len(COLOURS), n_objects, replace=False)
        sizes = rng.choice(list(SIZE_FRACTIONS), n_objects)
        # Placing the largest first makes rejection sampling succeed far more often.
        extents = [int(round(rng.uniform(*SIZE_FRACTIONS[s]) * image_size)) for s in sizes]
        order = np.argsort(extents)[::-1]
        boxes = _place(rng, [extents[i] for i in order], image_size)
        if boxes is not None:
            break
    objects = []
    for rank, i in enumerate(order):
        category = CATEGORIES[int(categories[i])]
        objects.append(
            _Object(
                category=category,
                colour=list(COLOURS)[int(colours[i])],
                size=str(sizes[i]),
                box=boxes[rank],
                points=_polygon(rng, category, boxes[rank]),
            )
        )
    return background, objects


def _place(
    rng: np.random.Generator, extents: list[int], image_size: int
) -> list[tuple[int, int, int, int]] | None:
    gap = max(2, int(round(_GAP_FRACTION * image_size)))
    boxes: list[tuple[int, int, int, int]] = []
    for extent in extents:
        for _ in range(_PLACEMENT_TRIES):
            x0, y0 = (int(v) for v in rng.integers(gap, image_size - gap - extent + 1, size=2))
            box = (x0, y0, x0 + extent, y0 + extent)
            if all(_apart(box, other, gap) for other in boxes):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def _apart(a: tuple[int, ...], b: tuple[int, ...], gap: int) -> bool:
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _unit_polygon(category: str) -> np.ndarray:
    """Vertices (n, 2) of the shape centred at 0, before rotation and scaling."""
    if category == "square":
        return np.array([(-1, -1), (1, -1), (1, 1), (-1, 1)], dtype=np.float64)
    if category == "triangle":
        angles = -np.pi / 2 + 2 * np.pi * np.arange(3) / 3
    elif category == "star":
        angles = -np.pi / 2 + np.pi * np.arange(10) / 5
    elif category == "cross":
        a = 1 / 3
        return np.array(
            [
                (-a, -1),
                (a, -1),
                (a, -a),
                (1, -a),
                (1, a),
                (a, a),
                (a, 1),
                (-a, 1),
                (-a, a),
                (-1, a),
                (-1, -a),
                (-a, -a),
            ],
            dtype=np.float64,
        )
    else:
        raise ValueError(f"no polygon for category {category!r}")
    radii = np.where(np.arange(len(angles)) % 2 == 1, 0.45, 1.0) if category == "star" else 1.0
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _polygon(
    rng: np.random.Generator, category: str, box: tuple[int, int, int, int]
) -> tuple[tuple[float, float], ...] | None:
    if category == "circle":
        return None
    angle = np.deg2rad(rng.uniform(-20, 20))
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    points = _unit_polygon(category) @ rotation.T
    points -= (points.min(axis=0) + points.max(axis=0)) / 2
    # Fit the rotated shape into its box (last pixel centre at x1 - 1), keeping its aspect.
    extent = box[2] - box[0] - 1
    points *= extent / (points.max(axis=0) - points.min(axis=0)).max()
    points += ((box[0] + box[2] - 1) / 2, (box[1] + box[3] - 1) / 2)
    return tuple((float(x), float(y)) for x, y in points)


def _render(
    rng: np.random.Generator, background: str, objects: list[_Object], image_size: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Pixels (S, S, 3) uint8 and one bool mask (S, S) per object: exactly the pixels painted
    in the object's colour."""
    pixels = _background(rng, background, image_size)
    masks = []
    for obj in objects:
        canvas = Image.new("L", (image_size, image_size), 0)
        draw = ImageDraw.Draw(canvas)
        if obj.points is None:
            draw.ellipse([obj.box[0], obj.box[1], obj.box[2] - 1, obj.box[3] - 1], fill=1)
        else:
            draw.polygon(obj.points, fill=1)
        mask = np.asarray(canvas, dtype=bool)
        colour = np.array(COLOURS[obj.colour]) + rng.integers(
            -_COLOUR_JITTER, _COLOUR_JITTER + 1, size=3
        )
        pixels[mask] = np.clip(colour, 0, 255).astype(np.uint8)
        masks.append(mask)
    return pixels, masks


def _background(rng: np.random.Generator, kind: str, image_size: int) -> np.ndarray:
    """A smooth low-saturation texture (S, S, 3) uint8, so that the saturated object colours
    stand out. No per-pixel noise: it would make the PNGs ten times larger."""

    def tone() -> np.ndarray:
        return (rng.uniform(70, 190) + rng.uniform(-15, 15, size=3)).astype(np.float32)

    first, second = tone(), tone()
    # Keep the two tones of stripes and gradients visibly different.
    if abs(first.mean() - second.mean()) < 30:
        second = first + np.float32(45.0 if first.mean() < 130 else -45.0)
    if kind == "mottled":
        cells = int(rng.integers(4, 9))
        # Mostly brightness variation with a little tint, to stay low in saturation.
        brightness = rng.normal(0.0, 25.0, size=(cells, cells, 1))
        tint = rng.normal(0.0, 6.0, size=(cells, cells, 3))
        blotches = first + (brightness + tint).astype(np.float32)
        small = Image.fromarray(np.clip(np.rint(blotches), 0, 255).astype(np.uint8))
        return np.array(small.resize((image_size, image_size), Image.Resampling.BICUBIC))
    coordinate = np.arange(image_size, dtype=np.float32)
    angle = rng.uniform(0, np.pi)
    # Position along a random direction, (S, S).
    along = coordinate[None, :] * np.float32(np.cos(angle)) + coordinate[:, None] * np.float32(
        np.sin(angle)
    )
    if kind == "stripes":
        period = np.float32(rng.uniform(0.05, 0.12) * image_size)
        palette = np.clip(np.rint(np.stack([second, first])), 0, 255).astype(np.uint8)
        return palette[((along / period) % 1.0 < 0.5).astype(np.intp)]
    elif kind == "gradient":
        t = (along - along.min()) / (along.max() - along.min())
        image = first + t[..., None] * (second - first)
    else:
        raise ValueError(f"unknown background {kind!r}; expected one of {BACKGROUNDS}")
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def _described(obj: _Object, image_size: int) -> DescribedObject:
    center = ((obj.box[0] + obj.box[2]) / 2, (obj.box[1] + obj.box[3]) / 2)
    return DescribedObject(obj.category, obj.colour, obj.size, center, image_size)
