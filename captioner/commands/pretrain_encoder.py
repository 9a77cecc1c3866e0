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

Options may come from a YAML file (--config FILE; --print_config writes one).
"""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from captioner.features.pretraining_settings import PretrainingSettings, pretrain_encoder_file

HELP = "pretrain a ResNet grid encoder on per-cell labels from COCO instance masks"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner pretrain-encoder", __doc__, pretrain_encoder_file,
                             skip=("settings",))
    parser.add_class_arguments(PretrainingSettings, None)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    settings = PretrainingSettings(**arguments_of(PretrainingSettings, args))
    return pretrain_encoder_file(**arguments_of(pretrain_encoder_file, args), settings=settings)
