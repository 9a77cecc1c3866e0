"""``captioner evaluate``: decode a split with a checkpoint and report every metric.

Options may come from a YAML file (--config FILE; --print_config writes one). Decoding
defaults to the checkpoint's own options (model.decoding of its config)."""

from __future__ import annotations

from captioner.commands.options import (
    FunctionParser,
    add_options_of,
    arguments_of,
    function_parser,
    options_of,
)
from captioner.model.decoding_options import DecodingOverrides
from eval.checkpoint_evaluation import evaluate_checkpoint

HELP = "caption a Karpathy split with a checkpoint; metrics, attention statistics, objects"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner evaluate", __doc__, evaluate_checkpoint,
                             skip=("decoding",), once=("ckpt",))
    add_options_of(parser, DecodingOverrides)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return evaluate_checkpoint(**arguments_of(evaluate_checkpoint, args),
                               decoding=options_of(args, DecodingOverrides))
