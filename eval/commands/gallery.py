"""``captioner gallery``: a static page comparing how models attend, side by side.

Captions images with every ``--ckpt`` and writes ``OUT/index.html`` (open it in a browser,
also from file://; no network), with ``OUT/images/``, ``OUT/attention/`` and
``OUT/colorbar.png`` beside it. For each image the page shows one column per model: its name
(as captioner heatmaps names a checkpoint: a run's name for fit's checkpoints, else the file
stem, made unique), its output attention
mapping, its caption and, per word, the attention drawn over the image with the word under
it; hovering over a word shows it large, clicking pins the large view. Left/right arrows (or
k/j) and the buttons move between images; the URL keeps the image number (index.html#3).

Images: files and folders (IMAGE_OR_DIR; the first --n when given), or a seeded sample of --n
readable images of a Karpathy split (--data, --images, --split, --seed). Where fewer than --n
are available, the gallery shows them all and a note on stderr says how many (a smaller gallery
is still a complete one, unlike a rating kit's sample, whose size the study fixes). Unreadable
images are reported by name and skipped; the exit status is then 1, after the page is written.
A split none of whose images is readable under --images (a wrong image root, most likely) is
refused on one line that names the first of them (exit status 2).

OUT must be new or empty: a folder holding an earlier gallery is refused, or, with
--overwrite, emptied and filled anew once the new captions are made (the earlier gallery stays
until then), never a mix of two galleries' files. Files beside an earlier gallery are never
deleted: such a folder is refused, with --overwrite too, and so is an OUT that holds an input
image or lies inside an input folder. A checkpoint or an image given twice is refused.

Colour scale: one scale 0..vmax for every model, word and image of the page; vmax is --vmax
when given (to compare separate galleries), else the largest attention weight of the page.
Zero attention is fully transparent (--zero-style transparent, the default) or opaque white
(white, the paper's figures); every non-zero weight is green. The page's legend says which.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import NamedTuple

from captioner.commands.options import (
    add_decoding_arguments,
    add_figure_arguments,
    add_overwrite_argument,
    add_sample_arguments,
    check_sample_arguments,
    command_parser,
    decoding_options,
    report_error,
)
from data_prep.wording import counted

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
    add_overwrite_argument(parser, "gallery")
    parser.add_argument("--title", default="Attention gallery")
    add_figure_arguments(parser, vmax_default="page maximum")
    add_decoding_arguments(parser)
    return parser


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


def _images(args: argparse.Namespace) -> _Selection:
    if args.data is None:
        from captioner.image_files import collect_images

        given = collect_images(args.inputs)
        paths = given[: args.n]
        note = (f"--n {args.n} but IMAGE_OR_DIR holds only {len(given)} images; showing all "
                f"{len(given)}" if args.n and len(given) < args.n else "")
        return _Selection(paths, [str(p) for p in paths], [], note, {}, {})
    from captioner.training.datamodule import reference_strings
    from data_prep.karpathy import load_karpathy
    from eval.rating_kit import fewer_than_asked, sample_readable

    entries = load_karpathy(args.data, args.images).split(args.split)
    candidates = [(f"{e.path.name} (id {e.image_id})", e.path) for e in entries]
    n = args.n or DEFAULT_SPLIT_SAMPLE
    sample, skipped = sample_readable(candidates, n, args.seed)
    if not sample:  # a wrong --images, most likely: one line, not one per image
        from data_prep.wording import first_names

        raise ValueError(f"{args.data}: the {args.split} split has no images" if not candidates
                         else f"--images {args.images}: none of the {len(candidates)} images of "
                         f"the {args.split} split is readable ({first_names(skipped, 2, '; ')})")
    note = (f"{fewer_than_asked(n, len(sample), len(candidates), f'the {args.split} split')}"
            f"; showing those {len(sample)}" if len(sample) < n else "")
    ids = {f"{e.path.name} (id {e.image_id})": e.image_id for e in entries}
    return _Selection([path for _, path, _ in sample], [name for name, _, _ in sample], skipped,
                      note, {name: ids[name] for name, _, _ in sample},
                      {e.image_id: reference_strings(e) for e in entries})


def _write_page(args: argparse.Namespace, images, models, earlier: bool) -> Path:
    """Write the gallery into --out, replacing the ``earlier`` one (--overwrite) only once the
    new one is whole: one stopped half-way, or of only empty captions (no weight to scale
    colours by), must not replace a good one by none. Returns the page's path."""
    from data_prep.output_folders import result_folder
    from eval.gallery import build_gallery, gallery_scale

    gallery_scale(images, models, vmax=args.vmax, zero_style=args.zero_style)
    with result_folder(args.out, earlier) as out:
        page = build_gallery(out, images, models, title=args.title, vmax=args.vmax,
                             zero_style=args.zero_style, upsample=args.upsample,
                             progress=not args.no_progress)
    return args.out / page.relative_to(out)


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_sample_arguments(parser, args, "IMAGE_OR_DIR", bool(args.inputs))
    with contextlib.ExitStack() as claim:  # the --out folder, held until the command ends
        return _make_gallery(args, claim)


def _make_gallery(args: argparse.Namespace, claim: contextlib.ExitStack) -> int:
    from captioner.heatmaps import checkpoint_names
    from captioner.inference import open_captioner
    from data_prep.output_folders import (
        check_output_folder,
        claimed_output,
        refuse_inputs_in_output,
    )
    from data_prep.text import check_utf8_names
    from eval.gallery import (
        GALLERY_FORMAT,
        GalleryModel,
        add_references,
        caption_gallery,
        gallery_files,
    )

    try:
        names = checkpoint_names(args.ckpt)
        earlier = claim.enter_context(claimed_output(
            args.out, "gallery", lambda: check_output_folder(
                args.out, "gallery", "index.html", f'"format": "{GALLERY_FORMAT}"',
                args.overwrite, gallery_files)))
        captioners = [open_captioner(path, args.device) for path in args.ckpt]
        options = [decoding_options(args, captioner.decoding) for captioner in captioners]
        chosen = _images(args)
        check_utf8_names(chosen.paths, "the gallery's page")
        # With --data, the image root is an input folder too.
        refuse_inputs_in_output(args.out, [*map(Path, args.inputs), *chosen.paths,
                                           *([args.images] if args.data is not None else [])])
    except (OSError, ValueError) as exc:
        return report_error("captioner gallery", exc)
    for error in chosen.skipped:
        print(f"captioner gallery: skipped {error}", file=sys.stderr)
    if chosen.note:
        print(f"captioner gallery: {chosen.note}", file=sys.stderr)

    models = [GalleryModel(name, str(path), captioner.output_attention_name)
              for name, path, captioner in zip(names, args.ckpt, captioners, strict=True)]
    images, failed = caption_gallery(
        captioners, options, chosen.paths, names=chosen.names, batch_size=args.batch_size,
        max_side=args.size, progress=not args.no_progress,
    )
    if chosen.split_references:
        add_references(images, chosen.ids, chosen.split_references)
    for error in failed.values():
        print(f"captioner gallery: skipped {error}", file=sys.stderr)
    if not images:
        print("captioner gallery: no image could be captioned; no gallery written",
              file=sys.stderr)
        return 1
    try:
        page = _write_page(args, images, models, earlier)
    except (OSError, ValueError) as exc:
        return report_error("captioner gallery", exc, status=1)
    print(f"gallery of {counted(len(images), 'image')} x {counted(len(models), 'model')}: "
          f"{page}")
    unreadable = len(chosen.skipped) + len(failed)
    if unreadable:
        print(f"captioner gallery: {unreadable} of {len(chosen.paths) + len(chosen.skipped)} "
              "images could not be read (each is named above)", file=sys.stderr)
        return 1
    return 0
