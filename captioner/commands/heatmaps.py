"""``captioner heatmaps``: per-word output-attention figures for captioned images.

For every checkpoint MODEL and readable image STEM it writes ``OUT/MODEL/STEM/``:

* ``NN_word.png``: the image (own aspect ratio up to 4:1, longer side ``--size`` pixels)
  with the attention of word NN (0-based) drawn over it (see `captioner.heatmaps`);
* ``strip.png``: the whole caption, one panel per word, with the colour bar;
* ``attention.npz`` and ``attention.json``: the raw weights (tokens, grid, T x h x w maps).

MODEL names the checkpoint: a run's checkpoint (``runs/NAME/version_N/checkpoints/F.ckpt``, as
``fit`` writes it) is ``NAME``, then ``NAME_vN`` and ``NAME_vN_F`` where that is shared; any other
checkpoint is named by its file stem, as STEM names the image, both sanitized
(``[A-Za-z0-9._-]``): when two share one, their parent folder's name goes in front
(``models/tvmax/last.ckpt`` -> ``tvmax_last``), and a short hash of the full path behind if
that is still shared (``captioner.heatmaps.checkpoint_names``).
``OUT/index.json`` lists every image's files, caption and the colour scale.

Colour scale: one scale 0..vmax for every word, image and model of the run, so colours are
comparable across them. vmax is ``--vmax`` when given (use it to compare separate runs), else
the largest attention weight of the whole run. Zero attention is transparent (``--zero-style
transparent``, the default) or a hard white mask (``white``, the paper's figure style).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captioner.commands.options import (
    add_decoding_arguments,
    add_figure_arguments,
    command_parser,
    decoding_options,
    report_error,
)

HELP = "per-word attention heatmaps, caption strips and raw weights for images"


def _parser() -> argparse.ArgumentParser:
    parser = command_parser("captioner heatmaps", __doc__)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR")
    parser.add_argument("--ckpt", required=True, type=Path, action="append",
                        help="trained checkpoint; repeat to compare models on one colour scale")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    add_figure_arguments(parser, vmax_default="run maximum")
    add_decoding_arguments(parser)
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from captioner.image_files import collect_images
    from captioner.inference import open_captioner
    from data_prep.files import check_output_dir

    try:
        check_output_dir(args.out)
        paths = collect_images(args.inputs)
        captioners = [open_captioner(path, args.device) for path in args.ckpt]
        options = [decoding_options(args, captioner.decoding) for captioner in captioners]
    except (OSError, ValueError) as exc:
        return report_error("captioner heatmaps", exc)

    from tqdm import tqdm

    from captioner.heatmaps import (
        AttentionRecord,
        checkpoint_names,
        shared_vmax,
        unique_stems,
        write_heatmaps,
    )
    from data_prep.files import atomic_write
    from data_prep.images import load_image

    progress = not args.no_progress and len(paths) > 1
    captions = {}
    failed: dict[Path, str] = {}
    models = checkpoint_names(args.ckpt)
    for model, captioner, decoding in zip(models, captioners, options, strict=True):
        for result, caption in captioner.caption_files(
            paths, decoding, batch_size=args.batch_size, progress=progress
        ):
            if caption is None:
                failed[result.path] = result.error
            else:
                captions[model, result.path] = caption
    for error in failed.values():
        print(f"captioner heatmaps: skipped {error}", file=sys.stderr)
    if not captions:
        print("captioner heatmaps: no image could be captioned", file=sys.stderr)
        return 1
    vmax = args.vmax or shared_vmax(c.attention.float().numpy() for c in captions.values())

    stems = dict(zip(paths, unique_stems(paths), strict=True))
    index = {"vmax": vmax, "vmax_rule": "--vmax" if args.vmax else "maximum weight of the run",
             "zero_style": args.zero_style, "upsample": args.upsample, "images": []}
    good = [p for p in paths if p not in failed]
    for path in tqdm(good, desc="figures", unit="image", disable=not progress, file=sys.stderr):
        image = load_image(path)
        for model, checkpoint, captioner in zip(models, args.ckpt, captioners, strict=True):
            caption = captions[model, path]
            record = AttentionRecord(str(path), caption.text, list(caption.tokens),
                                     caption.attention.float().numpy(),
                                     captioner.output_attention_name, vmax)
            folder = args.out / model / stems[path]
            files = write_heatmaps(folder, image, record, zero_style=args.zero_style,
                                   upsample=args.upsample, max_side=args.size)
            index["images"].append({
                "image": str(path), "model": model, "checkpoint": str(checkpoint),
                "mapping": record.mapping, "caption": caption.text,
                "files": [str(f.relative_to(args.out)) for f in files],
            })
    with atomic_write(args.out / "index.json") as handle:
        json.dump(index, handle, indent=1, ensure_ascii=False)
    print(f"wrote heatmaps of {len(good)} images x {len(models)} models to {args.out} "
          f"(colour scale 0..{vmax:.4g})")
    if failed:
        print(f"captioner heatmaps: {len(failed)} of {len(paths)} images could not be read",
              file=sys.stderr)
        return 1
    return 0
