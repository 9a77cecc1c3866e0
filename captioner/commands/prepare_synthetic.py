"""``captioner prepare-synthetic``: render the embedded synthetic captioning dataset."""

from __future__ import annotations

import argparse

from captioner.commands.options import CommandParser, report_error

HELP = "render the synthetic shapes dataset (Karpathy JSON, PNG images, COCO instance masks)"


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="captioner prepare-synthetic",
        description=(
            "Render scenes of 1-3 coloured shapes on textured backgrounds with five captions "
            "each, as a Karpathy-split JSON file, PNG images and COCO instance annotations. "
            "The output depends only on the seed, the split sizes and the image size."
        ),
    )
    parser.add_argument("--out", required=True, help="output folder (created if needed)")
    parser.add_argument("--train", type=int, default=2000, help="training images (default 2000)")
    parser.add_argument("--val", type=int, default=250, help="validation images (default 250)")
    parser.add_argument("--test", type=int, default=250, help="test images (default 250)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--image-size", type=int, default=256,
        help="side of the square images in pixels (default 256)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from data_prep.paths import check_output_dir
    from data_prep.synthetic import generate

    try:
        check_output_dir(args.out)
        dataset = generate(
            args.out,
            n_train=args.train,
            n_val=args.val,
            n_test=args.test,
            seed=args.seed,
            image_size=args.image_size,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        return report_error("captioner prepare-synthetic", exc)
    rows = [("Karpathy split file", dataset.karpathy_json), ("image root", dataset.image_root)]
    rows += [(f"instances ({split})", path) for split, path in dataset.instances.items()]
    for label, path in rows:
        print(f"{label + ':':<22}{path}")
    return 0
