"""``captioner rating-kit``: build the blinded human-rating kit of the paper's appendix B.

Samples ``--n`` images (seeded) from a Karpathy split (``--data``, ``--images``, ``--split``)
or from an image folder, captions them with every ``--ckpt``, and writes a static page to
``--out`` (open ``OUT/index.html`` in a browser, also from file://) plus the blinding key to
``--key`` (default ``OUT-key.json`` beside the kit folder; never inside it). See
`eval.rating_kit` for the page and `captioner rating-summary` for the analysis.

An existing key is never replaced silently: ratings collected with its kit can be unblinded
only with it. A key that exists, or an OUT that is not new or empty, is refused before any
work; with --overwrite an earlier kit and its key are replaced (the earlier kit stays until
the new captions are made); files beside an earlier kit are never deleted: such a folder is
refused, with --overwrite too, and so is an OUT that holds an image to sample or lies inside
IMAGE_DIR. A checkpoint given twice is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

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

HELP = "build a blinded human-rating kit (static HTML) comparing checkpoints"


def _parser() -> argparse.ArgumentParser:
    parser = command_parser("captioner rating-kit", __doc__)
    parser.add_argument("image_dir", nargs="?", type=Path, metavar="IMAGE_DIR",
                        help="sample from the images of this folder instead of a Karpathy split")
    parser.add_argument("--ckpt", required=True, type=Path, action="append",
                        help="checkpoint of one model; repeat for every model to compare")
    add_sample_arguments(
        parser, n_default=100, n_help="images to sample (default: %(default)s)",
        seed_help="seed of the sample and of the blinding (default: %(default)s)",
    )
    parser.add_argument("--out", required=True, type=Path, help="kit folder to write")
    parser.add_argument("--key", type=Path, help="key file (default: OUT-key.json)")
    add_overwrite_argument(parser, "rating kit (and its key)")
    parser.add_argument("--title", default="Image caption rating",
                        help="page title (default: %(default)s)")
    add_figure_arguments(parser)
    add_decoding_arguments(parser)
    return parser


def _candidates(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(key, path) of every image to sample from, in a deterministic order."""
    if args.image_dir is not None:
        from captioner.image_files import collect_images

        root = args.image_dir
        return [(p.relative_to(root).as_posix(), p) for p in collect_images([root])]
    from data_prep.karpathy import load_karpathy

    entries = load_karpathy(args.data, args.images).split(args.split)
    return [(str(entry.image_id), entry.path) for entry in entries]


def _check_key(path: Path, overwrite: bool, reads: list[tuple[str, Path]]) -> bool:
    """Check, before any work, that the key can be written to ``path``; returns whether it
    replaces an earlier key (only with ``overwrite``).

    Raises:
        OutputPathError: ``path`` cannot be written, is one of the files the command
            ``reads`` ((what, path) pairs), is a file but not a key (also with ``overwrite``),
            or holds a key and ``overwrite`` is False (the ratings of its kit could never be
            unblinded again).
    """
    from data_prep.paths import OutputPathError, check_output_file
    from eval.rating_kit import is_key_file

    check_output_file(path, reads)
    if not path.exists():
        return False
    if not is_key_file(path):
        raise OutputPathError(f"{path}: exists and is not the blinding key of a rating kit, "
                              "which --overwrite alone may replace; choose another --key")
    if not overwrite:
        raise OutputPathError(
            f"{path}: the blinding key of an earlier kit exists; ratings of that kit cannot be "
            "unblinded without it: choose another --out (or --key), or keep a copy of it and "
            "pass --overwrite to replace kit and key"
        )
    return True


def _caption_sample(args: argparse.Namespace, sample, captioners, options) -> list:
    """KitImage of each sampled (key, path, image), with every model's caption of it; the
    sampled images are decoded already, so every model captions them from memory."""
    from eval.rating_kit import KitCaption, KitImage

    pictures = [image for _, _, image in sample]
    captions: list[list[KitCaption]] = [[] for _ in sample]
    for captioner, decoding in zip(captioners, options, strict=True):
        results = captioner.caption(pictures, decoding, batch_size=args.batch_size,
                                    progress=not args.no_progress)
        for i, caption in enumerate(results):
            captions[i].append(KitCaption(caption.text, list(caption.tokens),
                                          caption.attention.float().numpy()))
    # An IMAGE_DIR image's key is its path inside the folder: unique, where file names may
    # repeat in two subfolders; a split's key is its image id, shown beside its file name.
    return [KitImage(key, key if args.image_dir is not None else path.name, image, caps)
            for (key, path, image), caps in zip(sample, captions, strict=True)]


def _write_kit(args: argparse.Namespace, images, models, key_path: Path, earlier: bool):
    """Write the kit into --out and its key to ``key_path``, replacing the ``earlier`` kit
    (--overwrite) only once the new one is whole, so that it is never replaced by none (one
    stopped half-way, or of only empty captions). Returns the `RatingKit`."""
    from data_prep.output_folders import result_folder
    from data_prep.stop_signals import stops_held
    from eval.rating_kit import build_kit, kit_scale, write_key

    vmax = kit_scale(images, models)
    with contextlib.ExitStack() as kit_and_key:
        with result_folder(args.out, earlier) as out:
            kit = build_kit(out, images, models, seed=args.seed, title=args.title,
                            upsample=args.upsample, max_side=args.size, vmax=vmax)
            # From the key's write until the kit is in place, a stop waits: a kit without its
            # key could never be unblinded. A failed write keeps the earlier kit and key.
            # The kit's id, in both, tells a key of another kit apart (rating-summary refuses it).
            kit_and_key.enter_context(stops_held())
            write_key(kit.key, key_path)
    return dataclasses.replace(kit, html=args.out / kit.html.relative_to(out))


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_sample_arguments(parser, args, "IMAGE_DIR", args.image_dir is not None)
    # The default key lies beside the kit folder, named after it ("." names no folder).
    kit = args.out.resolve()
    if args.key is None and not kit.name:
        parser.error(f"--out {args.out}: the kit needs a folder of its own (its key is written "
                     "beside it), not the root folder")
    key_path = args.key or kit.with_name(kit.name + "-key.json")
    if key_path.resolve().is_relative_to(args.out.resolve()):
        parser.error(f"the key {key_path} must not be inside the kit folder {args.out}")
    with contextlib.ExitStack() as claim:  # the --out folder, held until the command ends
        return _make_kit(args, key_path, claim)


def _make_kit(args: argparse.Namespace, key_path: Path, claim: contextlib.ExitStack) -> int:
    from captioner.heatmaps import checkpoint_names
    from captioner.inference import open_captioner
    from data_prep.output_folders import (
        check_output_folder,
        claimed_output,
        refuse_inputs_in_output,
    )
    from data_prep.text import check_utf8_names
    from eval.rating_kit import KIT_FORMAT, KitModel, fewer_than_asked, kit_files, sample_readable

    try:
        names = checkpoint_names(args.ckpt)
        candidates = _candidates(args)
        check_utf8_names((path for _, path in candidates), "the rating kit's page")
        # With --data, the image root is an input folder too.
        roots = [args.image_dir] if args.image_dir is not None else [args.images]
        refuse_inputs_in_output(args.out, [*roots, *(path for _, path in candidates)])
        reads = [*(("checkpoint", path) for path in args.ckpt),
                 *([("dataset file", args.data)] if args.data is not None else []),
                 *(("image", path) for _, path in candidates)]
        replaces_key = _check_key(key_path, args.overwrite, reads)
        earlier = claim.enter_context(claimed_output(
            args.out, "rating kit", lambda: check_output_folder(
                args.out, "rating kit", "index.html", f'"format": "{KIT_FORMAT}"',
                args.overwrite, kit_files)))
        captioners = [open_captioner(path, args.device) for path in args.ckpt]
        options = [decoding_options(args, captioner.decoding) for captioner in captioners]
    except (OSError, ValueError) as exc:
        return report_error("captioner rating-kit", exc)
    sample, skipped = sample_readable(candidates, args.n, args.seed)
    for error in skipped:
        print(f"captioner rating-kit: skipped {error}", file=sys.stderr)
    if len(sample) < args.n:
        where = str(args.image_dir) if args.image_dir is not None else f"the {args.split} split"
        print(f"captioner rating-kit: "
              f"{fewer_than_asked(args.n, len(sample), len(candidates), where)}", file=sys.stderr)
        return 2

    models = [KitModel(name, str(path), c.output_attention_name)
              for name, path, c in zip(names, args.ckpt, captioners, strict=True)]
    images = _caption_sample(args, sample, captioners, options)
    try:
        kit = _write_kit(args, images, models, key_path, earlier)
    except (OSError, ValueError) as exc:
        return report_error("captioner rating-kit", exc, status=1)
    print(f"rating kit {kit.kit_id}: {counted(len(images), 'image')} x "
          f"{counted(len(models), 'model')} -> {kit.html}")
    print(f"blinding key (keep it from the raters): {key_path}"
          + (" (replaced the earlier key)" if replaces_key else ""))
    if skipped:
        print(f"captioner rating-kit: {len(skipped)} of the images drawn could not be read "
              "(each is named above); others were drawn in their place", file=sys.stderr)
        return 1
    return 0
