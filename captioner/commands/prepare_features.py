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

Options may come from a YAML file (--config FILE; --print_config writes one).
"""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from captioner.features.preparation import default_workers, prepare_feature_cache
from data_prep.wording import names

HELP = "cache frozen-encoder grid features (float16, HDF5) for the images of a Karpathy JSON"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner prepare-features", __doc__, prepare_feature_cache)
    parser.set_defaults(num_workers=default_workers())  # shown in --help
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    parser.check_option("splits", names("split"), args.splits)
    return prepare_feature_cache(**arguments_of(prepare_feature_cache, args))
