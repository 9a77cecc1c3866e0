"""The captions-file formats, told apart by extension or content, each read by its module."""

from __future__ import annotations

import io
import json
from pathlib import Path

from data_prep.importers.captions_text import first_line, read_text
from data_prep.importers.coco import read_coco
from data_prep.importers.delimited import read_delimited
from data_prep.importers.json_array import read_json_array
from data_prep.importers.jsonl import is_record_line, read_jsonl
from data_prep.importers.records import CaptionRecord, DatasetImportError, ProblemLog, gathered
from data_prep.paths import require_file
from data_prep.settings_files import parse_json

FORMATS: tuple[str, ...] = ("auto", "jsonl", "json", "csv", "tsv", "coco")


def detect_format(path: Path) -> str:
    """The format of captions file ``path``: by extension (``.jsonl``/``.ndjson``, ``.csv``,
    ``.tsv``), else by content: a JSON array is ``json``; lines holding JSON objects with an
    ``image`` key are JSONL (also when the first of them is malformed), any other JSON object
    is COCO; a header line with a tab is TSV, else CSV."""
    suffix = path.suffix.lower()
    by_suffix = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
    if suffix in by_suffix:
        return by_suffix[suffix]
    text = read_text(path)  # once: a COCO file is one line of megabytes
    first = first_line(path, text).lstrip()
    if first.startswith("["):
        return "json"
    if not first.startswith("{"):
        return "tsv" if "\t" in first else "csv"
    try:
        document = parse_json(text)
    except json.JSONDecodeError:
        # Not one document: JSONL (its first line maybe malformed) if a line is a record.
        lines = io.StringIO(text, newline="")
        return "jsonl" if any(is_record_line(line) for line in lines) else "coco"
    return "jsonl" if isinstance(document, dict) and "image" in document else "coco"


def read_captions(path: Path, fmt: str, log: ProblemLog) -> list[CaptionRecord]:
    """The images of captions file ``path`` in format ``fmt`` (``"auto"``: detected), one
    record per image in file order, paths normalized, duplicates reported."""
    if fmt not in FORMATS:
        raise DatasetImportError(f"unknown captions format {fmt!r}; expected one of "
                                 f"{', '.join(FORMATS)}")
    try:
        require_file(path, "captions file")
    except (OSError, ValueError) as exc:
        raise DatasetImportError(str(exc)) from None
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "jsonl":
        return gathered(read_jsonl(path, log), log, merge=False)
    if fmt == "json":
        return gathered(read_json_array(path, log), log, merge=False)
    if fmt == "coco":
        return gathered(read_coco(path, log), log, merge=False)
    return gathered(read_delimited(path, "\t" if fmt == "tsv" else ",", log), log, merge=True)
