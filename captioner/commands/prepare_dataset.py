"""``captioner prepare-dataset``: a Karpathy-split JSON file from a folder of photos and a
captions file, ready for ``captioner prepare-features`` and ``captioner fit``.

    captioner prepare-dataset --captions captions.txt --images photos/ \\
        --out data/mine/dataset_mine.json --split 0.8,0.1,0.1 --seed 0

Several captions files, each followed by its image folder, make one dataset, whose image paths
are relative to the folder that holds all the image folders (COCO 2017's, as ``train2017/...``
and ``val2017/...`` under data/coco):

    captioner prepare-dataset \\
        --captions annotations/captions_train2017.json --images data/coco/train2017 \\
        --captions annotations/captions_val2017.json --images data/coco/val2017 \\
        --out data/coco/dataset_coco2017.json --split karpathy_split.json

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
import sys
from pathlib import Path

from captioner.commands.options import add_overwrite_argument, command_parser, report_error

HELP = ("make a Karpathy-split JSON from a folder of photos and a captions file (JSONL/JSON, "
        "CSV/TSV, COCO)")

PROG = "captioner prepare-dataset"


def _parser() -> argparse.ArgumentParser:
    from data_prep.importers.dataset import DEFAULT_SPLIT
    from data_prep.importers.formats import FORMATS
    from data_prep.importers.records import ON_ERROR

    # A second --out or --split is more likely a second dataset's than a correction.
    parser = command_parser(PROG, __doc__, refuse_repeats=True)
    parser.add_argument("--captions", required=True, type=Path, action="append",
                        help="captions file; repeated, one per image folder")
    parser.add_argument("--images", required=True, type=Path, action="append",
                        help="image folder of the --captions before it; the captions' image "
                             "paths are relative to it")
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
    parser = _parser()
    args = parser.parse_args(argv)
    from data_prep.importers.dataset import ImportOptions, Source, import_dataset
    from data_prep.importers.records import REASONS, DatasetImportError
    from data_prep.wording import agreeing, counted, first_names

    if len(args.captions) != len(args.images):
        parser.error(f"{counted(len(args.captions), '--captions file')} but "
                     f"{counted(len(args.images), '--images folder')}: give each captions file "
                     "its image folder (--captions A --images DIR_A --captions B --images DIR_B)")
    options = ImportOptions(
        sources=tuple(Source(captions, images)
                      for captions, images in zip(args.captions, args.images, strict=True)),
        out=args.out, fmt=args.format,
        split=args.split, seed=args.seed, on_error=args.on_error, name=args.name,
        overwrite=args.overwrite,
    )
    try:
        report = import_dataset(options, progress=not args.no_progress)
    except (DatasetImportError, OSError) as exc:
        return report_error(PROG, exc)

    print(f"wrote {report.out} (dataset {report.name!r}, captions read as {report.fmt})")
    if len(options.sources) > 1:
        print(f"  image root: {report.image_root} (the images' paths are relative to it)")
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
        folders = ", ".join(map(str, args.images))
        print(f"{PROG}: note: {counted(count, 'image')} in {folders} "
              f"{agreeing(count, 'has', 'have')} no captions and "
              f"{agreeing(count, 'was', 'were')} not used: {first_names(report.uncaptioned)}",
              file=sys.stderr)
    _print_next_steps(args.out, report.image_root)
    return 0


def _print_next_steps(out: Path, images: Path) -> None:
    from captioner.commands.next_steps import (
        CPU_SETUP,
        cache_path,
        fit_command,
        machine_setup,
        prepare_features_command,
        setup_encoder,
    )

    setup = machine_setup()
    cache = cache_path(out, setup.arch, setup.layer)
    print("next" + (" (no GPU here: the small CPU config)" if setup is CPU_SETUP else "") + ":")
    print(f"  {prepare_features_command(out, images, setup)}")
    print(f"  {fit_command(setup.config, out, images, cache, setup_encoder(setup))}")
    print(f"(where {setup.weights} cannot be downloaded: prepare-features --weights none, a "
          "random encoder whose captions barely depend on the image; it prints the fit command "
          "for its cache)")
