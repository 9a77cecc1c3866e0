"""A side-by-side attention gallery: every model's caption of every image, one heatmap per word.

`build_gallery` writes a self-contained static folder that works from ``file://`` without a
network (no external scripts, styles or fonts):

    index.html               the gallery (data, script and style inline)
    colorbar.png             the colour scale 0..vmax, drawn as the overlays are
    images/NNNN.jpg          the images, as displayed (`captioner.inference.heatmaps.image_array`)
    attention/NNNN_MM_WW.png RGBA overlay of model MM's word WW on image NNNN

Colours follow `captioner.inference.heatmaps`: one scale 0..vmax for every model, word and image
of the page (vmax: the largest weight of all maps, or the caller's), every non-zero weight
coloured (green, or the caller's colour map) at a constant opacity, and zero weight either fully
transparent (the image shows unchanged) or opaque white (``zero_style="white"``, the paper's
figures). The page states that rule in its legend. Unlike the rating kit nothing is blinded:
each column names its model.

The page reads its data from a JSON element (format ``captioner-gallery/1``): ``vmax``,
``vmax_given`` (False: vmax is the largest weight), ``max_weight``, ``zero_style``, ``hue``
(the colour of the weights, in a word), ``upsample``, ``colorbar``, ``models`` [{name,
mapping}] and ``images`` [{name, src, width, height, references, captions: one per model
[{text, cider, words: [{word, overlay}]}]}], paths relative to the page; ``references`` (the
image's reference captions) is empty and ``cider``
(CIDEr-D against them, the split's IDF) null where no references are known.

`caption_gallery` captions image files with several `captioner.inference.pipeline.Captioner` objects
and returns what `build_gallery` needs.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from tqdm import tqdm

from captioner.inference.heatmaps import (
    COLORMAPS,
    DEFAULT_MAX_SIDE,
    ZERO_STYLES,
    attention_overlay,
    hue,
    image_array,
    shared_vmax,
    upsample_attention,
)
from data_prep.atomic import atomic_write
from eval.static_page import page_files, render_page

if TYPE_CHECKING:
    from data_prep.karpathy import ImageEntry

GALLERY_FORMAT = "captioner-gallery/1"
# What `build_gallery` writes directly inside its folder (see the layout above); its page's
# data lists the images and overlays it wrote inside them.
GALLERY_ENTRIES = ("index.html", "colorbar.png", "images", "attention")
COLORBAR_STEPS = 256


@dataclass(frozen=True)
class GalleryModel:
    """A model of the gallery: its shown name (checkpoint stem), checkpoint path, output
    attention mapping."""

    name: str
    checkpoint: str
    mapping: str


@dataclass
class GalleryCaption:
    """One model's caption of one image: tokens (T) and output attention float (T, h, w);
    ``cider``, its CIDEr-D against the image's references, where they are known."""

    text: str
    tokens: list[str]
    attention: np.ndarray
    cider: float | None = None


@dataclass
class GalleryImage:
    """An image of the gallery: ``name`` is shown, ``pixels`` is the image as displayed
    (uint8 (H, W, 3), see `captioner.inference.heatmaps.image_array`), ``captions`` one per model,
    ``references`` its reference captions where they are known (a Karpathy split's)."""

    name: str
    pixels: np.ndarray
    captions: list[GalleryCaption]
    references: list[str] = field(default_factory=list)


def split_image_names(entries: Sequence[ImageEntry], image_root: Path) -> list[str]:
    """The names a gallery shows the images of a Karpathy split by, one per entry: the file
    name, or where two images of the split share it (COCO's ``train2014/`` and ``val2014/``
    may), the path relative to ``image_root``; then the image id:
    ``val2014/COCO_1.jpg (id 1)``. The split's loader has confined every path to the root."""
    file_names = Counter(entry.path.name for entry in entries)
    shown = [entry.path.name if file_names[entry.path.name] == 1
             else entry.path.relative_to(image_root).as_posix() for entry in entries]
    return [f"{name} (id {entry.image_id})" for name, entry in zip(shown, entries, strict=True)]


def add_references(images: Sequence[GalleryImage], shown_ids: Mapping[str, int],
                   split_references: Mapping[int, Sequence[str]]) -> None:
    """Give each image its reference captions and each of its captions its CIDEr-D against
    them. ``shown_ids`` maps an image's shown name to its id in ``split_references``, every
    image of the split with its tokenized references: the IDF weights are the whole split's,
    as in the scores of ``captioner test`` and ``evaluate``, not those of the few images shown.
    """
    from captioner.cider import cider_d

    ids = [shown_ids[item.name] for item in images]
    for item, image_id in zip(images, ids, strict=True):
        item.references = list(split_references[image_id])
    models = len(images[0].captions) if images else 0
    for model in range(models):
        hypotheses = {image_id: [""] for image_id in split_references}
        hypotheses.update({image_id: [item.captions[model].text]
                           for item, image_id in zip(images, ids, strict=True)})
        _, scores = cider_d(split_references, hypotheses)
        by_id = dict(zip(hypotheses, scores, strict=True))
        for item, image_id in zip(images, ids, strict=True):
            item.captions[model].cider = by_id[image_id]


def zero_styled_overlay(weights: np.ndarray, vmax: float, zero_style: str,
                        colours: str = COLORMAPS[0]) -> np.ndarray:
    """`captioner.inference.heatmaps.attention_overlay` of one upsampled map (H, W) in the colour
    map ``colours``, uint8 RGBA (H, W, 4); with ``zero_style="white"`` the zero pixels are
    opaque white instead of fully transparent (drawn over the image, the same as
    ``compose(..., "white")``)."""
    if zero_style not in ZERO_STYLES:
        raise ValueError(f"zero style must be one of {ZERO_STYLES}, got {zero_style!r}")
    overlay = attention_overlay(weights, vmax, colours)
    if zero_style == "white":
        overlay[overlay[..., 3] == 0] = 255
    return overlay


def colorbar(vmax: float, width: int = COLORBAR_STEPS, height: int = 16,
             colours: str = COLORMAPS[0]) -> np.ndarray:
    """The colour bar, uint8 RGBA (height, width, 4): weights from vmax / width to vmax, left
    to right, through `attention_overlay` (the overlays' colours and opacity)."""
    ramp = np.linspace(vmax / width, vmax, width, dtype=np.float32)
    return attention_overlay(np.broadcast_to(ramp, (height, width)), vmax, colours)


def gallery_scale(
    images: Sequence[GalleryImage],
    models: Sequence[GalleryModel],
    *,
    vmax: float | None = None,
    zero_style: str = "transparent",
) -> tuple[float, float]:
    """Check that ``images`` and ``models`` make a gallery and return its colour scale: vmax
    (``vmax``, default the largest weight) and the largest weight. A caller can ask before it
    removes anything, so that an earlier gallery is never replaced by none.

    Raises:
        ValueError: no model or image, an image without one caption per model, a caption
            whose attention does not have one map per token, no positive weight, vmax <= 0,
            an unknown zero style.
    """
    if not models:
        raise ValueError("a gallery needs at least one model")
    if not images:
        raise ValueError("a gallery needs at least one image")
    if zero_style not in ZERO_STYLES:
        raise ValueError(f"zero style must be one of {ZERO_STYLES}, got {zero_style!r}")
    for item in images:
        if len(item.captions) != len(models):
            raise ValueError(
                f"image {item.name!r}: {len(item.captions)} captions for {len(models)} models"
            )
        for model, caption in zip(models, item.captions, strict=True):
            shape = np.shape(caption.attention)
            if len(shape) != 3 or shape[0] != len(caption.tokens):
                raise ValueError(
                    f"image {item.name!r}, model {model.name!r}: attention of shape {shape} "
                    f"for {len(caption.tokens)} tokens, expected ({len(caption.tokens)}, h, w)"
                )
    maps = [c.attention for item in images for c in item.captions if np.size(c.attention)]
    max_weight = max((float(np.max(m)) for m in maps), default=0.0)
    vmax = shared_vmax(maps) if vmax is None else vmax
    if not vmax > 0:
        raise ValueError(f"vmax must be positive, got {vmax}")
    return vmax, max_weight


def build_gallery(
    out_dir: Path,
    images: Sequence[GalleryImage],
    models: Sequence[GalleryModel],
    *,
    title: str = "Attention gallery",
    vmax: float | None = None,
    zero_style: str = "transparent",
    upsample: str = "nearest",
    colours: str = COLORMAPS[0],
    progress: bool = False,
) -> Path:
    """Write the gallery of ``images`` captioned by ``models`` into ``out_dir``; returns the
    path of ``index.html``, written last (atomically), once every image file exists.

    vmax: colour-scale maximum of every overlay; default the largest weight of the gallery.

    Raises:
        ValueError: as :func:`gallery_scale`, before any file is written; an unknown
            upsampling mode.
    """
    given = vmax is not None
    vmax, max_weight = gallery_scale(images, models, vmax=vmax, zero_style=zero_style)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    (out_dir / "attention").mkdir(exist_ok=True)
    Image.fromarray(colorbar(vmax, colours=colours)).save(out_dir / "colorbar.png")

    page_images = []
    for number, item in enumerate(
        tqdm(images, desc="gallery", unit="image", disable=not progress, file=sys.stderr),
        start=1,
    ):
        src = f"images/{number:04d}.jpg"
        Image.fromarray(item.pixels).save(out_dir / src, quality=92)
        captions = []
        for model_index, caption in enumerate(item.captions):
            maps = upsample_attention(caption.attention, item.pixels.shape[:2], upsample) \
                if caption.tokens else []
            words = []
            for word_index, (word, weights) in enumerate(zip(caption.tokens, maps, strict=True)):
                overlay = f"attention/{number:04d}_{model_index:02d}_{word_index:02d}.png"
                pixels = zero_styled_overlay(weights, vmax, zero_style, colours)
                Image.fromarray(pixels).save(out_dir / overlay)
                words.append({"word": word, "overlay": overlay})
            captions.append({"text": caption.text, "words": words,
                             "cider": _finite_or_none(caption.cider)})
        page_images.append({
            "name": item.name, "src": src, "width": int(item.pixels.shape[1]),
            "height": int(item.pixels.shape[0]), "captions": captions,
            "references": item.references,
        })

    content = {
        "format": GALLERY_FORMAT,
        "title": title,
        "vmax": float(vmax),
        "vmax_given": given,
        "max_weight": max_weight,
        "zero_style": zero_style,
        "hue": hue(colours),
        "upsample": upsample,
        "colorbar": "colorbar.png",
        "models": [{"name": m.name, "mapping": m.mapping} for m in models],
        "images": page_images,
    }
    page = out_dir / "index.html"
    with atomic_write(page) as handle:
        handle.write(render_page("gallery", content, title))
    return page


def _finite_or_none(score: float | None) -> float | None:
    """A score as the page's JSON holds it: NaN (CIDEr of a one-image split) is none."""
    return score if score is not None and math.isfinite(score) else None


def gallery_files(folder: Path) -> set[str]:
    """What `build_gallery` wrote into ``folder``, as paths relative to it (``index.html``,
    ``images/0001.jpg``, ...): its fixed entries and the files its page lists; none of the
    files inside ``images/`` and ``attention/`` when the page cannot be read."""
    return {*GALLERY_ENTRIES, *page_files(folder / "index.html")}


def caption_gallery(
    captioners: Sequence,
    options: Sequence,
    paths: Sequence[Path],
    *,
    names: Sequence[str] | None = None,
    batch_size: int = 16,
    max_side: int = DEFAULT_MAX_SIDE,
    progress: bool = False,
) -> tuple[list[GalleryImage], dict[Path, str]]:
    """Caption ``paths`` with every `captioner.inference.pipeline.Captioner` of ``captioners`` (each
    with its `DecodingOptions` of ``options``), model after model.

    names: the name shown for each path (default: the path as given).

    Returns the images that every model captioned, in the order of ``paths``, with their
    displayed pixels (longer side ``max_side``), and the error of each file that could not be
    read (by any model: a file changed on disk between two models is dropped too).
    """
    names = [str(p) for p in paths] if names is None else list(names)
    if len(names) != len(paths):
        raise ValueError(f"{len(names)} names for {len(paths)} images")
    pixels: dict[int, np.ndarray] = {}
    captions: dict[int, list[GalleryCaption]] = {i: [] for i in range(len(paths))}
    failed: dict[Path, str] = {}
    for captioner, decoding in zip(captioners, options, strict=True):
        results = captioner.caption_files(paths, decoding, batch_size=batch_size,
                                          progress=progress)
        for i, (result, caption) in enumerate(results):
            if caption is None:
                failed.setdefault(result.path, result.error)
                continue
            if i not in pixels:  # the first model that read it keeps the displayed image
                pixels[i] = image_array(result.image, max_side)
            captions[i].append(GalleryCaption(caption.text, list(caption.tokens),
                                              caption.attention.float().numpy()))
    images = [
        GalleryImage(names[i], pixels[i], captions[i])
        for i in range(len(paths))
        if len(captions[i]) == len(captioners)
    ]
    return images, failed
