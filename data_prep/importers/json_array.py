"""JSON captions files: an array of the objects a JSONL file holds one per line."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.importers.captions_text import read_text
from data_prep.importers.records import (
    CaptionRecord,
    DatasetImportError,
    ProblemLog,
    add_json_record,
)
from data_prep.settings_files import parse_json


def read_json_array(path: Path, log: ProblemLog) -> list[CaptionRecord]:
    """The records of a JSON array of JSONL's objects, each placed by its index."""
    try:
        data = parse_json(read_text(path))
    except json.JSONDecodeError as exc:
        raise DatasetImportError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise DatasetImportError(f"{path}: a JSON {type(data).__name__}, not an array of "
                                 "records (give --format coco for a COCO captions file)")
    records: list[CaptionRecord] = []
    for index, record in enumerate(data):
        where = f"{path.name}[{index}]"
        add_json_record(records, record, where, f"{path}: [{index}]", index, log)
    return records
