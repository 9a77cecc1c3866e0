"""``captioner gallery``: a static page comparing how models attend, side by side.

Captions images with every ``--ckpt`` and writes ``OUT/index.html`` (open it in a browser,
also from file://; no network), with ``OUT/images/``, ``OUT/attention/`` and
``OUT/colorbar.png`` beside it. For each image the page shows one column per model: its name
(as captioner heatmaps names a checkpoint: a run's name for fit's checkpoints, else the file
stem, made unique), its output attention
mapping, its caption and, per word, the attention drawn over the image with the word under
it; hovering over a word shows it large, clicking pins the large view. Left/right arrows (or
k/j) and the buttons move between images; the URL keeps the image number (index.html#3).

Images: files and folders (IMAGE_OR_DIR; the first --n when given), or a seeded sample of --n
readable images of a Karpathy split (--data, --images, --split, --seed). Where fewer than --n
are available, the gallery shows them all and a note on stderr says how many (a smaller gallery
is still a complete one, unlike a rating kit's sample, whose size the study fixes). Unreadable
images are reported by name and skipped; the exit status is then 1, after the page is written.
A split none of whose images is readable under --images (a wrong image root, most likely) is
refused on one line that names the first of them (exit status 2).

OUT must be new or empty: a folder holding an earlier gallery is refused, or, with
--overwrite, emptied and filled anew once the new captions are made (the earlier gallery stays
until then), never a mix of two galleries' files. Files beside an earlier gallery are never
deleted: such a folder is refused, with --overwrite too, and so is an OUT that holds an input
image or lies inside an input folder. A checkpoint or an image given twice is refused.

Options may come from a YAML file (--config FILE; --print_config writes one); decoding
defaults to each checkpoint's own options.

Colour scale: one scale 0..vmax for every model, word and image of the page; vmax is --vmax
when given (to compare separate galleries), else the largest attention weight of the page.
Zero attention is fully transparent (--zero-style transparent, the default) or opaque white
(white, the paper's figures); every non-zero weight is coloured, green unless --colormap picks
another scale. The page's legend says which.
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
from captioner.inference.heatmap_folder import FigureStyle
from captioner.model.decoding_options import DecodingOverrides
from eval.gallery_folder import make_gallery
from eval.rating.kit import check_image_source

HELP = "side-by-side attention gallery of several checkpoints (static HTML)"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner gallery", __doc__, make_gallery,
                             skip=("inputs", "figure", "decoding"))
    add_image_inputs(parser, nargs="*", help="image files or folders (searched recursively)")
    add_options_of(parser, FigureStyle)
    add_options_of(parser, DecodingOverrides)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    parser.check(check_image_source, "IMAGE_OR_DIR", bool(args.inputs), args.data, args.images)
    return make_gallery(**arguments_of(make_gallery, args), figure=options_of(args, FigureStyle),
                        decoding=options_of(args, DecodingOverrides))
