"""``captioner score``: coco-caption metrics (SPICE included) and REP for a results file.

Options may come from a YAML file (--config FILE; --print_config writes one)."""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from eval.metrics.scoring import score_results_file

HELP = "score a COCO results file: BLEU, METEOR, ROUGE_L, CIDEr, SPICE and REP"


def build_parser() -> FunctionParser:
    return function_parser("captioner score", __doc__, score_results_file)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return score_results_file(**arguments_of(score_results_file, args))
