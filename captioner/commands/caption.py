"""``captioner caption``: caption image files with a trained checkpoint.

Output formats (one record per readable image, in input order):

* ``text``: ``PATH<TAB>caption`` per line;
* ``jsonl``: one JSON object per line: ``image`` (path), ``caption``, ``tokens`` (T words),
  ``log_prob``, ``mapping`` (output attention mapping), ``grid`` ([h, w]) and ``attention``
  (T nested lists of h x w output-attention weights, one map per token);
* ``coco``: the COCO results format, a JSON list of ``{"image_id": int, "caption": str}``.
  The image id is the file stem when it is all digits (``391895.jpg``) or the digits after its
  last underscore (COCO's ``COCO_val2014_000000391895.jpg``). When any file has no such id or
  two files share one, every image instead gets its 1-based position in the input list (the
  order printed by ``--format text``) and a note says so.

Unreadable images are reported by name on stderr and skipped; the exit status is then 1, after
all other images were captioned and written. text and jsonl records are written as soon as
each batch is done, the COCO list at the end (also when interrupted).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from captioner.inference import Caption, Captioner

HELP = "caption images or folders of images (text, jsonl with per-word attention, COCO results)"

FORMATS = ("text", "jsonl", "coco")
# Files found inside folders; files named explicitly are always tried, whatever their suffix.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
)
_COCO_ID = re.compile(r"(?:^|_)(\d+)$")


def collect_images(inputs: Sequence[str | Path]) -> list[Path]:
    """Expand files and folders into image paths: folders recursively, sorted, by suffix.

    Raises:
        FileNotFoundError: an input does not exist. ValueError: a folder holds no images.
    """
    paths: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(
                p for p in item.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
            )
            if not found:
                raise ValueError(
                    f"{item}: folder holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})"
                )
            paths.extend(found)
        elif item.exists():
            paths.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such file or folder")
    return paths


def coco_image_ids(paths: Sequence[Path]) -> tuple[list[int], bool]:
    """COCO image ids for ``paths`` by the rule in the module docstring.

    Returns the ids and whether they come from the file names (False: input positions).
    """
    matches = [_COCO_ID.search(Path(p).stem) for p in paths]
    ids = [int(m.group(1)) if m else None for m in matches]
    if all(i is not None for i in ids) and len(set(ids)) == len(ids):
        return ids, True
    return list(range(1, len(paths) + 1)), False


DEVICE_HELP = "torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu)"


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of every command that captions with a checkpoint: beam size, maximum
    caption length, images per batch and device."""
    parser.add_argument("--beam-size", type=int, default=3, help="default: %(default)s")
    parser.add_argument("--max-length", type=int, default=20, help="default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=16, help="default: %(default)s")
    parser.add_argument("--device", help=DEVICE_HELP)


def open_captioner(checkpoint: Path, device: str | None = None) -> Captioner:
    """`Captioner.load` on ``device`` (see :func:`captioner.inference.resolve_device`), with
    every load failure turned into a ValueError naming the file."""
    from captioner.inference import Captioner, resolve_device

    map_location = resolve_device(device)
    try:
        return Captioner.load(checkpoint, map_location=map_location)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{checkpoint}: cannot load the checkpoint: {exc}") from exc


def caption_files(
    captioner: Captioner,
    paths: Sequence[Path],
    *,
    beam_size: int = 3,
    max_length: int = 20,
    batch_size: int = 16,
    progress: bool = False,
) -> Iterator[tuple[Path, Caption | None, str | None]]:
    """Caption ``paths`` batch by batch; yields ``(path, caption, None)`` or
    ``(path, None, reason)`` for an unreadable file, in input order."""
    from tqdm import tqdm

    from data_prep.images import ImageLoadError, load_image

    with tqdm(total=len(paths), unit="image", disable=not progress, file=sys.stderr) as bar:
        for start in range(0, len(paths), batch_size):
            chunk = paths[start : start + batch_size]
            images, errors = {}, {}
            for path in chunk:
                try:
                    images[path] = load_image(path)
                except ImageLoadError as exc:
                    errors[path] = str(exc)
            captions = captioner.caption(
                list(images.values()), beam_size=beam_size, max_length=max_length,
                batch_size=batch_size,
            ) if images else []
            by_path = dict(zip(images, captions, strict=True))
            for path in chunk:
                yield path, by_path.get(path), errors.get(path)
            bar.update(len(chunk))


def jsonl_record(path: Path, caption: Caption, mapping: str) -> dict:
    """The ``jsonl`` record of one caption (see the module docstring)."""
    attention = caption.attention.detach().float().cpu()
    return {
        "image": str(path), "caption": caption.text, "tokens": list(caption.tokens),
        "log_prob": float(caption.log_prob), "mapping": mapping,
        "grid": list(attention.shape[1:]), "attention": attention.tolist(),
    }


def _write_json_atomically(data: object, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, ensure_ascii=False)
    os.replace(tmp, path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner caption", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR")
    parser.add_argument("--ckpt", required=True, type=Path, help="trained checkpoint (.ckpt)")
    add_decoding_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument("--out", type=Path, help="output file (default: standard output)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    for name in ("beam_size", "max_length", "batch_size"):
        if getattr(args, name) < 1:
            print(f"captioner caption: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    try:
        paths = collect_images(args.inputs)
        captioner = open_captioner(args.ckpt, args.device)
    except (OSError, ValueError) as exc:
        print(f"captioner caption: {exc}", file=sys.stderr)
        return 2
    ids, from_names = coco_image_ids(paths) if args.format == "coco" else ([], True)
    if not from_names:
        print("captioner caption: not every file name is a distinct numeric id; COCO image ids "
              "are the 1-based input positions (see --format text for the order)", file=sys.stderr)
    out: TextIO = sys.stdout
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.format != "coco":
            out = args.out.open("w", encoding="utf-8")
    results, failures = [], []
    try:
        for index, (path, caption, error) in enumerate(caption_files(
            captioner, paths, beam_size=args.beam_size, max_length=args.max_length,
            batch_size=args.batch_size, progress=not args.no_progress and len(paths) > 1,
        )):
            if caption is None:
                failures.append(path)
                print(f"captioner caption: skipped {error}", file=sys.stderr)
            elif args.format == "coco":
                results.append({"image_id": ids[index], "caption": caption.text})
            else:
                if args.format == "jsonl":
                    record = jsonl_record(path, caption, captioner.output_attention_name)
                    line = json.dumps(record, ensure_ascii=False)
                else:
                    line = f"{path}\t{caption.text}"
                out.write(line + "\n")
                out.flush()
    finally:
        if args.format == "coco":
            if args.out is not None:
                _write_json_atomically(results, args.out)
            else:
                json.dump(results, sys.stdout, ensure_ascii=False)
                sys.stdout.write("\n")
        elif out is not sys.stdout:
            out.close()
    if failures:
        print(f"captioner caption: {len(failures)} of {len(paths)} images could not be read: "
              + ", ".join(map(str, failures)), file=sys.stderr)
        return 1
    return 0
