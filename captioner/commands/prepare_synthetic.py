"""``captioner prepare-synthetic``: render the embedded synthetic captioning dataset.

Options may come from a YAML file (--config FILE; --print_config writes one)."""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from captioner.features.preparation import render_synthetic

HELP = "render the synthetic shapes dataset (Karpathy JSON, PNG images, COCO instance masks)"


def build_parser() -> FunctionParser:
    return function_parser("captioner prepare-synthetic", __doc__, render_synthetic)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return render_synthetic(**arguments_of(render_synthetic, args))
