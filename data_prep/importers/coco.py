"""COCO captions files (``captions_train2014.json``): ``images`` with ``id`` and ``file_name``,
``annotations`` with ``image_id`` and ``caption``; the ids are kept as ``cocoid``, so results
can be scored against the same file."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.importers.captions_text import read_text
from data_prep.importers.records import Caption, CaptionRecord, DatasetImportError, ProblemLog
from data_prep.settings_files import parse_json


def read_coco(path: Path, log: ProblemLog) -> list[CaptionRecord]:
    try:
        data = parse_json(read_text(path))
    except json.JSONDecodeError as exc:
        raise DatasetImportError(f"{path}: not valid JSON ({exc}), read as a COCO captions "
                                 "file (give --format if it is another)") from None
    for key in ("images", "annotations"):
        if not isinstance(data, dict) or not isinstance(data.get(key), list):
            karpathy = isinstance(data, dict) and "dataset" in data
            hint = (" (this looks like a Karpathy split file already: give it to "
                    "prepare-features directly)") if karpathy else ""
            raise DatasetImportError(
                f"{path}: not a COCO captions file: field {key!r} must be a list{hint}"
            )
    by_id: dict[int, CaptionRecord] = {}
    left_out: set[int] = set()  # ids of skipped images, whose captions need no second report
    for index, image in enumerate(data["images"]):
        where = f"{path.name} images[{index}]"
        image_id = image.get("id") if isinstance(image, dict) else None
        file_name = image.get("file_name") if isinstance(image, dict) else None
        if not _is_int(image_id) or not isinstance(file_name, str):
            log.add("malformed_record", where, f"{path}: images[{index}] needs an integer 'id' "
                    f"and a string 'file_name', got {image!r}", where=where, order=index)
            if _is_int(image_id):
                left_out.add(image_id)
        elif image_id in by_id:
            log.add("duplicate_entry", file_name, f"{path}: images[{index}] ({file_name}) "
                    f"repeats id {image_id} of {by_id[image_id].where}", where=where,
                    order=index, skipping="skipped")
        else:
            by_id[image_id] = CaptionRecord(file_name, [], where, index, cocoid=image_id)
    for index, annotation in enumerate(data["annotations"]):
        where, order = f"{path.name} annotations[{index}]", len(data["images"]) + index
        image_id = annotation.get("image_id") if isinstance(annotation, dict) else None
        caption = annotation.get("caption") if isinstance(annotation, dict) else None
        # The type first: True and 1.0 are equal to the key 1 of a dict.
        if not _is_int(image_id) or not isinstance(caption, str):
            log.add("malformed_record", where, f"{path}: annotations[{index}] needs an integer "
                    f"'image_id' and a string 'caption', got {annotation!r}",
                    where=where, order=order)
        elif image_id in by_id:
            by_id[image_id].captions.append(Caption(caption, where, order))
        elif image_id in left_out:
            continue
        else:
            log.add("malformed_record", where, f"{path}: annotations[{index}] refers to image_id "
                    f"{image_id}, which is not in 'images'", where=where, order=order)
    return list(by_id.values())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
