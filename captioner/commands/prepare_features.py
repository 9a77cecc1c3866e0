"""captioner prepare-features: encode every image once with a frozen ResNet and cache the
float16 grid features (HDF5, keyed by image id) for training with a frozen encoder.

    captioner prepare-features --data data/coco/dataset_coco.json --images data/coco/images \\
        --arch resnet101 --weights IMAGENET1K_V2 --out data/coco/features_resnet101.h5

Every image is checked before the encoder runs; unusable files (missing, empty, not an image,
truncated, too large) are all listed at once, and with --on-error skip the others are encoded
and the skipped ones recorded in the cache and in NAME.skipped.json. The cache is committed
after every batch to .NAME.partial.h5 beside it: when a run is interrupted (even killed), the
same command continues from the images already encoded, and the finished cache is the same as
an uninterrupted run's.

The cache records the encoder configuration (arch, layer, weights, image size); training checks
it against the model's encoder. With --weights none the encoder is randomly initialized and its
batch-norm statistics are estimated on the first training images; those weights are saved
beside the cache (NAME.encoder.pt) and recorded as the weights: train on the cache with
--model.encoder_weights NAME.encoder.pt, so that the model holds the very encoder that produced
it. Run again once finished, the command has nothing to do; a finished cache made with other
settings is refused, never overwritten.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioner.commands.options import DEVICE_HELP, command_parser, names, report_error
from captioner.features.extraction import extract_features
from captioner.features.settings import ON_ERROR
from data_prep.machine import usable_cpus

HELP = "cache frozen-encoder grid features (float16, HDF5) for the images of a Karpathy JSON"
PROG = "captioner prepare-features"


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(PROG, __doc__)
    parser.add_argument("--data", required=True, type=Path, help="Karpathy-split JSON file")
    parser.add_argument("--images", required=True, type=Path, help="image root folder")
    parser.add_argument("--out", required=True, type=Path, help="HDF5 cache file to write")
    parser.add_argument("--arch", default="resnet101", help="ResNet depth (default: %(default)s)")
    parser.add_argument(
        "--layer",
        default="layer4",
        help="last ResNet stage kept: layer4 (stride 32, the paper) or layer3 (stride 16) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--weights",
        default="IMAGENET1K_V2",
        help="torchvision weights name, a local state_dict file, or 'none' (random init) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--image-size", type=int, default=256,
        help="images are resized to this many pixels square (default: %(default)s)",
    )
    parser.add_argument(
        "--splits", type=names("split"), default="train,val,test",
        help="comma-separated splits (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="images per batch (default: %(default)s)"
    )
    parser.add_argument(
        "--num-workers", type=int, default=min(2, usable_cpus()),
        help="image-reading worker processes (1 where only one CPU is usable; default: 2)",
    )
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    parser.add_argument(
        "--seed", type=int, default=0,
        help="random-init seed, with --weights none (default: %(default)s)",
    )
    parser.add_argument(
        "--on-error", choices=ON_ERROR, default="fail",
        help="unusable images: fail lists them all and stops before encoding; skip encodes "
        "the others and records the skipped ones (default: %(default)s)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)

    from captioner.inference import resolve_device
    from captioner.model.encoder import EncoderWeightsError

    weights = None if args.weights.lower() == "none" else args.weights
    try:
        config = extract_features(
            args.data,
            args.images,
            args.out,
            arch=args.arch,
            layer=args.layer,
            weights=weights,
            image_size=args.image_size,
            splits=tuple(args.splits),
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            device=str(resolve_device(args.device)),
            seed=args.seed,
            progress=not args.no_progress,
            on_error=args.on_error,
            log=print,
        )
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; run the same command again to continue from the images "
              "already encoded", file=sys.stderr)
        return 130
    except (ValueError, OSError, EncoderWeightsError) as exc:
        return report_error(PROG, exc)
    print(f"feature cache {args.out} (encoder: {config})")
    _print_next_steps(args.data, args.images, args.out, config)
    return 0


def _print_next_steps(data: Path, images: Path, cache: Path, encoder: dict) -> None:
    from captioner.commands.next_steps import fit_command, machine_setup

    print("next:")
    print(f"  {fit_command(machine_setup().config, data, images, cache, encoder)}")
