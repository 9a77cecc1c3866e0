"""``captioner rating-summary``: the human study's Table 2 from exported ratings files.

Unblind the ratings exported by a rating kit with its key and report, per model, mean caption
score and mean attention relevance (paper Table 2) with standard deviations, bootstrap 95%
confidence intervals, counts and Krippendorff's alpha. Incomplete, missing and duplicate
ratings are listed. RATINGS.json files are the kit page's exports: {"format":
"captioner-ratings/1", "kit_id", "rater_id", "exported_at", "ratings": [{"image", "label",
"caption_score", "attention_score", ...}]}.

Options may come from a YAML file (--config FILE; --print_config writes one)."""

from __future__ import annotations

from pathlib import Path

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from eval.rating.summary import summarize_rating_files

HELP = "summarize human ratings from the rating kit (Table 2 with CIs and agreement)"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner rating-summary", __doc__, summarize_rating_files,
                             skip=("ratings",))
    parser.add_argument("ratings", nargs="+", type=Path, metavar="RATINGS.json",
                        help="ratings files exported from the kit page, one per rater")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return summarize_rating_files(**arguments_of(summarize_rating_files, args))
