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

Options may come from a YAML file (--config FILE; --print_config writes one); on the command
line, an option other than --captions and --images is given once.
"""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from captioner.features.preparation import check_sources, prepare_dataset

HELP = ("make a Karpathy-split JSON from a folder of photos and a captions file (JSONL/JSON, "
        "CSV/TSV, COCO)")


def build_parser() -> FunctionParser:
    # A second --out or --split is more likely a second dataset's than a correction.
    return function_parser("captioner prepare-dataset", __doc__, prepare_dataset,
                           once=("out", "format", "split", "seed", "on_error", "name"))


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    parser.check(check_sources, args.captions, args.images)
    return prepare_dataset(**arguments_of(prepare_dataset, args))
