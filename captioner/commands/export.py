"""``captioner export``: a self-contained copy of a checkpoint, for sharing.

A checkpoint of a frozen encoder (the paper's setting) refers to the encoder weights it was
built from, by path (or torchvision name) and SHA-256, instead of holding a copy of them: it
loads only where that file is. The copy written to OUT holds the encoder's tensors too, and
loads anywhere; everything else (weights, optimizer state, vocabulary) is as in CKPT.

    captioner export runs/coco_tvmax/version_0/checkpoints/last.ckpt --out coco_tvmax.ckpt
"""

from __future__ import annotations

from pathlib import Path

from captioner.commands.options import add_overwrite_argument, command_parser, report_error

HELP = "a self-contained copy of a checkpoint (its frozen encoder inside), for sharing"
PROG = "captioner export"


def main(argv: list[str]) -> int:
    parser = command_parser(PROG, __doc__)
    parser.add_argument("ckpt", type=Path, metavar="CKPT", help="checkpoint to export")
    parser.add_argument("--out", type=Path, required=True,
                        help="the self-contained checkpoint to write")
    add_overwrite_argument(parser)
    args = parser.parse_args(argv)

    from captioner.checkpointing import CheckpointError
    from captioner.frozen_encoder import export_self_contained
    from captioner.model.encoder import EncoderWeightsError
    from data_prep.paths import check_output_file

    try:
        check_output_file(args.out, [("CKPT", args.ckpt)], overwrite=args.overwrite)
        completed = export_self_contained(args.ckpt, args.out)
    except (CheckpointError, EncoderWeightsError, OSError, ValueError) as exc:
        return report_error(PROG, exc)
    told = "with its frozen encoder put in" if completed else "(it held its encoder already)"
    print(f"wrote {args.out} {told}")
    return 0
