"""``captioner gallery``: a static page comparing how models attend, side by side.

Captions images with every ``--ckpt`` and writes ``OUT/index.html`` (open it in a browser,
also from file://; no network), with ``OUT/images/``, ``OUT/attention/`` and
``OUT/colorbar.png`` beside it. For each image the page shows one column per model: its name
(the checkpoint's file stem, made unique as in captioner heatmaps), its output attention
mapping, its caption and, per word, the attention drawn over the image with the word under
it; hovering over a word shows it large, clicking pins the large view. Left/right arrows (or
k/j) and the buttons move between images; the URL keeps the image number (index.html#3).

Images: files and folders (IMAGE_OR_DIR; the first --n when given), or a seeded sample of --n
readable images of a Karpathy split (--data, --images, --split, --seed). Unreadable images are
reported by name and skipped; the exit status is then 1, after the page is written.

Colour scale: one scale 0..vmax for every model, word and image of the page; vmax is --vmax
when given (to compare separate galleries), else the largest attention weight of the page.
Zero attention is fully transparent (--zero-style transparent, the default) or opaque white
(white, the paper's figures); every non-zero weight is green. The page's legend says which.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioner.commands.options import (
    add_decoding_arguments,
    add_figure_arguments,
    add_sample_arguments,
    check_sample_arguments,
    command_parser,
    decoding_options,
    report_error,
)

HELP = "side-by-side attention gallery of several checkpoints (static HTML)"
DEFAULT_SPLIT_SAMPLE = 20


def _parser() -> argparse.ArgumentParser:
    parser = command_parser("captioner gallery", __doc__)
    parser.add_argument("inputs", nargs="*", metavar="IMAGE_OR_DIR",
                        help="image files or folders (searched recursively)")
    parser.add_argument("--ckpt", required=True, type=Path, action="append",
                        help="checkpoint of one model; repeat for every model to compare")
    add_sample_arguments(
        parser, n_default=None, seed_help="sampling seed of --data (default: %(default)s)",
        n_help=f"images to show (Karpathy split: a seeded sample, default "
               f"{DEFAULT_SPLIT_SAMPLE}; files: the first N, default all)",
    )
    parser.add_argument("--out", required=True, type=Path, help="gallery folder to write")
    parser.add_argument("--title", default="Attention gallery")
    add_figure_arguments(parser, vmax_default="page maximum")
    add_decoding_arguments(parser)
    return parser


def _images(args: argparse.Namespace) -> tuple[list[Path], list[str], list[str]]:
    """Paths of the images to show, their shown names, and the errors of unreadable images
    passed over while sampling a Karpathy split."""
    if args.data is None:
        from captioner.image_files import collect_images

        paths = collect_images(args.inputs)[: args.n]
        return paths, [str(p) for p in paths], []
    from data_prep.karpathy import load_karpathy
    from eval.rating_kit import sample_readable

    entries = load_karpathy(args.data, args.images).split(args.split)
    candidates = [(f"{e.path.name} (id {e.image_id})", e.path) for e in entries]
    sample, skipped = sample_readable(candidates, args.n or DEFAULT_SPLIT_SAMPLE, args.seed)
    return [path for _, path, _ in sample], [name for name, _, _ in sample], skipped


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_sample_arguments(parser, args, "IMAGE_OR_DIR", bool(args.inputs))

    from captioner.heatmaps import checkpoint_names
    from captioner.inference import open_captioner
    from data_prep.files import check_output_dir
    from eval.gallery import GalleryModel, build_gallery, caption_gallery

    try:
        check_output_dir(args.out)
        captioners = [open_captioner(path, args.device) for path in args.ckpt]
        options = [decoding_options(args, captioner.decoding) for captioner in captioners]
        paths, names, skipped = _images(args)
    except (OSError, ValueError) as exc:
        return report_error("captioner gallery", exc)
    for error in skipped:
        print(f"captioner gallery: skipped {error}", file=sys.stderr)

    models = [GalleryModel(name, str(path), captioner.output_attention_name)
              for name, path, captioner in zip(checkpoint_names(args.ckpt), args.ckpt, captioners,
                                               strict=True)]
    images, failed = caption_gallery(
        captioners, options, paths, names=names, batch_size=args.batch_size,
        max_side=args.size, progress=not args.no_progress,
    )
    for error in failed.values():
        print(f"captioner gallery: skipped {error}", file=sys.stderr)
    if not images:
        print("captioner gallery: no image could be captioned; no gallery written",
              file=sys.stderr)
        return 1
    try:
        page = build_gallery(args.out, images, models, title=args.title, vmax=args.vmax,
                             zero_style=args.zero_style, upsample=args.upsample,
                             progress=not args.no_progress)
    except ValueError as exc:  # e.g. only empty captions: no weight to scale colours by
        return report_error("captioner gallery", exc, status=1)
    print(f"gallery of {len(images)} images x {len(models)} models: {page}")
    unreadable = len(skipped) + len(failed)
    if unreadable:
        print(f"captioner gallery: {unreadable} of {len(paths) + len(skipped)} images could "
              "not be read (each is named above)", file=sys.stderr)
        return 1
    return 0
