"""``captioner rating-summary``: the human study's Table 2 from exported ratings files."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.commands.options import CommandParser, add_overwrite_argument, report_error

HELP = "summarize human ratings from the rating kit (Table 2 with CIs and agreement)"


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="captioner rating-summary",
        description="Unblind the ratings exported by a rating kit with its key and report, per "
                    "model, mean caption score and mean attention relevance (paper Table 2) "
                    "with standard deviations, bootstrap 95% confidence intervals, counts and "
                    "Krippendorff's alpha. Incomplete, missing and duplicate ratings are listed. "
                    "RATINGS.json files are the kit page's exports: {\"format\": "
                    "\"captioner-ratings/1\", \"kit_id\", \"rater_id\", \"exported_at\", "
                    "\"ratings\": [{\"image\", \"label\", \"caption_score\", "
                    "\"attention_score\", ...}]}.")
    parser.add_argument("ratings", nargs="+", type=Path, metavar="RATINGS.json",
                        help="ratings files exported from the kit page, one per rater")
    parser.add_argument("--key", required=True, type=Path, help="the kit's key file")
    parser.add_argument("--out", type=Path, help="write the full summary as JSON here")
    add_overwrite_argument(parser)
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from data_prep.atomic import write_json
    from data_prep.paths import check_output_file, refuse_repeated, require_file
    from eval.rating_summary import RatingsError, format_table, summarize

    try:
        if args.out is not None:
            check_output_file(args.out, [("key file", args.key),
                                         *(("ratings file", path) for path in args.ratings)],
                              overwrite=args.overwrite)
        for path in (*args.ratings, args.key):
            require_file(path, "ratings file" if path != args.key else "key file")
        refuse_repeated(args.ratings, "ratings file")  # its ratings would count as duplicates
        summary = summarize(args.ratings, args.key)
    except (RatingsError, OSError, ValueError) as exc:
        return report_error("captioner rating-summary", exc)
    print(format_table(summary, args.out))
    if args.out is not None:
        try:
            write_json(args.out, summary)
        except OSError as exc:
            return report_error("captioner rating-summary", exc, f"cannot write {args.out}")
        print(f"summary written to {args.out}")
    return 0
