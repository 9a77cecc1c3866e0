"""``captioner prepare-dataset``: a Karpathy-split JSON file from a folder of photos and a
captions file, ready for ``captioner prepare-features`` and ``captioner fit``.

    captioner prepare-dataset --captions captions.txt --images photos/ \\
        --out data/mine/dataset_mine.json --split 0.8,0.1,0.1 --seed 0

Captions files: JSONL (``{"image": "dir/a.jpg", "captions": ["...", ...]}`` per line) or a
JSON array of such records, CSV or TSV with the header ``image,caption`` (one caption per line,
as Flickr8k's ``captions.txt``), or a COCO captions file (ids kept as ``cocoid``). Captions are
tokenized as in Karpathy's files: NFKC, lower case, everything but letters, numbers, combining
marks and whitespace deleted, split on whitespace.

--split: fractions (0.8,0.1,0.1), counts (800,100,100; images beyond them are left out) or a
JSON file {"train": [paths], "val": [...], "test": [...]}; random splits depend only on the
images and --seed.

Bad records (an unclosed CSV quote among them: the lines after it are read again), empty and
duplicate captions, duplicate entries and missing or unreadable images are skipped and listed
with their lines (--on-error skip, the default), or stop the command with exit status 2
(--on-error fail): the error names the captions file's first problem in line order and where
the others are, before any image is decoded, else the first bad image. An empty split always
stops it; the output file is then not written.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from captioner.commands.options import add_overwrite_argument, command_parser, report_error

HELP = ("make a Karpathy-split JSON from a folder of photos and a captions file (JSONL/JSON, "
        "CSV/TSV, COCO)")

PROG = "captioner prepare-dataset"


def _parser() -> argparse.ArgumentParser:
    from data_prep.dataset_import import DEFAULT_SPLIT, FORMATS, ON_ERROR

    parser = command_parser(PROG, __doc__)
    parser.add_argument("--captions", required=True, type=Path, help="captions file")
    parser.add_argument("--images", required=True, type=Path,
                        help="image folder; the captions' image paths are relative to it")
    parser.add_argument("--out", required=True, type=Path, help="Karpathy JSON file to write")
    add_overwrite_argument(parser)
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="captions file format (default: from the extension and content)")
    parser.add_argument("--split", default=DEFAULT_SPLIT,
                        help="train,val,test fractions or counts, or a JSON split file "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of random splits (default 0)")
    parser.add_argument("--on-error", choices=ON_ERROR, default="skip",
                        help="skip bad items and list them, or stop at the first in file "
                             "order (exit 2)")
    parser.add_argument("--name", help="'dataset' field (default: the output file name "
                                       "without 'dataset_' and '.json')")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from data_prep.dataset_import import (
        REASONS,
        DatasetImportError,
        ImportOptions,
        import_dataset,
    )
    from data_prep.files import agreeing, counted, first_names

    options = ImportOptions(
        captions=args.captions, images=args.images, out=args.out, fmt=args.format,
        split=args.split, seed=args.seed, on_error=args.on_error, name=args.name,
        overwrite=args.overwrite,
    )
    try:
        report = import_dataset(options, progress=not args.no_progress)
    except (DatasetImportError, OSError) as exc:
        return report_error(PROG, exc)

    print(f"wrote {report.out} (dataset {report.name!r}, captions read as {report.fmt})")
    for split, count in report.images.items():
        print(f"  {split + ':':<6} {counted(count, 'image')}, "
              f"{counted(report.captions[split], 'caption')}")
    for reason, problems in report.problems.items():
        names = first_names([problem.item for problem in problems])
        print(f"{PROG}: skipped {len(problems)} ({REASONS[reason]}): {names}\n"
              f"  e.g. {problems[0].skipped}", file=sys.stderr)
    if report.left_out:
        print(f"{PROG}: left out {counted(len(report.left_out), 'usable image')} beyond the "
              f"--split counts: {first_names(report.left_out)}", file=sys.stderr)
    if report.uncaptioned:
        count = len(report.uncaptioned)
        print(f"{PROG}: note: {counted(count, 'image')} in {args.images} "
              f"{agreeing(count, 'has', 'have')} no captions and "
              f"{agreeing(count, 'was', 'were')} not used: {first_names(report.uncaptioned)}",
              file=sys.stderr)
    _print_next_steps(args.out, args.images)
    return 0


def _print_next_steps(out: Path, images: Path) -> None:
    from captioner import CONFIGS

    features = out.with_name("features_resnet101.h5")
    config = CONFIGS / "flickr30k_tvmax.yaml"
    data, root, cache, config_arg = (shlex.quote(str(path))
                                     for path in (out, images, features, config))
    # The run is named after the dataset, not after the config (runs/flickr30k_tvmax holds
    # Flickr30k's runs, which --ckpt_path last / best would otherwise mix with these).
    run_name = shlex.quote(f"{out.stem.removeprefix('dataset_')}_tvmax")
    print("next:")
    print(f"  captioner prepare-features --data {data} --images {root} "
          f"--arch resnet101 --weights IMAGENET1K_V2 --out {cache}")
    print(f"  captioner fit --config {config_arg} --run_name {run_name} "
          f"--data.karpathy_json {data} --data.image_root {root} --data.feature_cache {cache}")
