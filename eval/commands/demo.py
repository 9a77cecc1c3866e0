"""``captioner demo``: the whole method end to end on the embedded synthetic dataset.

1. Generates the synthetic shapes dataset (Karpathy JSON, PNG images, COCO instances) unless it
   is already in ``OUT/synthetic-*``.
2. Pretrains the encoder on the training split (``captioner pretrain-encoder``): a ResNet-18 up
   to its stage ``layer3`` learns which object covers each cell of its grid (16 x 16; 8 x 8
   for the 128 px images of ``--quick``) (shape,
   colour, size), the offline stand-in for the paper's ImageNet encoder; its per-cell accuracy
   on the validation split is printed. Then every image is encoded once with it, frozen, and
   the float16 grid features are cached (``captioner prepare-features``). Both are made once
   per dataset and reused by later runs into the same ``--out`` (``--overwrite`` replaces the
   earlier results there); the same encoder serves all three mappings.
3. Trains softmax, sparsemax and TVmax output-attention captioners through the same
   LightningCLI and configs as ``captioner fit`` (``configs/demo_*.yaml``; best epoch on
   val/CIDEr), into ``OUT/runs/demo_<mapping>/version_N/`` with the exact config of each run,
   once per ``--seeds`` seed (the seed of the captioners' initialization and batch order; the
   data and the encoder stay those of ``--seed``). With ``--lam-grid``, TVmax's lambda is first
   chosen on the validation split (best val/CIDEr of the first seed), as the paper did.
   Each finished training is recorded in ``OUT/trainings.json``: a run stopped before its
   results (Ctrl-C) goes on when the same command is run again, and trains only the
   captioners it had not finished (``eval.demo.trainings``).
4. Decodes the test split from the images with each best checkpoint and scores it with the
   coco-caption metrics, REP, object recall, the attention statistics (zero attention, JS
   divergence of consecutive words, fused groups) and the attention precision (share of
   output attention on the named object's mask, at its shape word and over its whole phrase).
5. Writes ``results.json`` (every seed, and mean and sd over seeds), the table, the figure
   ``metrics.png``, per-word attention figures of a few test images and the side-by-side
   attention gallery ``gallery/index.html`` of the first seed's models.

SPICE needs jars that ``captioner fetch-spice`` installs (the README's quickstart runs it
first); when they are absent the demo scores without SPICE and says so. SPICE scores every
model's captions in one Java run, which loads its parser once.

Options may come from a YAML file (--config FILE; --print_config writes one).
"""

from __future__ import annotations

from captioner.commands.options import (
    FunctionParser,
    any_float,
    arguments_of,
    function_parser,
)
from eval.demo.folder import check_demo_options, demo

HELP = "train softmax / sparsemax / TVmax captioners on synthetic shapes and compare them"


def build_parser() -> FunctionParser:
    parser = function_parser("captioner demo", __doc__, demo, skip=("seeds", "lam_grid"))
    parser.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                        help="train the captioners once per seed and report mean and sd "
                             "(default: --seed alone)")
    parser.add_argument("--lam_grid", type=any_float, nargs="+", metavar="LAM",
                        help="choose TVmax's lambda among these on the validation split "
                             "(default: the config's)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    parser.check(check_demo_options, args.seed, args.seeds, args.lam_grid)
    return demo(**arguments_of(demo, args))
