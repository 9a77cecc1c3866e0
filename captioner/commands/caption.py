"""``captioner caption``: caption image files with a trained checkpoint.

Output formats (one record per readable image, in input order):

* text: PATH<TAB>caption per line; a tab, newline, carriage return or backslash inside PATH
  is written as \\t, \\n, \\r or \\\\ so that every record stays on one line;
* jsonl: one JSON object per line: image (path), caption, tokens (T words), log_prob, mapping
  (output attention mapping), grid ([h, w]) and attention (T nested lists of h x w
  output-attention weights, one map per token);
* coco: the COCO results format, a JSON list of {"image_id": int, "caption": str, "file_name":
  path}. The image id is the file stem when it is all digits (391895.jpg) or the digits after
  its last underscore (COCO_val2014_000000391895.jpg). When any file has no such id or two files
  share one, every image instead gets its 1-based position in the input list, unreadable images
  counted too (so an image keeps its id whichever others could be read, in every run and with
  every checkpoint), and a note says so. `captioner score` checks the file names against
  the references' images.

Decoding defaults to the checkpoint's own options (model.decoding of its config). An input
that does not exist stops the command before any image is captioned (exit status 2).
Unreadable images (corrupt files, FIFOs, devices, ...), named or found in a folder, are
reported by name on stderr and skipped; the exit status is then 1, after all other images
were captioned and written. --out is checked before
any image is captioned (an existing file is replaced only with --overwrite) and written
atomically; on Ctrl-C the records done so far are written, unless --out held an earlier file,
which is then left as it was (half a result does not replace a whole one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from captioner.commands.options import (
    add_checkpoint_argument,
    add_decoding_arguments,
    add_overwrite_argument,
    command_parser,
    decoding_options,
    report_error,
)
from data_prep.text import check_utf8_names, printable
from data_prep.wording import counted

HELP = "caption images or folders of images (text, jsonl with per-word attention, COCO results)"

FORMATS = ("text", "jsonl", "coco")
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _parser() -> argparse.ArgumentParser:
    parser = command_parser("captioner caption", __doc__)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR")
    add_checkpoint_argument(parser)
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="output format (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="output file (default: standard output)")
    add_overwrite_argument(parser)
    add_decoding_arguments(parser)
    return parser


def _record(path: Path, caption, output_format: str, mapping: str) -> str:
    if output_format == "jsonl":
        from captioner.inference import jsonl_record

        return json.dumps(jsonl_record(path, caption, mapping), ensure_ascii=False)
    return f"{str(path).translate(_ESCAPES)}\t{printable(caption.text)}"


def _coco_record(image_id: int, text: str, path: Path) -> dict:
    """A COCO results record that also names its image in "file_name" (the path as given), so
    that `captioner score` can check that the references give ``image_id`` to the same file (a
    converted dataset numbers its images otherwise), and a caption whose id is a position stays
    tied to its image: the ids skip the unreadable images' positions, and a text output of the
    same inputs has no line for those images. coco-caption reads the records' other fields
    as it reads these, and scores by image_id and caption alone."""
    return {"image_id": image_id, "caption": text, "file_name": str(path)}


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    with contextlib.ExitStack() as claim:  # the --out file, held until the command ends
        return _caption(args, claim)


def _caption(args: argparse.Namespace, claim: contextlib.ExitStack) -> int:
    from tqdm import tqdm

    from captioner.image_files import coco_image_ids, collect_images
    from captioner.inference import open_captioner
    from data_prep.output_folders import claimed_output
    from data_prep.paths import check_output_file

    try:
        paths = collect_images(args.inputs)
        if args.format != "text":
            check_utf8_names(paths, f"the {args.format} output (JSON)")
        if args.out is not None:
            claim.enter_context(claimed_output(args.out, "captions", lambda: check_output_file(
                args.out, [("checkpoint", args.ckpt), *(("image", path) for path in paths)],
                overwrite=args.overwrite)))
        captioner = open_captioner(args.ckpt, args.device)
        options = decoding_options(args, captioner.decoding)
    except (OSError, ValueError) as exc:
        return report_error("captioner caption", exc)
    ids, from_names = coco_image_ids(paths) if args.format == "coco" else ([], True)
    if not from_names:
        print("captioner caption: not every file name is a distinct numeric id; COCO image ids "
              "are the 1-based positions in the input list (unreadable images counted too) and "
              '(each record names its image in "file_name")', file=sys.stderr)

    failures, results = [], []
    interrupted = False
    records = 0
    earlier = args.out is not None and args.out.exists()  # replaced only by a whole result

    def write_records(out) -> None:
        nonlocal interrupted, records
        captions = captioner.caption_files(
            paths, options, batch_size=args.batch_size,
            progress=not args.no_progress and len(paths) > 1,
        )
        try:
            for index, (result, caption) in enumerate(captions):
                if caption is None:
                    failures.append(result.path)
                    # Above the progress bar, not glued to its line.
                    tqdm.write(f"captioner caption: skipped {result.error}", file=sys.stderr)
                elif args.format == "coco":
                    results.append(_coco_record(ids[index], caption.text, result.path))
                else:
                    out.write(_record(result.path, caption, args.format,
                                      captioner.output_attention_name) + "\n")
                    out.flush()
                records += caption is not None
        except KeyboardInterrupt:
            if records == 0 or earlier:
                raise  # an earlier --out file is not replaced by an empty or partial one
            interrupted = True  # keep the records done so far
        if args.format == "coco":
            json.dump(results, out, ensure_ascii=False)
            out.write("\n")

    try:
        if args.out is None:
            write_records(sys.stdout)
        else:
            from data_prep.atomic import atomic_write

            try:
                with atomic_write(args.out) as handle:
                    write_records(handle)
            except OSError as exc:
                return report_error("captioner caption", exc, f"cannot write {args.out}")
    except KeyboardInterrupt:
        if records and earlier:
            print(f"captioner caption: interrupted; the earlier {args.out} is left as it was "
                  f"(the {counted(records, 'caption')} made are not written)", file=sys.stderr)
            return 130
        kept = "" if args.out is None else f"; {args.out} was not written"
        print(f"captioner caption: interrupted before any image was captioned{kept}",
              file=sys.stderr)
        return 130
    if interrupted:
        where = "standard output" if args.out is None else str(args.out)
        print(f"captioner caption: interrupted; {counted(records, 'caption')} of "
              f"{counted(len(paths), 'image')} written to {where}", file=sys.stderr)
        return 130
    if failures:
        print(f"captioner caption: {len(failures)} of {len(paths)} images could not be read: "
              + ", ".join(map(str, failures)), file=sys.stderr)
        return 1
    return 0
