"""The blinded human-rating kit of the paper's human study (Martins et al., appendix B).

For each sampled image, raters score the caption of every model from 1 to 5 and the relevance
of the regions the model attended to when generating the caption's non-stop words, from 1 to
5. Models are blinded: on every image the captions are shown under the labels A, B, C... in an
order drawn at random for that image, so a label says nothing about the model, within or
across images. Attention plots use one colour scale for all models and words, zero attention
fully transparent (appendix B: "to avoid biasing the evaluators").

`build_kit` writes a self-contained static folder that works from ``file://`` without a
network (no external scripts, styles or fonts):

    index.html            the rating page (data, script and style inline)
    images/NNNN.jpg       the sampled images, longer side `max_side` pixels
    attention/NNNN_L_WW.png  RGBA overlay of label L's word WW: alpha 0 where attention is 0

The key from (image, label) to model is returned separately, for `write_key` to store outside
the kit; the page never contains model names or checkpoint paths. Ratings exported by the page
follow `RATINGS_FORMAT` (see `eval.rating.summary`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from captioner.inference.heatmaps import (
    DEFAULT_MAX_SIDE,
    attention_overlay,
    image_array,
    shared_vmax,
    upsample_attention,
)
from data_prep.atomic import atomic_write
from data_prep.images import ImageLoadError, load_image
from data_prep.settings_files import parse_json
from data_prep.wording import counted
from eval.rating.stopwords import content_word_indices
from eval.static_page import page_files, render_page

KIT_FORMAT = "captioner-rating-kit/1"
# What `build_kit` writes directly inside its folder (see the layout above); its page's data
# lists the images and overlays it wrote inside them.
KIT_ENTRIES = ("index.html", "images", "attention")
KEY_FORMAT = "captioner-rating-key/1"
RATINGS_FORMAT = "captioner-ratings/1"
SCORES = (1, 2, 3, 4, 5)
LABELS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True)
class KitModel:
    """A rated model: its name (written to the key only), checkpoint path and mapping name."""

    name: str
    checkpoint: str
    mapping: str


@dataclass
class KitCaption:
    """One model's caption of one image: tokens (T) and output attention float (T, h, w)."""

    text: str
    tokens: list[str]
    attention: np.ndarray


@dataclass
class KitImage:
    """A sampled image: ``key`` identifies it in ratings and key (unique), ``name`` is shown
    to raters, ``captions`` holds one caption per model, in the order of the models."""

    key: str
    name: str
    image: Image.Image
    captions: list[KitCaption]


@dataclass
class RatingKit:
    """What `build_kit` wrote: the page, and the key to keep away from raters."""

    html: Path
    kit_id: str
    key: dict


def blind_orders(n_images: int, n_models: int, seed: int) -> list[list[int]]:
    """Per image, the model shown under label A, B, ...: a seeded random permutation."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n_models).tolist() for _ in range(n_images)]


def kit_scale(images: Sequence[KitImage], models: Sequence[KitModel],
              vmax: float | None = None) -> float:
    """Check that ``images`` and ``models`` make a kit and return its colour-scale maximum
    (``vmax``, default the largest weight in the kit). A caller can ask before it removes
    anything, so that an earlier kit is never replaced by none.

    Raises:
        ValueError: no model, more models than labels, an image key given twice, an image
            without one caption per model, only empty captions (with no ``vmax``) or no
            positive weight.
    """
    if not models:
        raise ValueError("a rating kit needs at least one model")
    if len(models) > len(LABELS):
        raise ValueError(f"at most {len(LABELS)} models can be blinded, got {len(models)}")
    keys = [item.key for item in images]
    if len(set(keys)) != len(keys):
        raise ValueError("image keys of a rating kit must be unique")
    for item in images:
        if len(item.captions) != len(models):
            raise ValueError(
                f"image {item.key!r}: {len(item.captions)} captions for {len(models)} models"
            )
    if vmax is None:
        if not any(c.tokens for item in images for c in item.captions):
            raise ValueError(f"every caption of the {len(images)} sampled images is empty (an "
                             "under-trained checkpoint writes some): the kit would have nothing "
                             "to rate; train the models further")
        vmax = shared_vmax(c.attention for item in images for c in item.captions)
    return vmax


def build_kit(
    out_dir: Path,
    images: Sequence[KitImage],
    models: Sequence[KitModel],
    *,
    seed: int,
    title: str = "Image caption rating",
    upsample: str = "nearest",
    max_side: int = DEFAULT_MAX_SIDE,
    vmax: float | None = None,
) -> RatingKit:
    """Write the rating kit for ``images`` captioned by ``models`` into ``out_dir``.

    vmax: colour-scale maximum shared by every plot; default the largest weight in the kit.

    Raises:
        ValueError: as :func:`kit_scale`, before any file is written.
    """
    vmax = kit_scale(images, models, vmax)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    (out_dir / "attention").mkdir(exist_ok=True)

    orders = blind_orders(len(images), len(models), seed)
    page_images, key_images = [], []
    for number, (item, order) in enumerate(zip(images, orders, strict=True), start=1):
        base = image_array(item.image, max_side)
        src = f"images/{number:04d}.jpg"
        Image.fromarray(base).save(out_dir / src, quality=92)
        shown = []
        for label, model_index in zip(LABELS, order, strict=False):
            caption = item.captions[model_index]
            words = content_word_indices(caption.tokens)
            maps = (
                upsample_attention(np.asarray(caption.attention)[words], base.shape[:2], upsample)
                if words
                else []
            )
            plots = []
            for word_index, weights in zip(words, maps, strict=True):
                overlay = f"attention/{number:04d}_{label}_{word_index:02d}.png"
                Image.fromarray(attention_overlay(weights, vmax)).save(out_dir / overlay)
                plots.append(
                    {"index": word_index, "word": caption.tokens[word_index], "overlay": overlay}
                )
            shown.append({"label": label, "text": caption.text, "words": plots})
        page_images.append(
            {
                "key": item.key,
                "name": item.name,
                "src": src,
                "width": int(base.shape[1]),
                "height": int(base.shape[0]),
                "captions": shown,
            }
        )
        key_images.append(
            {
                "key": item.key,
                "name": item.name,
                "labels": {LABELS[k]: models[m].name for k, m in enumerate(order)},
            }
        )

    content = {
        "format": KIT_FORMAT,
        "ratings_format": RATINGS_FORMAT,
        "title": title,
        "scores": list(SCORES),
        "vmax": vmax,
        "images": page_images,
    }
    kit_id = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    page = out_dir / "index.html"
    with atomic_write(page) as handle:
        handle.write(render_page("rating_kit", {**content, "kit_id": kit_id}, title))
    key = {
        "format": KEY_FORMAT,
        "kit_id": kit_id,
        "seed": seed,
        "vmax": vmax,
        "models": [vars(m) for m in models],
        "images": key_images,
    }
    return RatingKit(page, kit_id, key)


def kit_files(folder: Path) -> set[str]:
    """What `build_kit` wrote into ``folder``, as paths relative to it (``index.html``,
    ``images/0001.jpg``, ...): its fixed entries and the files its page lists; none of the
    files inside ``images/`` and ``attention/`` when the page cannot be read."""
    return {*KIT_ENTRIES, *page_files(folder / "index.html")}


def sample_readable(
    candidates: Sequence[tuple[str, Path]], n: int, seed: int
) -> tuple[list[tuple[str, Path, Image.Image]], list[str]]:
    """``n`` readable images of ``candidates`` ((key, path) pairs): the first readable ones of
    a permutation seeded by ``seed``, with their decoded images; and the reasons of the
    unreadable ones met on the way (reported, never sampled)."""
    order = random.Random(seed).sample(list(candidates), len(candidates))
    sample, skipped = [], []
    for key, path in order:
        if len(sample) == n:
            break
        try:
            sample.append((key, path, load_image(path)))
        except ImageLoadError as exc:
            skipped.append(str(exc))
    return sample, skipped


def fewer_than_asked(n: int, found: int, total: int, where: str) -> str:
    """Why ``--n n`` gives only ``found`` of the ``total`` images ``where`` (the test split, a
    folder): the images are too few, or too few of them are readable."""
    if found == total:
        return f"--n {n} but {where} has only {counted(total, 'image')}"
    return f"--n {n} but only {found} of the {total} images in {where} are readable"


def write_key(key: dict, path: Path) -> None:
    """Store the blinding key (keep it away from the raters)."""
    with atomic_write(path) as handle:
        json.dump(key, handle, indent=1, ensure_ascii=False)


def is_key_file(path: Path) -> bool:
    """Whether the file ``path`` is a key :func:`write_key` wrote (by its ``format``)."""
    try:
        with path.open("rb") as handle:
            data = parse_json(handle.read())
    except (OSError, ValueError):  # ValueError: not JSON, not text
        return False
    return isinstance(data, dict) and data.get("format") == KEY_FORMAT


def check_image_source(files: str, files_given: bool, data: Path | None,
                       images: Path | None) -> None:
    """ValueError unless the images come from exactly one source: the files (``files``, the
    command's positional, given or not) or a Karpathy split file ``data`` with its image root
    ``images``."""
    if files_given == (data is not None):
        raise ValueError(f"give either {files} or --data (with --images), not both or neither")
    if data is not None and images is None:
        raise ValueError("--data needs --images (the image root)")
