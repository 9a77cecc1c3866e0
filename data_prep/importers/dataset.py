"""The whole import: captions files with their image folders read, checked, split and written
as one Karpathy-split JSON file (see :mod:`data_prep.importers`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from data_prep.atomic import atomic_write
from data_prep.images import IMAGE_SUFFIXES
from data_prep.importers.checks import Item, readable_items, tokenized_items, uncaptioned_images
from data_prep.importers.formats import detect_format, read_captions
from data_prep.importers.records import (
    CaptionRecord,
    DatasetImportError,
    Problem,
    ProblemLog,
    skipped_summary,
)
from data_prep.importers.splits import SPLITS, assign_splits, parse_split
from data_prep.paths import OutputPathError, check_output_file
from data_prep.wording import counted

DEFAULT_SPLIT = "0.8,0.1,0.1"


def karpathy_json(splits: dict[str, list[Item]], name: str) -> dict:
    """The Karpathy-format document: images in split order (train, val, test), ``imgid`` their
    index, ``sentid`` a running index over all captions; ``filepath`` is the folder part of
    the path (``""`` for none), ``cocoid`` present only for COCO input."""
    images, sentid = [], 0
    for split in SPLITS:
        for item in splits[split]:
            path = PurePosixPath(item.image)
            imgid = len(images)
            sentids = list(range(sentid, sentid + len(item.sentences)))
            sentid += len(sentids)
            record = {
                "filepath": "" if str(path.parent) == "." else str(path.parent),
                "filename": path.name,
                "imgid": imgid,
                "split": split,
                "sentids": sentids,
                "sentences": [
                    {"tokens": list(tokens), "raw": raw, "imgid": imgid, "sentid": k}
                    for (raw, tokens), k in zip(item.sentences, sentids, strict=True)
                ],
            }
            if item.cocoid is not None:
                record["cocoid"] = item.cocoid
            images.append(record)
    return {"images": images, "dataset": name}


@dataclass(frozen=True)
class Source:
    """A captions file and the folder of its images, whose paths it gives relative to it."""

    captions: Path
    images: Path


@dataclass(frozen=True)
class ImportOptions:
    """What :func:`import_dataset` reads and writes; ``name`` None: the output file's stem
    without a leading ``dataset_``. Several ``sources`` (COCO's train2017 and val2017 captions
    with their folders) make one dataset: see :func:`image_root`."""

    sources: tuple[Source, ...]
    out: Path
    fmt: str = "auto"
    split: str = DEFAULT_SPLIT
    seed: int = 0
    on_error: str = "skip"
    name: str | None = None
    overwrite: bool = False  # whether an existing ``out`` may be replaced


@dataclass
class ImportReport:
    """What was written: ``images`` / ``captions`` per split, ``problems`` by reason,
    ``left_out`` (usable images beyond ``--split`` counts) and ``uncaptioned`` (image files
    in the sources' folders that their captions files do not name); the dataset's paths are
    relative to ``image_root``, ``fmt`` the formats the captions files were read as."""

    out: Path
    name: str
    fmt: str
    image_root: Path
    images: dict[str, int]
    captions: dict[str, int]
    problems: dict[str, list[Problem]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    uncaptioned: list[str] = field(default_factory=list)


def dataset_name(out: Path) -> str:
    """``dataset_flickr8k.json`` -> ``flickr8k``; ``photos.json`` -> ``photos``."""
    stem = out.stem
    return stem.removeprefix("dataset_") or stem


def _check_output(out: Path, reads: list[tuple[str, str | Path]], *, overwrite: bool) -> None:
    """check_output_file of --out, against the files the import reads."""
    try:
        check_output_file(out, reads, overwrite=overwrite)
    except OutputPathError as exc:
        raise DatasetImportError(str(exc)) from None


def import_dataset(options: ImportOptions, *, progress: bool = False) -> ImportReport:
    """Read, check, split and write; see the module docstring.

    Raises:
        DatasetImportError: a fatal problem, or any problem with ``on_error="fail"`` (the
            first in file order of the captions file's, else the first image's); the output
            file is then not written.
    """
    out = Path(options.out)
    if not options.sources:
        raise DatasetImportError("no captions file given")
    for source in options.sources:
        if not Path(source.images).is_dir():
            problem = ("is a file, not the folder of the images" if Path(source.images).exists()
                       else "image folder not found")
            raise DatasetImportError(f"{source.images}: {problem}")
    images = image_root(options.sources)
    spec = parse_split(options.split)
    reads = [("captions file", source.captions) for source in options.sources]
    if spec.lists is not None:
        reads.append(("split file", options.split))
    _check_output(out, reads, overwrite=True)
    log = ProblemLog(options.on_error)
    records, formats = [], []
    for source in options.sources:
        read, fmt = _read_source(source, images, options.fmt, log, first_order=_next_order(
            records, log))
        records += read
        formats.append(fmt)
    records = _unique_across_sources(records, log)
    fmt = ", ".join(dict.fromkeys(formats))
    listed = {record.image for record in records}
    # Before any image is decoded: an output named like one of the images would replace it,
    # and so would one named like an image file of the folder that no caption lists.
    _check_output(out, [("image", images / name) for name in listed], overwrite=True)
    target = Path(os.path.realpath(out))
    if (target.suffix.lower() in IMAGE_SUFFIXES and target.is_file()
            and any(target.is_relative_to(os.path.realpath(source.images))
                    for source in options.sources)):
        raise DatasetImportError(f"{out}: is an image file in the --images folder; writing the "
                                 "output there would replace it")
    _check_output(out, [], overwrite=options.overwrite)  # an earlier file, no input at stake
    items = tokenized_items(records, log)
    log.stop_if_failing()  # the captions file's problems, before any image is decoded
    items = readable_items(items, images, log, progress=progress)
    splits, left_out = assign_splits(items, spec, options.seed, log, listed=listed)
    for split in SPLITS:
        if not splits[split]:
            # What was skipped is the likely cause (a wrong --images folder: every image
            # missing), and no report follows this error: say it here.
            skipped = skipped_summary(log)
            raise DatasetImportError(
                f"split {split!r} would be empty ({len(items)} usable images, --split "
                f"{options.split}{'; ' + skipped if skipped else ''}); nothing was written"
            )
    # A name from bytes that are not UTF-8 (a file or argument name) holds surrogate escapes,
    # which no UTF-8 file can hold: the bytes that are not show as U+FFFD.
    name = os.fsencode(options.name or dataset_name(out)).decode("utf-8", "replace")
    with atomic_write(out) as handle:
        json.dump(karpathy_json(splits, name), handle, ensure_ascii=False)
    return ImportReport(
        out=out,
        name=name,
        fmt=fmt,
        image_root=images,
        images={split: len(splits[split]) for split in SPLITS},
        captions={split: sum(len(i.sentences) for i in splits[split]) for split in SPLITS},
        problems=log.by_reason(),
        left_out=left_out,
        uncaptioned=[name for source in options.sources
                     for name in _uncaptioned_in(source, images, listed)],
    )


def image_root(sources: tuple[Source, ...]) -> Path:
    """The folder the dataset's image paths are relative to: the one image folder, or the
    deepest folder holding all of them (``data/coco`` for ``data/coco/train2017`` and
    ``data/coco/val2017``, whose images are then ``train2017/NAME.jpg`` and ``val2017/...``,
    as in Karpathy's COCO file)."""
    folders = list(dict.fromkeys(Path(os.path.abspath(source.images)) for source in sources))
    if len(folders) == 1:
        return Path(sources[0].images)
    return Path(os.path.commonpath(folders))


def _prefix(source: Source, root: Path) -> str:
    """The path of ``source``'s image folder under ``root``, with ``/`` ("" for the root)."""
    relative = Path(os.path.relpath(os.path.abspath(source.images), os.path.abspath(root)))
    return "" if relative == Path(".") else relative.as_posix()


def _read_source(source: Source, root: Path, fmt: str, log: ProblemLog, *,
                 first_order: int) -> tuple[list[CaptionRecord], str]:
    """The records of ``source``'s captions file with their paths relative to ``root``, and the
    format it was read as. Its records, captions and problems are placed after ``first_order``
    (the end of the files read before), so that problems sort in the order of the files."""
    captions = Path(source.captions)
    if fmt == "auto" and captions.is_file():
        fmt = detect_format(captions)
    start = len(log.problems)
    records = read_captions(captions, fmt, log)
    if not records:
        empty = captions.stat().st_size == 0
        problems = log.problems[start:]
        unread = (f" as {fmt} ({counted(len(problems), 'line')} could not be read, the first: "
                  f"{problems[0].skipped}; is --format right?)") if problems else ""
        raise DatasetImportError(
            f"{captions}: {'captions file is empty' if empty else 'holds no captions'}{unread}"
        )
    log.problems[start:] = [replace(problem, order=problem.order + first_order)
                            for problem in log.problems[start:]]
    prefix = _prefix(source, root)
    for record in records:
        record.image = f"{prefix}/{record.image}" if prefix else record.image
        record.order += first_order
        record.captions = [replace(caption, order=caption.order + first_order)
                           for caption in record.captions]
    return records, fmt


def _next_order(records: list[CaptionRecord], log: ProblemLog) -> int:
    """The first place after every record, caption and problem read so far."""
    places = [record.order for record in records]
    places += [caption.order for record in records for caption in record.captions]
    places += [problem.order for problem in log.problems if math.isfinite(problem.order)]
    return int(max(places, default=-1)) + 1


def _unique_across_sources(records: list[CaptionRecord], log: ProblemLog
                           ) -> list[CaptionRecord]:
    """The records of all sources, an image path or COCO id that an earlier source gave
    reported as a duplicate entry (its first record is kept, as within one file)."""
    kept: list[CaptionRecord] = []
    first_of: dict[str | int, CaptionRecord] = {}
    for record in records:
        earlier = first_of.get(record.image) or (
            first_of.get(record.cocoid) if record.cocoid is not None else None)
        if earlier is not None:
            log.add("duplicate_entry", record.image, f"{record.image}: listed again at "
                    f"{record.where} (first at {earlier.where}"
                    f"{f', COCO id {record.cocoid}' if record.cocoid == earlier.cocoid else ''})",
                    where=record.where, order=record.order,
                    skipping="the later entry is skipped")
            continue
        kept.append(record)
        first_of[record.image] = record
        if record.cocoid is not None:
            first_of[record.cocoid] = record
    return kept


def _uncaptioned_in(source: Source, root: Path, listed: set[str]) -> list[str]:
    """The image files in ``source``'s folder that no captions file names, as paths under
    ``root``."""
    prefix = _prefix(source, root)
    own = {name.removeprefix(f"{prefix}/") for name in listed} if prefix else listed
    return [f"{prefix}/{name}" if prefix else name
            for name in uncaptioned_images(Path(source.images), own)]
