"""``captioner score``: coco-caption metrics (SPICE included) and REP for a results file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioner.commands.options import (
    CommandParser,
    add_overwrite_argument,
    report_error,
    warnings_as_lines,
)
from eval.commands import add_metric_arguments

HELP = "score a COCO results file: BLEU, METEOR, ROUGE_L, CIDEr, SPICE and REP"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="captioner score", description=HELP)
    parser.add_argument(
        "--results", required=True, help='COCO results JSON: [{"image_id": int, "caption": str}]'
    )
    parser.add_argument(
        "--references",
        required=True,
        help="COCO captions annotation JSON, or a Karpathy JSON together with --split",
    )
    parser.add_argument("--split", help="split of a Karpathy references file (train/val/test)")
    add_metric_arguments(parser)
    parser.add_argument(
        "--out", help="write METRICS.json here (checked before scoring, written atomically)"
    )
    add_overwrite_argument(parser)
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="score empty captions (no words: punctuation alone counts as none; every metric "
        "gives them 0) instead of refusing them",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from data_prep.atomic import write_json
    from data_prep.paths import OutputPathError, check_output_file
    from data_prep.wording import agreeing, counted, first_names
    from eval.caption_files import (
        CaptionFileError,
        check_result_names,
        empty_caption_ids,
        load_references,
        load_results,
    )
    from eval.coco_metrics import coverage_problems
    from eval.java_tools import JavaToolError
    from eval.scoring import compute_metrics, parse_metrics
    from eval.spice_jars import SpiceJarsError
    from eval.table import format_table1

    try:
        if args.out:
            check_output_file(args.out, [("results file", args.results),
                                         ("references file", args.references)],
                              overwrite=args.overwrite)
        metrics = parse_metrics(args.metrics)
        results = load_results(args.results)
        reference_file = load_references(args.references, args.split)
        unchecked = check_result_names(Path(args.results), results.file_names,
                                       Path(args.references), reference_file.file_names)
    except (CaptionFileError, FileNotFoundError, KeyError, OutputPathError, ValueError) as exc:
        return report_error("captioner score", exc)
    hypotheses, references = results.captions, reference_file.captions
    subset, elsewhere = "", {}
    if args.split is None and set(references) - set(hypotheses):
        # A COCO captions file holds a whole set (val2014: 40,504 images), of which Karpathy's
        # test split is a part: as coco-caption does, the results' images are scored. A split
        # of a Karpathy file is the set itself, so each of its images needs a caption.
        subset = (f"scoring the {counted(len(hypotheses), 'image')} of {args.results}; "
                  f"{args.references} holds references of {len(references)}")
        references = {i: texts for i, texts in references.items() if i in hypotheses}
    elif args.split is not None and set(hypotheses) - set(references):
        # Captions of a whole folder (val and test images, say) scored on one split: its
        # images are scored, as asked; ids the file does not list at all stay an error.
        elsewhere = {i: reference_file.other_splits[i] for i in set(hypotheses) - set(references)
                     if i in reference_file.other_splits}
        if elsewhere:
            subset = (f"scoring the {counted(len(references), 'image')} of split {args.split!r}; "
                      f"the captions of {counted(len(elsewhere), 'image')} of other splits in "
                      f"{args.results} are left out (image ids {first_names(sorted(elsewhere))})")
            hypotheses = {i: text for i, text in hypotheses.items() if i not in elsewhere}
    problems = coverage_problems(hypotheses, references)
    empty = empty_caption_ids(hypotheses)
    if empty and not args.allow_empty:
        problems.append(
            f"{counted(len(empty), 'caption')} in {args.results} "
            f"{agreeing(len(empty), 'is', 'are')} empty, without a word (image ids "
            f"{first_names(empty)}); "
            "pass --allow-empty to score them anyway"
        )
    if problems and elsewhere and not hypotheses:
        # Every caption was of another split: the split given is likely not the results'.
        found = sorted(set(elsewhere.values()))
        problems.append(f"every caption in {args.results} is of split "
                        f"{' or '.join(map(repr, found))}, not {args.split!r}: is --split right?")
    if problems:
        return report_error("captioner score", ValueError("; ".join(problems)),
                            f"cannot score {args.results}")
    if unchecked:
        print(unchecked, file=sys.stderr)
    if subset:
        print(subset, file=sys.stderr)
    if empty:
        print(f"warning: scoring {counted(len(empty), 'empty caption')} (image ids "
              f"{first_names(empty)})", file=sys.stderr)
    # An empty reference is a defect of the references file; it counts as one (lowering
    # CIDEr's consensus, say), so the user must hear of it.
    empty_references = sorted(i for i, texts in references.items()
                              if i in hypotheses and any(not t.strip() for t in texts))
    if empty_references:
        print(f"warning: {counted(len(empty_references), 'image')} of {args.references} "
              f"{agreeing(len(empty_references), 'has', 'have')} an empty reference caption "
              f"(image ids {first_names(empty_references)}), scored as a reference",
              file=sys.stderr)
    try:
        # Metrics that are undefined here (e.g. CIDEr of one image) warn: one line each.
        with warnings_as_lines():
            scores = compute_metrics(
                hypotheses, references, metrics, spice_timeout=args.spice_timeout
            )
    except SpiceJarsError as exc:
        others = ",".join(name for name in metrics if name != "SPICE")
        leave_out = f"; or score without SPICE: --metrics {others}" if others else ""
        exc.args = (f"{exc}{leave_out}",)  # the hint on the same line; the traceback kept
        return report_error("captioner score", exc)
    except (JavaToolError, RuntimeError, ValueError) as exc:
        return report_error("captioner score", exc, status=1)
    print(counted(len(hypotheses), "image"))
    for name, value in scores.corpus.items():
        print(f"{name:>8}: {value:.4f}")
    print()
    print(format_table1({Path(args.results).stem: scores.corpus}))
    if args.out:
        document = scores.to_dict({"results": args.results, "references": args.references,
                                   "split": args.split, "num_images": len(scores.per_image)})
        try:
            write_json(args.out, document, indent=2)
        except OSError as exc:
            return report_error("captioner score", exc, f"could not write {args.out}", status=1)
        print(f"\nwrote {args.out}")
    return 0
