"""``captioner heatmaps``: per-word output-attention figures for captioned images.

For every checkpoint MODEL and readable image STEM it writes ``OUT/MODEL/STEM/``:

* ``NN_word.png``: the image (own aspect ratio up to 4:1, longer side ``--size`` pixels)
  with the attention of word NN (0-based) drawn over it (see `captioner.heatmaps`);
* ``strip.png``: the whole caption, one panel per word, with the colour bar;
* ``attention.npz`` and ``attention.json``: the raw weights (tokens, grid, T x h x w maps).

MODEL names the checkpoint: a run's checkpoint (``runs/NAME/version_N/checkpoints/F.ckpt``, as
``fit`` writes it) is ``NAME``, then ``NAME_vN`` and ``NAME_vN_F`` where that is shared; any other
checkpoint is named by its file stem, as STEM names the image, both sanitized
(``[A-Za-z0-9._-]``): when two share one, their parent folder's name goes in front
(``models/tvmax/last.ckpt`` -> ``tvmax_last``), and a short hash of the full path behind if
that is still shared (``captioner.heatmaps.checkpoint_names``).
``OUT/index.json`` lists every image's files, caption and the colour scale.

OUT must be new or empty: a folder holding an earlier run's heatmaps is refused, or, with
--overwrite, emptied and filled anew once the new captions are made (the earlier figures stay
until then); figures of two runs in one folder would be drawn on two colour scales, with only
the last run indexed. Files beside an earlier run's heatmaps are never deleted: such a folder
is refused, with --overwrite too, and so is an OUT that holds an input image or lies inside an
input folder (its figures would be read as images by the next run). A checkpoint given twice
is refused, and so is an image
(also by two spellings of its path, or as a file and inside a folder given): its figures would
go once into one folder but twice into the index.

Colour scale: one scale 0..vmax for every word, image and model of the run, so colours are
comparable across them. vmax is ``--vmax`` when given (use it to compare separate runs), else
the largest attention weight of the whole run. Zero attention is transparent (``--zero-style
transparent``, the default) or a hard white mask (``white``, the paper's figure style).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from captioner.commands.options import (
    add_decoding_arguments,
    add_figure_arguments,
    add_overwrite_argument,
    command_parser,
    decoding_options,
    report_error,
)
from data_prep.wording import counted

if TYPE_CHECKING:
    from captioner.decoding_options import DecodingOptions
    from captioner.inference import Captioner

HELP = "per-word attention heatmaps, caption strips and raw weights for images"
# What marks a folder as an earlier run's output: the key that every index.json of
# `captioner heatmaps` holds.
INDEX_TAG = '"vmax_rule"'


def _parser() -> argparse.ArgumentParser:
    parser = command_parser("captioner heatmaps", __doc__)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR")
    parser.add_argument("--ckpt", required=True, type=Path, action="append",
                        help="trained checkpoint; repeat to compare models on one colour scale")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    add_overwrite_argument(parser, "heatmaps")
    add_figure_arguments(parser, vmax_default="run maximum")
    add_decoding_arguments(parser)
    return parser


class _Model(NamedTuple):
    """One --ckpt of the run, as captioning and drawing use it."""

    name: str  # its folder under --out (captioner.heatmaps.checkpoint_names)
    checkpoint: Path
    captioner: Captioner
    decoding: DecodingOptions  # the checkpoint's, with the command line's decoding options


def _caption_all(args: argparse.Namespace, models: list[_Model], paths: list[Path],
                 progress: bool):
    """Every model's caption of every path, keyed (model name, path), and the error of each
    path that some model could not read."""
    captions = {}
    failed: dict[Path, str] = {}
    for model in models:
        for result, caption in model.captioner.caption_files(
            paths, model.decoding, batch_size=args.batch_size, progress=progress
        ):
            if caption is None:
                failed[result.path] = result.error
            else:
                captions[model.name, result.path] = caption
    return captions, failed


def _write_figures(out: Path, args: argparse.Namespace, models: list[_Model], captions,
                   images: list[tuple[Path, str]], vmax: float, progress: bool) -> dict:
    """Draw the figures of ``images`` (path, folder name) into ``out/MODEL/FOLDER/`` (--out,
    or where the result is drawn before it replaces an earlier one), with ``captions`` keyed
    (model name, path); returns the index of the run, whose paths are relative to ``out``."""
    from tqdm import tqdm

    from captioner.heatmaps import AttentionRecord, write_heatmaps
    from data_prep.images import load_image

    index = {"vmax": vmax, "vmax_rule": "--vmax" if args.vmax else "maximum weight of the run",
             "zero_style": args.zero_style, "upsample": args.upsample, "images": []}
    for path, folder in tqdm(images, desc="figures", unit="image", disable=not progress,
                             file=sys.stderr):
        image = load_image(path)
        for model in models:
            caption = captions[model.name, path]
            record = AttentionRecord(str(path), caption.text, list(caption.tokens),
                                     caption.attention.float().numpy(),
                                     model.captioner.output_attention_name, vmax)
            files = write_heatmaps(out / model.name / folder, image, record,
                                   zero_style=args.zero_style, upsample=args.upsample,
                                   max_side=args.size, model=model.name)
            index["images"].append({
                "image": str(path), "model": model.name, "checkpoint": str(model.checkpoint),
                "mapping": record.mapping, "caption": caption.text,
                "files": [str(f.relative_to(out)) for f in files],
            })
    return index


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    with contextlib.ExitStack() as claim:  # the --out folder, held until the command ends
        return _make_heatmaps(args, claim)


def _make_heatmaps(args: argparse.Namespace, claim: contextlib.ExitStack) -> int:
    from captioner.heatmaps import (
        checkpoint_names,
        index_entries,
        shared_vmax,
        unique_stems,
    )
    from captioner.image_files import collect_images
    from captioner.inference import open_captioner
    from data_prep.atomic import atomic_write
    from data_prep.output_folders import (
        check_output_folder,
        claimed_output,
        refuse_inputs_in_output,
        result_folder,
    )
    from data_prep.text import check_utf8_names

    try:
        names = checkpoint_names(args.ckpt)
        earlier = claim.enter_context(claimed_output(
            args.out, "heatmaps", lambda: check_output_folder(
                args.out, "heatmaps", "index.json", INDEX_TAG, args.overwrite, index_entries)))
        paths = collect_images(args.inputs)
        check_utf8_names(paths, "the heatmaps' index.json")
        refuse_inputs_in_output(args.out, [*map(Path, args.inputs), *paths])
        captioners = [open_captioner(path, args.device) for path in args.ckpt]
        models = [_Model(name, path, captioner, decoding_options(args, captioner.decoding))
                  for name, path, captioner in zip(names, args.ckpt, captioners, strict=True)]
    except (OSError, ValueError) as exc:
        return report_error("captioner heatmaps", exc)

    progress = not args.no_progress and len(paths) > 1
    captions, failed = _caption_all(args, models, paths, progress)
    for error in failed.values():
        print(f"captioner heatmaps: skipped {error}", file=sys.stderr)
    if not captions:
        print("captioner heatmaps: no image could be captioned", file=sys.stderr)
        return 1
    # Folders are named after every path, so that a skipped image does not rename the others.
    images = [(path, folder) for path, folder in zip(paths, unique_stems(paths), strict=True)
              if path not in failed]
    try:
        # Before an earlier result goes: only empty captions leave no weight to scale by.
        vmax = args.vmax or shared_vmax(c.attention.float().numpy() for c in captions.values())
        with result_folder(args.out, earlier) as out:
            index = _write_figures(out, args, models, captions, images, vmax, progress)
            with atomic_write(out / "index.json") as handle:
                json.dump(index, handle, indent=1, ensure_ascii=False)
    except (OSError, ValueError) as exc:
        return report_error("captioner heatmaps", exc, status=1)
    print(f"wrote heatmaps of {counted(len(images), 'image')} x "
          f"{counted(len(models), 'model')} to {args.out} "
          f"(colour scale 0..{vmax:.4g})")
    if failed:
        print(f"captioner heatmaps: {len(failed)} of {len(paths)} images could not be read",
              file=sys.stderr)
        return 1
    return 0
