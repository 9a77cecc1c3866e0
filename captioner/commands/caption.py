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

Options may come from a YAML file (--config FILE; --print_config writes one). Decoding
defaults to the checkpoint's own options (model.decoding of its config). An input
that does not exist stops the command before any image is captioned (exit status 2).
Unreadable images (corrupt files, FIFOs, devices, ...), named or found in a folder, are
reported by name on stderr and skipped; the exit status is then 1, after all other images
were captioned and written. --out is checked before
any image is captioned (an existing file is replaced only with --overwrite) and written
atomically; on Ctrl-C the records done so far are written, unless --out held an earlier file,
which is then left as it was (half a result does not replace a whole one).
"""

from __future__ import annotations

from captioner.commands.options import (
    FunctionParser,
    add_image_inputs,
    add_options_of,
    arguments_of,
    function_parser,
    options_of,
)
from captioner.inference.captioning import caption_images
from captioner.model.decoding_options import DecodingOverrides

HELP = "caption images or folders of images (text, jsonl with per-word attention, COCO results)"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner caption", __doc__, caption_images,
                             skip=("inputs", "decoding"), once=("ckpt",))
    add_image_inputs(parser)
    add_options_of(parser, DecodingOverrides)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return caption_images(**arguments_of(caption_images, args),
                          decoding=options_of(args, DecodingOverrides))
