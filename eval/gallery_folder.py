"""A static gallery page comparing how models attend, side by side, written into a folder: what
``captioner gallery`` runs (the page is :mod:`eval.gallery`). torch is imported when the work
starts, so that the command's options are read at once (hence no type-only imports here:
jsonargparse runs them to read the signature)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from captioner.inference.heatmap_folder import FigureStyle, check_figure_options
from captioner.model.decoding_options import DecodingOverrides, apply_overrides
from captioner.reporting import report_error
from data_prep.settings_files import check_options_at_least
from data_prep.wording import counted
from eval.rating.kit import check_image_source

PROG = "captioner gallery"
DEFAULT_SPLIT_SAMPLE = 20


class _Selection(NamedTuple):
    """The images to show: their paths and shown names, the errors of unreadable images passed
    over while sampling a Karpathy split, a note when fewer than --n are available ("" if
    not), and with --data each shown name's image id and every image of the split with its
    references (empty without --data)."""

    paths: list[Path]
    names: list[str]
    skipped: list[str]
    note: str
    ids: dict[str, int]
    split_references: dict[int, list[str]]


class _Source(NamedTuple):
    """Where the images come from: files, or a seeded sample of a Karpathy split."""

    inputs: Sequence[Path]
    data: Path | None
    images: Path | None
    split: str
    n: int | None
    seed: int


def make_gallery(
    ckpt: list[Path],
    out: Path,
    inputs: Sequence[Path] = (),
    data: Path | None = None,
    images: Path | None = None,
    split: Literal["train", "val", "test"] = "test",
    n: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    title: str = "Attention gallery",
    figure: FigureStyle = FigureStyle(),
    decoding: DecodingOverrides | None = None,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = True,
) -> int:
    """Caption images with every checkpoint of ``ckpt`` and write the gallery page into
    ``out``; the exit status: 0, 1 when an image could not be read (named, the page written),
    2 for a user error (one line, before anything is captioned).

    Args:
        ckpt: checkpoint of one model; repeat for every model to compare.
        out: gallery folder to write.
        inputs: image files or folders (searched recursively).
        data: Karpathy split JSON (dataset_coco.json).
        images: image root of the Karpathy JSON.
        split: split of --data to sample from.
        n: images to show (Karpathy split: a seeded sample, default 20; files: the first N,
            default all).
        seed: sampling seed of --data.
        overwrite: replace the gallery of an earlier run in --out, wholly (default: --out
            must be new or empty).
        title: page title.
        figure: how the figures are drawn; its vmax defaults to the page's largest weight.
        decoding: decoding options; each not given is the checkpoint's own.
        batch_size: images per batch.
        device: torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu).
        progress: show progress bars.
    """
    source = _Source(inputs, data, images, split, n, seed)
    ckpt, out = [Path(path) for path in ckpt], Path(out)
    with contextlib.ExitStack() as claim:  # the --out folder, held until the work ends
        try:
            _check_numbers(figure, n, seed, batch_size)
            check_image_source("IMAGE_OR_DIR", bool(inputs), data, images)
            earlier, names, captioners, chosen = _open(ckpt, out, overwrite, source, device,
                                                       claim)
        except (OSError, ValueError) as exc:
            return report_error(PROG, exc)
        options = [apply_overrides(captioner.decoding, decoding) for captioner in captioners]
        return _make(ckpt, out, earlier, names, captioners, options, chosen,
                     dict(title=title, figure=figure, batch_size=batch_size,
                          progress=progress))


def _check_numbers(figure: FigureStyle, n: int | None, seed: int, batch_size: int) -> None:
    """ValueError naming the first number out of range."""
    check_figure_options(figure.size, figure.vmax)
    # numpy's generators take no negative seed.
    check_options_at_least([("n", n, 1), ("batch_size", batch_size, 1), ("seed", seed, 0)])


def _open(ckpt, out, overwrite, source: _Source, device, claim):
    """Everything checked before an image is captioned. Returns (the earlier gallery in
    --out or None, the models' names, their captioners, the images); raises OSError or
    ValueError."""
    from captioner.inference.heatmaps import checkpoint_names
    from captioner.inference.pipeline import open_captioner
    from data_prep.output_folders import (
        check_output_folder,
        claimed_output,
        refuse_inputs_in_output,
    )
    from data_prep.text import check_utf8_names
    from eval.gallery import GALLERY_FORMAT, gallery_files

    names = checkpoint_names(ckpt)
    earlier = claim.enter_context(claimed_output(out, "gallery", lambda: check_output_folder(
        out, "gallery", "index.html", f'"format": "{GALLERY_FORMAT}"', overwrite,
        gallery_files)))
    captioners = [open_captioner(path, device) for path in ckpt]
    chosen = _chosen_images(source)
    check_utf8_names(chosen.paths, "the gallery's page")
    # With --data, the image root is an input folder too.
    refuse_inputs_in_output(out, [*map(Path, source.inputs), *chosen.paths,
                                  *([source.images] if source.data is not None else [])])
    return earlier, names, captioners, chosen


def _chosen_images(source: _Source) -> _Selection:
    if source.data is None:
        from captioner.inference.image_files import collect_images

        given = collect_images(source.inputs)
        paths = given[: source.n]
        note = (f"--n {source.n} but IMAGE_OR_DIR holds only {len(given)} images; showing all "
                f"{len(given)}" if source.n and len(given) < source.n else "")
        return _Selection(paths, [str(p) for p in paths], [], note, {}, {})
    from captioner.training.datamodule import reference_strings
    from data_prep.karpathy import load_karpathy
    from eval.gallery import split_image_names
    from eval.rating.kit import fewer_than_asked, sample_readable

    entries = load_karpathy(source.data, source.images).split(source.split)
    shown = split_image_names(entries, Path(source.images))
    candidates = [(name, entry.path) for name, entry in zip(shown, entries, strict=True)]
    n = source.n or DEFAULT_SPLIT_SAMPLE
    sample, skipped = sample_readable(candidates, n, source.seed)
    if not sample:  # a wrong --images, most likely: one line, not one per image
        from data_prep.wording import first_names

        raise ValueError(
            f"{source.data}: the {source.split} split has no images" if not candidates
            else f"--images {source.images}: none of the {len(candidates)} images of the "
            f"{source.split} split is readable ({first_names(skipped, 2, '; ')})")
    note = (f"{fewer_than_asked(n, len(sample), len(candidates), f'the {source.split} split')}"
            f"; showing those {len(sample)}" if len(sample) < n else "")
    ids = {name: entry.image_id for name, entry in zip(shown, entries, strict=True)}
    return _Selection([path for _, path, _ in sample], [name for name, _, _ in sample], skipped,
                      note, {name: ids[name] for name, _, _ in sample},
                      {e.image_id: reference_strings(e) for e in entries})


def _make(ckpt, out, earlier, names, captioners, options, chosen: _Selection, style) -> int:
    """Caption, draw and write the page; the exit status."""
    from eval.gallery import GalleryModel, add_references, caption_gallery

    for error in chosen.skipped:
        print(f"{PROG}: skipped {error}", file=sys.stderr)
    if chosen.note:
        print(f"{PROG}: {chosen.note}", file=sys.stderr)
    models = [GalleryModel(name, str(path), captioner.output_attention_name)
              for name, path, captioner in zip(names, ckpt, captioners, strict=True)]
    images, failed = caption_gallery(
        captioners, options, chosen.paths, names=chosen.names, batch_size=style["batch_size"],
        max_side=style["figure"].size, progress=style["progress"])
    if chosen.split_references:
        add_references(images, chosen.ids, chosen.split_references)
    for error in failed.values():
        print(f"{PROG}: skipped {error}", file=sys.stderr)
    if not images:
        print(f"{PROG}: no image could be captioned; no gallery written", file=sys.stderr)
        return 1
    try:
        page = _write_page(out, images, models, earlier, style)
    except (OSError, ValueError) as exc:
        return report_error(PROG, exc, status=1)
    print(f"gallery of {counted(len(images), 'image')} x {counted(len(models), 'model')}: "
          f"{page}")
    unreadable = len(chosen.skipped) + len(failed)
    if unreadable:
        print(f"{PROG}: {unreadable} of {len(chosen.paths) + len(chosen.skipped)} images could "
              "not be read (each is named above)", file=sys.stderr)
        return 1
    return 0


def _write_page(out: Path, images, models, earlier, style: dict) -> Path:
    """Write the gallery into ``out``, replacing the ``earlier`` one (--overwrite) only once
    the new one is whole: one stopped half-way, or of only empty captions (no weight to scale
    colours by), must not replace a good one by none. Returns the page's path."""
    from data_prep.output_folders import result_folder
    from eval.gallery import build_gallery, gallery_scale

    figure = style["figure"]
    gallery_scale(images, models, vmax=figure.vmax, zero_style=figure.zero_style)
    with result_folder(out, earlier) as folder:
        page = build_gallery(folder, images, models, title=style["title"], vmax=figure.vmax,
                             zero_style=figure.zero_style, upsample=figure.upsample,
                             colours=figure.colormap,
                             progress=style["progress"])
    return out / page.relative_to(folder)
