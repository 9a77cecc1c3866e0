"""``captioner evaluate``: decode a split with a checkpoint and report every metric."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from captioner.cli import SIGINT_STATUS
from captioner.commands.options import (
    CommandParser,
    add_checkpoint_argument,
    add_decoding_arguments,
    decoding_options,
    report_error,
    warnings_as_lines,
)
from eval.commands import add_metric_arguments
from eval.scoring import ALL_METRICS

HELP = "caption a Karpathy split with a checkpoint; metrics, attention statistics, objects"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="captioner evaluate", description=HELP)
    add_checkpoint_argument(parser)
    parser.add_argument("--data", required=True, help="Karpathy split JSON")
    parser.add_argument("--images", required=True, help="image root of the Karpathy file")
    parser.add_argument("--split", default="test", help="split to evaluate (default: %(default)s)")
    parser.add_argument("--instances", help="COCO instances JSON for object mentions")
    parser.add_argument("--features", choices=("run", "images"), default="run",
                        help="run: read the features of the feature cache the checkpoint's run "
                             "trained on, where it was written by the checkpoint's frozen "
                             "encoder and holds every image of the split (else the images are "
                             "encoded, and a line says why); images: always encode the images "
                             "(default: %(default)s)")
    add_decoding_arguments(parser)
    add_metric_arguments(parser)
    parser.add_argument("--out", default="evaluation", help="output folder (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results_SPLIT.json and metrics_SPLIT.json of an "
                             "earlier evaluation of the split in --out (default: refuse)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from captioner.inference import open_captioner
    from data_prep.atomic import write_json
    from data_prep.paths import OutputPathError, check_output_dir, check_output_file
    from data_prep.stop_signals import stops_held
    from data_prep.wording import counted, first_names
    from eval.caption_files import empty_caption_ids
    from eval.evaluation import evaluate_captioner
    from eval.java_tools import JavaToolError
    from eval.scoring import parse_metrics
    from eval.spice_jars import SpiceJarsError

    out = Path(args.out)
    results = out / f"results_{args.split}.json"
    metrics_file = out / f"metrics_{args.split}.json"
    try:
        check_output_dir(out)
        reads = [("checkpoint", args.ckpt), ("dataset file", args.data),
                 *([("instances file", args.instances)] if args.instances else [])]
        for path in (results, metrics_file):
            check_output_file(path, reads)
        earlier = next((path for path in (results, metrics_file) if path.exists()), None)
        if earlier is not None and not args.overwrite:
            raise OutputPathError(f"{earlier}: holds an earlier evaluation of split "
                                  f"{args.split!r}; choose another --out, or pass --overwrite "
                                  "to replace it")
        # An earlier evaluation is replaced only once the new one is whole: until then its
        # captions wait beside it, so a metric that fails (or Ctrl-C) loses neither.
        staged = (results.with_name(f"results_{args.split}.new.json") if earlier is not None
                  else results)
        check_output_file(staged, reads)
        metrics = parse_metrics(args.metrics)
        if "SPICE" in metrics:
            from eval.spice_jars import locate_spice

            locate_spice()  # fail before decoding, not after
        captioner = open_captioner(args.ckpt, args.device)
        options = decoding_options(args, captioner.decoding)
    except (SpiceJarsError, OSError, ValueError) as exc:
        return report_error("captioner evaluate", exc)
    written, empty = [], []

    def keep(captions: list[dict]) -> None:  # before the metrics, which may fail
        with stops_held():  # a stop once they are written says where they are
            write_json(staged, captions)
            written.append(staged)
        stale = _metrics_of(staged)
        if staged != results and stale.exists():
            # The scores of earlier staged captions, which these replace (and which would
            # stop the score command a failure below gives).
            stale.unlink()
            print(f"captioner evaluate: removed {stale}: it scored the earlier new captions "
                  f"that {staged} now replaces", file=sys.stderr)
        # An under-trained model writes empty captions; they are scored (every metric gives
        # them 0), as `captioner score --allow-empty` scores them, and said so.
        empty.extend(empty_caption_ids({c["image_id"]: c["caption"] for c in captions}))
        if empty:
            print(f"warning: scoring {counted(len(empty), 'empty caption')} (image ids "
                  f"{first_names(empty)})", file=sys.stderr)

    try:
        with warnings_as_lines():  # e.g. CIDEr undefined on one image: one line
            report = evaluate_captioner(
                captioner, args.data, args.images, split=args.split, instances=args.instances,
                options=options, batch_size=args.batch_size, metrics=metrics,
                spice_timeout=args.spice_timeout, progress=not args.no_progress,
                on_results=keep, features=args.features,
                on_features=lambda told: print(f"captioner evaluate: {told}", file=sys.stderr),
            )  # fmt: skip
    except (SpiceJarsError, JavaToolError, FileNotFoundError, KeyError, ValueError) as exc:
        if not written:  # the inputs: a user error
            return report_error("captioner evaluate", exc)
        # The metrics failed (SPICE stopped, say): the work's failure, as in `score`.
        kept = f"({_kept(staged, earlier)}; {_rescore(args, staged, empty)})"
        return report_error("captioner evaluate", exc, after=kept, status=1)
    except KeyboardInterrupt:
        if not written:
            raise  # nothing kept: captioner.cli's one line
        # Ctrl-C in the metrics (SPICE takes longest): the captions need not be made again.
        print(f"captioner evaluate: interrupted; {_kept(staged, earlier)} "
              f"({_rescore(args, staged, empty)})", file=sys.stderr)
        return SIGINT_STATUS
    with stops_held():  # the captions and their metrics in place together, or neither
        if staged != results:
            # Never the earlier metrics beside the new captions, even for an instant.
            metrics_file.unlink(missing_ok=True)
            staged.replace(results)
        write_json(metrics_file, report.to_dict(), indent=2)
    print(report.summary())
    print(f"\nwrote {results} and {metrics_file}")
    return 0


def _metrics_of(results: Path) -> Path:
    """The metrics file beside the captions file ``results``: ``metrics_SPLIT[.new].json``."""
    return results.with_name(results.name.replace("results_", "metrics_", 1))


def _kept(staged: Path, earlier: Path | None) -> str:
    """Where the captions of an evaluation whose metrics failed or were stopped are kept."""
    if earlier is None:
        return f"the captions are kept in {staged}"
    return (f"the new captions are kept in {staged}, and the earlier evaluation in "
            f"{staged.parent} is unchanged")


def _rescore(args: argparse.Namespace, staged: Path, empty: list) -> str:
    """How to go on once the captions are in ``staged`` and their metrics failed or were
    stopped: the score command that scores them into a metrics file beside them
    (``metrics_SPLIT.json``, or ``metrics_SPLIT.new.json`` beside staged new captions; the
    same evaluate command is refused now that they are in --out; ``empty``: the ids of empty
    captions, which it must allow)."""
    command = ["captioner", "score", "--results", str(staged), "--references", str(args.data),
               "--split", args.split, "--out", str(_metrics_of(staged))]
    if args.metrics != ",".join(ALL_METRICS):
        command += ["--metrics", args.metrics]
    if args.spice_timeout is not None:
        command += ["--spice-timeout", f"{args.spice_timeout:g}"]
    if empty:
        command.append("--allow-empty")
    # Quoted for a shell, so that it can be pasted as it is (an --out with a space).
    statistics = "attention statistics and object metrics" if args.instances else (
        "attention statistics")
    return (f"{shlex.join(command)} scores them; the {statistics} need a new evaluation: "
            "--overwrite")
