"""captioner pretrain-encoder: train a ResNet grid encoder on a dataset's instance masks, the
offline stand-in for ImageNet weights (the demo does this on its synthetic scenes).

    cd demo_out/synthetic-500-80-100-256px-seed0
    captioner pretrain-encoder --data dataset_synthetic.json --images images \\
        --train-instances instances_train.json --val-instances instances_val.json \\
        --out encoder.pt
    captioner prepare-features ... --arch resnet18 --layer layer3 --weights encoder.pt

The ResNet up to --layer learns, for every cell of its grid, which object covers it (category,
and colour and size where the annotations carry them; or no object), on random crops of the
training split's images. Per-cell accuracy on the validation split is printed and written with
the settings to NAME.json beside the weights. The weights are a torchvision state_dict of the
ResNet up to --layer (and its untrained fc; the later stages are left out):
prepare-features --weights FILE and model.encoder_weights: FILE load it with that layer.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from captioner.commands.options import add_overwrite_argument, command_parser
from captioner.features.pretraining_settings import (
    PretrainingSettings,
    describe_accuracy,
    pretraining_report_path,
)

HELP = "pretrain a ResNet grid encoder on per-cell labels from COCO instance masks"
PROG = "captioner pretrain-encoder"
_HELP = {
    "arch": "ResNet depth",
    "layer": "last ResNet stage: layer3 (stride 16) or layer4 (stride 32)",
    "image_size": "images are resized to this many pixels square",
    "crop": "training crop side in pixels, a multiple of the stride",
    "epochs": "passes over the training split",
    "batch_size": "crops per step",
    "lr": "AdamW learning rate (cosine decay to 0)",
    "seed": "seed of the initialization, crops and order",
}


def main(argv: list[str]) -> int:
    parser = command_parser(PROG, __doc__)
    parser.add_argument("--data", required=True, type=Path, help="Karpathy-split JSON file")
    parser.add_argument("--images", required=True, type=Path, help="image root folder")
    parser.add_argument("--train-instances", required=True, type=Path,
                        help="COCO instances file of the training split's images")
    parser.add_argument("--val-instances", required=True, type=Path,
                        help="COCO instances file of the validation split's images")
    parser.add_argument("--out", required=True, type=Path, help="weights file to write (.pt)")
    add_overwrite_argument(parser)
    defaults = PretrainingSettings()
    for field in fields(PretrainingSettings):
        default = getattr(defaults, field.name)
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(default),
                            default=default, help=f"{_HELP[field.name]} (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    settings = PretrainingSettings(**{f.name: getattr(args, f.name) for f in fields(defaults)})

    from captioner.features.pretraining import pretrain_encoder
    from data_prep.paths import OutputPathError, check_output_file

    reads = [("dataset file", args.data), ("instances file", args.train_instances),
             ("instances file", args.val_instances)]
    try:
        if pretraining_report_path(args.out) == args.out:
            raise OutputPathError(f"--out {args.out}: the report is written beside the weights "
                                  "as NAME.json; give the weights another name, such as "
                                  f"{args.out.with_suffix('.pt').name}")
        for path in (args.out, pretraining_report_path(args.out)):
            # Before the training: weights that caches and checkpoints were made with are
            # replaced only when asked to.
            check_output_file(path, reads, overwrite=args.overwrite)
            if path.resolve().is_relative_to(args.images.resolve()):
                raise OutputPathError(f"{path}: lies inside the image folder {args.images} this "
                                      "command reads, where it could replace an image; write "
                                      "it elsewhere")
        report = pretrain_encoder(
            args.data, args.images, {"train": args.train_instances, "val": args.val_instances},
            args.out, settings, progress=not args.no_progress,
        )
    except (ValueError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"{PROG}: {message}", file=sys.stderr)
        return 2
    print(describe_accuracy(report))
    print(f"wrote {args.out} and {pretraining_report_path(args.out)}")
    return 0

