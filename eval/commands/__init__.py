"""Sub-commands of the ``captioner`` console script that need the evaluation layer."""

from __future__ import annotations

import argparse

from captioner.commands.options import at_least


def add_metric_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics`` and ``--spice-timeout``, as the commands that score captions (score,
    evaluate) take them."""
    from eval.scoring import ALL_METRICS

    parser.add_argument(
        "--metrics",
        default=",".join(ALL_METRICS),
        help=f"comma-separated subset of {','.join(ALL_METRICS)} (default: all)",
    )
    parser.add_argument(
        "--spice-timeout", type=at_least(0, float, strictly=True),
        help="seconds before SPICE is stopped (default: 10 minutes plus 0.2 s a caption, "
        "references included)",
    )
