"""``captioner export``: a self-contained copy of a checkpoint, for sharing.

A checkpoint of a frozen encoder (the paper's setting) refers to the encoder weights it was
built from, by path (or torchvision name) and SHA-256, instead of holding a copy of them: it
loads only where that file is. The copy written to OUT holds the encoder's tensors too, and
loads anywhere; everything else (weights, optimizer state, vocabulary) is as in CKPT.

    captioner export runs/coco_tvmax/version_0/checkpoints/last.ckpt --out coco_tvmax.ckpt

Options may come from a YAML file (--config FILE; --print_config writes one).
"""

from __future__ import annotations

from pathlib import Path

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from captioner.model.sharing import export_checkpoint

HELP = "a self-contained copy of a checkpoint (its frozen encoder inside), for sharing"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner export", __doc__, export_checkpoint, skip=("ckpt",))
    parser.add_argument("ckpt", type=Path, metavar="CKPT", help="checkpoint to export")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return export_checkpoint(**arguments_of(export_checkpoint, args))
