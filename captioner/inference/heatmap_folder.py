"""Per-word attention heatmaps of images by one or more checkpoints, drawn into a folder on one
colour scale, with an index: what ``captioner heatmaps`` runs (the drawing is
:mod:`captioner.inference.heatmaps`). torch is imported when the work starts, so that the command's
options are read at once (hence no type-only imports here: jsonargparse runs them to read the
signature)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from captioner.model.decoding_options import DecodingOverrides, apply_overrides
from captioner.reporting import report_error
from data_prep.settings_files import check_options_at_least
from data_prep.wording import counted

PROG = "captioner heatmaps"
# What marks a folder as an earlier run's output: the key that every index.json of
# `captioner heatmaps` holds.
INDEX_TAG = '"vmax_rule"'
# captioner.inference.heatmaps' UPSAMPLE_MODES, ZERO_STYLES, COLORMAPS, DEFAULT_MAX_SIDE,
# MIN_MAX_SIDE and MAX_MAX_SIDE, which it imports numpy and PIL to define:
# tests/test_heatmaps_cmd.py checks that they agree.
Upsample = Literal["nearest", "bilinear"]
ZeroStyle = Literal["transparent", "white"]
Colormap = Literal["Greens", "Blues", "Purples", "Reds", "Oranges", "Greys"]
DEFAULT_SIZE = 384
SIZE_RANGE = (32, 4096)


def check_figure_options(size: int, vmax: float | None = None) -> None:
    """ValueError naming ``size`` (the longer side of a figure, in pixels) or ``vmax`` (the
    colour scale's maximum) when out of range: a figure smaller than 32 px cannot show the
    cells a word attends to; past 4096 px its pixels no longer fit in memory."""
    low, high = SIZE_RANGE
    if not low <= size <= high:
        raise ValueError(f"--size must be between {low} and {high} pixels, got {size}")
    if vmax is not None and not 0 < vmax < math.inf:
        raise ValueError(f"--vmax must be a finite number > 0, got {vmax}")


@dataclass(frozen=True)
class FigureStyle:
    """How attention is drawn over the images (``captioner heatmaps`` and ``gallery``).

    Args:
        upsample: attention cells drawn as blocks (nearest) or smoothed (bilinear).
        size: longer image side in pixels, 32 to 4096.
        zero_style: zero attention fully transparent or a white mask.
        vmax: colour-scale maximum (default: the largest weight drawn together).
        colormap: colour scale of the weights, light to dark (Greens, the paper's; another
            where the images are green themselves).
    """

    upsample: Upsample = "nearest"
    size: int = DEFAULT_SIZE
    zero_style: ZeroStyle = "transparent"
    vmax: float | None = None
    colormap: Colormap = "Greens"


class _Model(NamedTuple):
    """One --ckpt of the run, as captioning and drawing use it."""

    name: str  # its folder under --out (captioner.inference.heatmaps.checkpoint_names)
    checkpoint: Path
    captioner: object  # captioner.inference.pipeline.Captioner
    decoding: object  # its DecodingOptions, with the command line's decoding options


def draw_heatmaps(
    inputs: Sequence[Path],
    ckpt: list[Path],
    out: Path,
    overwrite: bool = False,
    figure: FigureStyle = FigureStyle(),
    decoding: DecodingOverrides | None = None,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = True,
) -> int:
    """Caption ``inputs`` with every checkpoint of ``ckpt`` and draw the per-word attention
    figures into ``out``; the exit status: 0, 1 when an image could not be read (named, the
    others drawn), 2 for a user error (one line, before anything is captioned).

    Args:
        inputs: image files and folders of images.
        ckpt: trained checkpoint; repeat to compare models on one colour scale.
        out: output folder.
        overwrite: replace the heatmaps of an earlier run in --out, wholly (default: --out
            must be new or empty).
        figure: how the figures are drawn; its vmax defaults to the run's largest weight.
        decoding: decoding options; each not given is the checkpoint's own.
        batch_size: images per batch.
        device: torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu).
        progress: show progress bars.
    """
    with contextlib.ExitStack() as claim:  # the --out folder, held until the work ends
        try:
            check_figure_options(figure.size, figure.vmax)
            check_options_at_least([("batch_size", batch_size, 1)])
            earlier, paths, models = _open(inputs, ckpt, Path(out), overwrite, decoding,
                                           device, claim)
        except (OSError, ValueError) as exc:
            return report_error(PROG, exc)
        return _draw(paths, models, Path(out), earlier, figure, batch_size, progress)


def _open(inputs, ckpts, out, overwrite, decoding, device, claim):
    """Everything checked before an image is captioned: the checkpoints' names, --out
    (claimed), the images and the checkpoints. Returns (the earlier heatmaps in --out or
    None, the image paths, the models); raises OSError or ValueError."""
    from captioner.inference.heatmaps import checkpoint_names, index_entries
    from captioner.inference.image_files import collect_images
    from captioner.inference.pipeline import open_captioner
    from data_prep.output_folders import (
        check_output_folder,
        claimed_output,
        refuse_inputs_in_output,
    )
    from data_prep.text import check_utf8_names

    ckpts = [Path(path) for path in ckpts]
    names = checkpoint_names(ckpts)
    earlier = claim.enter_context(claimed_output(out, "heatmaps", lambda: check_output_folder(
        out, "heatmaps", "index.json", INDEX_TAG, overwrite, index_entries)))
    paths = collect_images(inputs)
    check_utf8_names(paths, "the heatmaps' index.json")
    refuse_inputs_in_output(out, [*map(Path, inputs), *paths])
    captioners = [open_captioner(path, device) for path in ckpts]
    models = [_Model(name, path, captioner, apply_overrides(captioner.decoding, decoding))
              for name, path, captioner in zip(names, ckpts, captioners, strict=True)]
    return earlier, paths, models


def _draw(paths, models, out, earlier, style, batch_size, progress) -> int:
    """Caption, scale, draw and index; the exit status."""
    from captioner.inference.heatmaps import shared_vmax, unique_stems
    from data_prep.atomic import atomic_write
    from data_prep.output_folders import result_folder

    progress = progress and len(paths) > 1
    captions, failed = _caption_all(models, paths, batch_size, progress)
    for error in failed.values():
        print(f"{PROG}: skipped {error}", file=sys.stderr)
    if not captions:
        print(f"{PROG}: no image could be captioned", file=sys.stderr)
        return 1
    # Folders are named after every path, so that a skipped image does not rename the others.
    images = [(path, folder) for path, folder in zip(paths, unique_stems(paths), strict=True)
              if path not in failed]
    try:
        # Before an earlier result goes: only empty captions leave no weight to scale by.
        vmax = style.vmax or shared_vmax(c.attention.float().numpy() for c in captions.values())
        with result_folder(out, earlier) as folder:
            index = _write_figures(folder, style, models, captions, images, vmax, progress)
            with atomic_write(folder / "index.json") as handle:
                json.dump(index, handle, indent=1, ensure_ascii=False)
    except (OSError, ValueError) as exc:
        return report_error(PROG, exc, status=1)
    print(f"wrote heatmaps of {counted(len(images), 'image')} x "
          f"{counted(len(models), 'model')} to {out} (colour scale 0..{vmax:.4g})")
    if failed:
        print(f"{PROG}: {len(failed)} of {len(paths)} images could not be read", file=sys.stderr)
        return 1
    return 0


def _caption_all(models: list[_Model], paths: list[Path], batch_size: int, progress: bool):
    """Every model's caption of every path, keyed (model name, path), and the error of each
    path that some model could not read."""
    captions = {}
    failed: dict[Path, str] = {}
    for model in models:
        for result, caption in model.captioner.caption_files(
            paths, model.decoding, batch_size=batch_size, progress=progress
        ):
            if caption is None:
                failed[result.path] = result.error
            else:
                captions[model.name, result.path] = caption
    return captions, failed


def _write_figures(out: Path, style: FigureStyle, models: list[_Model], captions,
                   images: list[tuple[Path, str]], vmax: float, progress: bool) -> dict:
    """Draw the figures of ``images`` (path, folder name) into ``out/MODEL/FOLDER/`` (--out,
    or where the result is drawn before it replaces an earlier one), with ``captions`` keyed
    (model name, path); returns the index of the run, whose paths are relative to ``out``."""
    from tqdm import tqdm

    from captioner.inference.heatmaps import AttentionRecord, write_heatmaps
    from data_prep.images import load_image

    index = {"vmax": vmax, "vmax_rule": "--vmax" if style.vmax else "maximum weight of the run",
             "zero_style": style.zero_style, "upsample": style.upsample,
             "colormap": style.colormap, "images": []}
    for path, folder in tqdm(images, desc="figures", unit="image", disable=not progress,
                             file=sys.stderr):
        image = load_image(path)
        for model in models:
            caption = captions[model.name, path]
            record = AttentionRecord(str(path), caption.text, list(caption.tokens),
                                     caption.attention.float().numpy(),
                                     model.captioner.output_attention_name, vmax)
            files = write_heatmaps(out / model.name / folder, image, record,
                                   zero_style=style.zero_style, upsample=style.upsample,
                                   max_side=style.size, model=model.name,
                                   colours=style.colormap)
            index["images"].append({
                "image": str(path), "model": model.name, "checkpoint": str(model.checkpoint),
                "mapping": record.mapping, "caption": caption.text,
                "files": [str(f.relative_to(out)) for f in files],
            })
    return index
