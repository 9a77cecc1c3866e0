"""``captioner rating-kit``: build the blinded human-rating kit of the paper's appendix B.

Samples ``--n`` images (seeded) from a Karpathy split (``--data``, ``--images``, ``--split``)
or from an image folder, captions them with every ``--ckpt``, and writes a static page to
``--out`` (open ``OUT/index.html`` in a browser, also from file://) plus the blinding key to
``--key`` (default ``OUT-key.json`` beside the kit folder; never inside it). See
`eval.rating.kit` for the page and `captioner rating-summary` for the analysis.

An existing key is never replaced silently: ratings collected with its kit can be unblinded
only with it. A key that exists, or an OUT that is not new or empty, is refused before any
work; with --overwrite an earlier kit and its key are replaced (the earlier kit stays until
the new captions are made); files beside an earlier kit are never deleted: such a folder is
refused, with --overwrite too, and so is an OUT that holds an image to sample or lies inside
IMAGE_DIR. A checkpoint given twice is refused.

Options may come from a YAML file (--config FILE; --print_config writes one); decoding
defaults to each checkpoint's own options.
"""

from __future__ import annotations

from pathlib import Path

from captioner.commands.options import (
    FunctionParser,
    add_options_of,
    arguments_of,
    function_parser,
    options_of,
)
from captioner.model.decoding_options import DecodingOverrides
from eval.rating.kit import check_image_source
from eval.rating.kit_folder import key_path_of, make_rating_kit

HELP = "build a blinded human-rating kit (static HTML) comparing checkpoints"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner rating-kit", __doc__, make_rating_kit,
                             skip=("image_dir", "decoding"))
    parser.add_argument("image_dir", nargs="?", type=Path, metavar="IMAGE_DIR",
                        help="sample from the images of this folder instead of a Karpathy split")
    add_options_of(parser, DecodingOverrides)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    parser.check(check_image_source, "IMAGE_DIR", args.image_dir is not None, args.data,
                 args.images)
    parser.check(key_path_of, args.out, args.key)
    return make_rating_kit(**arguments_of(make_rating_kit, args),
                           decoding=options_of(args, DecodingOverrides))
