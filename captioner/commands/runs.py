"""``captioner runs``: the training runs under a runs folder, with their progress.

One line per ``ROOT/NAME/version_N`` (and per version a fit named, ``ROOT/NAME/V``): the
input/output attention it trained with (and the output's keywords, from its config.yaml); the
epochs done, of the max_epochs it trains to (``2/6``: stopped, or still training); the global
step; the best score with the metric it is of (``CIDEr``, the validation CIDEr, unless the run
monitored another: ``Bleu_4``, ``train/loss``); the best and last checkpoints, as recorded in
``checkpoints/progress.json`` at the run's last save; and the scores of its last ``captioner
test`` with the checkpoint they are of (``test of best-epoch02-cider0.8100.ckpt: CIDEr ...
Bleu_4 ...``) where it was tested. A version that holds only the scores of ``test`` or
``validate`` of a checkpoint from outside the runs names that checkpoint instead.

Options may come from a YAML file (--config FILE; --print_config writes one).
"""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from captioner.training.run_table import print_runs

HELP = ("list training runs (runs/NAME/version_N) with their attention mappings, best "
        "validation CIDEr (or the metric they monitor) and checkpoints")


def build_parser() -> FunctionParser:
    return function_parser("captioner runs", __doc__, print_runs)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return print_runs(**arguments_of(print_runs, args))
