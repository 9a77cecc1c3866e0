"""JSONL captions files: one object per line, ``{"image": "relative/path.jpg", "captions":
["...", ...]}`` (other keys are ignored; blank lines are allowed)."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.importers.captions_text import text_lines
from data_prep.importers.records import CaptionRecord, ProblemLog, add_json_record
from data_prep.settings_files import parse_json


def is_record_line(line: str) -> bool:
    """Whether ``line`` is a JSON object with an ``image`` key (a JSONL record)."""
    try:
        record = parse_json(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "image" in record


def read_jsonl(path: Path, log: ProblemLog) -> list[CaptionRecord]:
    records = []
    for number, line in enumerate(text_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            # Without its line end, which would otherwise be the column of a cut-off record.
            record = parse_json(line.rstrip("\r\n"))
        except json.JSONDecodeError as exc:
            log.add("malformed_record", where, f"{path} line {number}: not valid JSON "
                    f"({exc.msg}: column {exc.colno})", where=where, order=number)
            continue
        add_json_record(records, record, where, f"{path} line {number}", number, log)
    return records
