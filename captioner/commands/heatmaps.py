"""``captioner heatmaps``: per-word output-attention figures for captioned images.

For every checkpoint MODEL and readable image STEM it writes ``OUT/MODEL/STEM/``:

* ``NN_word.png``: the image (own aspect ratio up to 4:1, longer side ``--size`` pixels)
  with the attention of word NN (0-based) drawn over it (see `captioner.inference.heatmaps`);
* ``strip.png``: the whole caption, one panel per word, with the colour bar;
* ``attention.npz`` and ``attention.json``: the raw weights (tokens, grid, T x h x w maps).

MODEL names the checkpoint: a run's checkpoint (``runs/NAME/version_N/checkpoints/F.ckpt``, as
``fit`` writes it) is ``NAME``, then ``NAME_vN`` and ``NAME_vN_F`` where that is shared; any other
checkpoint is named by its file stem, as STEM names the image, both sanitized
(``[A-Za-z0-9._-]``): when two share one, their parent folder's name goes in front
(``models/tvmax/last.ckpt`` -> ``tvmax_last``), and a short hash of the full path behind if
that is still shared (``captioner.inference.heatmaps.checkpoint_names``).
``OUT/index.json`` lists every image's files, caption and the colour scale.

OUT must be new or empty: a folder holding an earlier run's heatmaps is refused, or, with
--overwrite, emptied and filled anew once the new captions are made (the earlier figures stay
until then); figures of two runs in one folder would be drawn on two colour scales, with only
the last run indexed. Files beside an earlier run's heatmaps are never deleted: such a folder
is refused, with --overwrite too, and so is an OUT that holds an input image or lies inside an
input folder (its figures would be read as images by the next run). A checkpoint given twice
is refused, and so is an image
(also by two spellings of its path, or as a file and inside a folder given): its figures would
go once into one folder but twice into the index.

Options may come from a YAML file (--config FILE; --print_config writes one); decoding
defaults to each checkpoint's own options.

Colour scale: one scale 0..vmax for every word, image and model of the run, so colours are
comparable across them. vmax is ``--vmax`` when given (use it to compare separate runs), else
the largest attention weight of the whole run. Zero attention is transparent (``--zero-style
transparent``, the default) or a hard white mask (``white``, the paper's figure style).
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
from captioner.inference.heatmap_folder import FigureStyle, draw_heatmaps
from captioner.model.decoding_options import DecodingOverrides

HELP = "per-word attention heatmaps, caption strips and raw weights for images"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner heatmaps", __doc__, draw_heatmaps,
                             skip=("inputs", "figure", "decoding"))
    add_image_inputs(parser)
    add_options_of(parser, FigureStyle)
    add_options_of(parser, DecodingOverrides)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return draw_heatmaps(**arguments_of(draw_heatmaps, args), figure=options_of(args, FigureStyle),
                         decoding=options_of(args, DecodingOverrides))
