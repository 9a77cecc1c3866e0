"""Turn a folder of photos and a captions file into a Karpathy-split JSON file; or several
captions files, each with its folder, into one (:func:`image_root`: COCO's train2017 and
val2017 captions and folders become one dataset whose paths are ``train2017/NAME.jpg`` and
``val2017/NAME.jpg``). An image, or a COCO id, that an earlier captions file gave is a
``duplicate_entry`` of the later one.

The result is read unchanged by :func:`data_prep.karpathy.load_karpathy` (and so by
``captioner prepare-features`` and ``captioner fit``). Image names are paths relative to the
image folder, written with ``/``.

Captions files (the reader is chosen by :func:`detect_format`, or explicitly):

* ``jsonl``: one object per line, ``{"image": "relative/path.jpg", "captions": ["...", ...]}``
  (other keys are ignored; blank lines are allowed);
* ``json``: a JSON array of the same objects;
* ``csv`` / ``tsv``: a header line naming the columns ``image`` and ``caption`` (other columns
  are ignored), then one caption per line; an image has as many lines as captions. CSV fields
  follow the usual quoting (Flickr8k's ``captions.txt``: captions holding commas are quoted);
  TSV fields are taken literally, without quoting;
* ``coco``: a COCO captions file (``captions_train2014.json``): ``images`` with ``id`` and
  ``file_name``, ``annotations`` with ``image_id`` and ``caption``; the ids are kept as
  ``cocoid``, so results can be scored against the same file.

A second record for the same image (a JSONL line or a COCO image repeating a path, a COCO id
used twice) is a ``duplicate_entry``: the first record is kept and the later one is skipped,
never merged, because a file concatenated twice would otherwise double every caption. (CSV and
TSV files list an image once per caption by design.) A caption of an image with the same
tokens as an earlier caption of that image is a ``duplicate_caption``, skipped for the same
reason: it would weigh twice in training and in the references of the scores. Two paths with
the same file name in different folders are different images.

A CSV quote left open (``a.jpg,"A dog``) makes the csv module read on over the line ends, up to
the next quote or the end of the file, and so would swallow the captions of the lines after it.
A record read over several lines is therefore kept only when it is well formed (a quoted
caption holding a line break); otherwise its first line is reported as an unclosed quote and
the lines after it are read again as records of their own.

Every problem is reported under one of the reasons in :data:`REASONS`, with its place in the
captions file. With ``on_error="skip"`` the bad record, caption or image is left out and listed
in the :class:`ImportReport`; with ``on_error="fail"`` :class:`DatasetImportError` is raised
once the captions file has been read, naming its first problem in file order and the places of
the others, before any image is decoded; then at the first missing or unreadable image.
Problems with the input as a whole (unreadable or non-UTF-8 captions file, missing CSV header,
invalid ``--split``, an empty split) always raise.
"""

from __future__ import annotations

import codecs
import csv
import decimal
import hashlib
import io
import json
import math
import os
import shlex
import unicodedata
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path, PurePosixPath

from data_prep.atomic import atomic_write
from data_prep.images import IMAGE_SUFFIXES, ImageLoadError, load_image
from data_prep.karpathy import normalize_image_path, tokenize
from data_prep.paths import OutputPathError, check_output_file, require_file
from data_prep.settings_files import parse_json
from data_prep.wording import counted, first_names, shown

FORMATS: tuple[str, ...] = ("auto", "jsonl", "json", "csv", "tsv", "coco")
SPLITS: tuple[str, ...] = ("train", "val", "test")
ON_ERROR: tuple[str, ...] = ("skip", "fail")
DEFAULT_SPLIT = "0.8,0.1,0.1"
# Reason -> how it is named in messages, in the order the checks run.
REASONS: dict[str, str] = {
    "malformed_record": "malformed record",
    "invalid_path": "invalid image path",
    "duplicate_entry": "duplicate entry",
    "empty_caption": "empty caption",
    "duplicate_caption": "duplicate caption",
    "no_captions": "image without captions",
    "missing_image": "missing image",
    "unreadable_image": "unreadable image",
    "not_in_split_file": "image not in the split file",
    "unknown_in_split_file": "split-file name without captions",
}


class DatasetImportError(ValueError):
    """A problem that stops the import; the message names the file, line or field and value."""


@dataclass(frozen=True)
class Caption:
    """One caption as read: ``where`` names its place (``captions.csv line 9``,
    ``captions.jsonl line 3 caption 2``, ``captions.json annotations[4]``) and ``order`` its
    position in the file (the line; for COCO, images then annotations counted through), by
    which problems are sorted."""

    text: str
    where: str
    order: int


@dataclass
class CaptionRecord:
    """One image of a captions file: ``image`` is its normalized relative path, ``where`` and
    ``order`` the place it was read from (as for :class:`Caption`), ``cocoid`` its COCO id if
    known."""

    image: str
    captions: list[Caption]
    where: str
    order: int
    cocoid: int | None = None


@dataclass(frozen=True)
class Problem:
    """One reported problem: ``reason`` (a key of :data:`REASONS`), ``item`` (the image path
    or record it concerns), a one-line ``detail`` naming the file and line, ``where`` its place
    (``captions.csv line 8``), ``order`` its position in the captions file (``inf`` for
    problems outside it), so that problems can be listed in file order, and ``skipping``, what
    skipping it leaves out, where that is not the whole item (``the later entry``)."""

    reason: str
    item: str
    detail: str
    where: str
    order: float
    skipping: str = ""

    @property
    def skipped(self) -> str:
        """The detail with what skipping the problem leaves out: as skipped by default (with
        ``--on-error fail`` nothing is skipped, and the detail alone names the problem)."""
        return f"{self.detail}; {self.skipping}" if self.skipping else self.detail


class ProblemLog:
    """Collects problems; with ``on_error="fail"``, :meth:`stop_if_failing` raises for them.

    The captions file is checked in stages (records, paths, captions), each finding its own
    kind of problem; they are all collected before the first stop, so that the error names the
    first problem in file order rather than the first found by an earlier stage.
    """

    def __init__(self, on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise DatasetImportError(f"on_error must be one of {', '.join(ON_ERROR)}")
        self.on_error = on_error
        self.problems: list[Problem] = []

    def add(self, reason: str, item: str, detail: str, *, where: str, order: float,
            skipping: str = "") -> None:
        self.problems.append(Problem(reason, item, detail, where, order, skipping))

    def stop_if_failing(self) -> None:
        """With ``on_error="fail"`` and a problem found, raise :class:`DatasetImportError`
        naming the first problem in file order, then the places of the others."""
        if self.on_error != "fail" or not self.problems:
            return
        first, *rest = sorted(self.problems, key=lambda problem: problem.order)
        others = first_names([f"{REASONS[p.reason]} at {p.where}" for p in rest])
        more = f" (and {len(rest)} more: {others})" if rest else ""
        raise DatasetImportError(f"{REASONS[first.reason]}: {first.detail}{more}")

    def by_reason(self) -> dict[str, list[Problem]]:
        """The problems grouped by reason, reasons in :data:`REASONS` order, each group in
        file order."""
        groups: dict[str, list[Problem]] = {}
        for reason in REASONS:
            found = [p for p in self.problems if p.reason == reason]
            if found:
                groups[reason] = sorted(found, key=lambda problem: problem.order)
        return groups


# --- reading captions files -------------------------------------------------------------------


def detect_format(path: Path) -> str:
    """The format of captions file ``path``: by extension (``.jsonl``/``.ndjson``, ``.csv``,
    ``.tsv``), else by content: a JSON array is ``json``; lines holding JSON objects with an
    ``image`` key are JSONL (also when the first of them is malformed), any other JSON object
    is COCO; a header line with a tab is TSV, else CSV."""
    suffix = path.suffix.lower()
    by_suffix = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
    if suffix in by_suffix:
        return by_suffix[suffix]
    text = _read_text(path)  # once: a COCO file is one line of megabytes
    first = _first_line(path, text).lstrip()
    if first.startswith("["):
        return "json"
    if not first.startswith("{"):
        return "tsv" if "\t" in first else "csv"
    try:
        document = parse_json(text)
    except json.JSONDecodeError:
        # Not one document: JSONL (its first line maybe malformed) if a line is a record.
        lines = io.StringIO(text, newline="")
        return "jsonl" if any(_is_record_line(line) for line in lines) else "coco"
    return "jsonl" if isinstance(document, dict) and "image" in document else "coco"


def _is_record_line(line: str) -> bool:
    """Whether ``line`` is a JSON object with an ``image`` key (a JSONL record)."""
    try:
        record = parse_json(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "image" in record


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
        return _gather(_read_jsonl(path, log), log, merge=False)
    if fmt == "json":
        return _gather(_read_json_array(path, log), log, merge=False)
    if fmt == "coco":
        return _gather(_read_coco(path, log), log, merge=False)
    return _gather(_read_delimited(path, "\t" if fmt == "tsv" else ",", log), log, merge=True)


def _read_text(path: Path) -> str:
    """The text of ``path``, UTF-8 with or without a byte-order mark (spreadsheet programs
    often write one before the header), or UTF-16 with its byte-order mark (Windows programs'
    "Unicode text"). Read whole and decoded at once, so that a byte that is not UTF-8 can be
    named by its line and offset in the file."""
    data = path.read_bytes()
    for magic, kind in COMPRESSED_MAGIC:
        if data.startswith(magic):
            raise DatasetImportError(f"{path}: is a {kind} file, not text; decompress it and "
                                     "give the captions file")
    encoding = "utf-16" if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else (
        "utf-8")
    nul = data.find(b"\0") if encoding == "utf-8" else -1
    if nul >= 0:
        # Valid UTF-8, but no text holds NUL: UTF-16 without its byte-order mark puts one
        # beside every ASCII character, which the header check would show as 'i\x00m\x00...'.
        # ASCII in UTF-16 puts the NUL after each character (little-endian) or before it.
        order = "utf-16le" if nul % 2 else "utf-16be"
        raise DatasetImportError(
            f"{path}: holds a NUL byte (byte offset {nul:,}), so it is not UTF-8 text; if it is "
            f"UTF-16 without a byte-order mark, convert it: {_conversion(path, order)}")
    try:
        return data.decode(encoding).removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        if encoding == "utf-16":
            raise DatasetImportError(f"{path}: starts with a UTF-16 byte-order mark but is not "
                                     f"UTF-16 text ({exc.reason} at byte offset {exc.start:,})"
                                     ) from None
        raise DatasetImportError(_not_utf8(path, data, exc)) from None


SHOWN_CHARS = 80  # of a line quoted in an error


# The leading bytes of compressed files, which a captions file given as such begins with.
COMPRESSED_MAGIC = ((b"\x1f\x8b", "gzip-compressed"), (b"PK\x03\x04", "zip"),
                    (b"\xfd7zXZ\x00", "xz-compressed"), (b"\x28\xb5\x2f\xfd", "zstd-compressed"))


def _not_utf8(path: Path, data: bytes, exc: UnicodeDecodeError) -> str:
    """Where the first byte of ``data`` that is not UTF-8 lies, with the bytes before it on
    its line (valid UTF-8 by definition) and how to convert the file."""
    # Lines end as the readers split them (open(newline="")): \n, \r\n or a lone \r.
    line_start = max(data.rfind(b"\n", 0, exc.start), data.rfind(b"\r", 0, exc.start)) + 1
    line = (data.count(b"\n", 0, exc.start) + data.count(b"\r", 0, exc.start)
            - data.count(b"\r\n", 0, exc.start) + 1)
    before = data[line_start:exc.start].decode("utf-8").removeprefix("\ufeff")
    return (f"{path} line {line} (byte offset {exc.start:,}): not UTF-8 text: byte "
            f"0x{data[exc.start]:02x} after {before[-SHOWN_CHARS:]!r} ({exc.reason}); if the file "
            f"is Windows-1252 or Latin-1 text, convert it: {_conversion(path, 'cp1252')}")


def _conversion(path: Path, encoding: str) -> str:
    """The iconv command that writes ``path``, of ``encoding``, as UTF-8 beside it."""
    converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
    return (f"iconv -f {encoding} -t utf-8 {shlex.quote(str(path))} > "
            f"{shlex.quote(str(converted))}")


def _text_lines(path: Path) -> Iterator[str]:
    """The lines of ``path`` with their line ends, split as by ``open(newline="")``."""
    return iter(io.StringIO(_read_text(path), newline=""))


def _first_line(path: Path, text: str) -> str:
    """The first line of ``text`` (the captions file ``path``'s) that is not blank."""
    for line in io.StringIO(text, newline=""):
        if line.strip():
            return line
    raise DatasetImportError(f"{path}: captions file is empty")


def _read_jsonl(path: Path, log: ProblemLog) -> list[CaptionRecord]:
    records = []
    for number, line in enumerate(_text_lines(path), start=1):
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
        _add_record(records, record, where, f"{path} line {number}", number, log)
    return records


def _read_json_array(path: Path, log: ProblemLog) -> list[CaptionRecord]:
    """The records of a JSON array of JSONL's objects, each placed by its index."""
    try:
        data = parse_json(_read_text(path))
    except json.JSONDecodeError as exc:
        raise DatasetImportError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise DatasetImportError(f"{path}: a JSON {type(data).__name__}, not an array of "
                                 "records (give --format coco for a COCO captions file)")
    records: list[CaptionRecord] = []
    for index, record in enumerate(data):
        where = f"{path.name}[{index}]"
        _add_record(records, record, where, f"{path}: [{index}]", index, log)
    return records


def _add_record(records: list[CaptionRecord], record: object, where: str, place: str,
                order: int, log: ProblemLog) -> None:
    """Append JSON record ``record`` (``{"image": str, "captions": [str, ...]}``) read at
    ``where`` (short) / ``place`` (with the file's path) to ``records``, or report why not."""
    image = record.get("image") if isinstance(record, dict) else None
    captions = record.get("captions") if isinstance(record, dict) else None
    if not isinstance(record, dict):
        problem = f"must be a JSON object, got {type(record).__name__}"
    elif absent := [field for field in ("image", "captions") if field not in record]:
        problem = (f"field {absent[0]!r} is missing (a record holds 'image' and "
                   f"'captions'; it has {', '.join(map(repr, record)) or 'no field'})")
    elif not isinstance(image, str):
        problem = f"field 'image' must be a string, got {image!r}"
    elif not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        problem = f"field 'captions' must be a list of strings, got {captions!r}"
    else:
        records.append(CaptionRecord(image, [
            Caption(text, f"{where} caption {k}", order)
            for k, text in enumerate(captions, start=1)
        ], where, order))
        return
    log.add("malformed_record", where, f"{place}: {problem}", where=where, order=order)


class _Lines:
    """The lines of a text for a csv reader, and where the row it reads starts. After an
    unclosed quote, the lines of the row but its first can be put back, to be read again as
    rows of their own."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._source = lines
        self._again: list[str] = []  # put back; the next line to read is the last
        self.row: list[str] = []  # the lines of the row being read
        self.first = 1  # the number of its first line

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = self._again.pop() if self._again else next(self._source)
        self.row.append(line)
        return line

    def next_row(self) -> None:
        self.first += len(self.row)
        self.row = []

    def read_again_after_first(self) -> None:
        self._again.extend(reversed(self.row[1:]))
        del self.row[1:]


def _rows(lines: _Lines, reader) -> Iterator[tuple[int, list[str], list[str] | csv.Error]]:
    """``(first line number, lines, fields)`` per row of ``reader``, which reads ``lines``;
    a row the csv module refuses (a field over its size limit) comes as the ``csv.Error``, so
    that the rows after it can still be read."""
    while True:
        lines.next_row()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            row = exc
        yield lines.first, list(lines.row), row


@dataclass(frozen=True)
class _Table:
    """The layout of a CSV or TSV captions file, from its header. (TSV fields are literal:
    a TSV row is always one line, and never an unclosed quote.)"""

    delimiter: str
    header: list[str]
    image: int  # the index of the image column
    caption: int

    @classmethod
    def from_header(cls, path: Path, delimiter: str, rows) -> _Table:
        """The layout named by the first non-empty row of ``rows`` (see :func:`_rows`)."""
        expected = "image,caption" if delimiter == "," else "image<TAB>caption"
        for first, _, row in rows:
            if isinstance(row, csv.Error):
                raise DatasetImportError(f"{path} line {first}: {row}")
            if row:
                break
        else:
            raise DatasetImportError(f"{path}: captions file is empty")
        columns = [name.strip().lower() for name in row]
        if "image" not in columns or "caption" not in columns:
            raise DatasetImportError(
                f"{path}: the first line must be the header {expected!r} (columns 'image' and "
                f"'caption'), got {shown(delimiter.join(row), SHOWN_CHARS)}"
            )
        return cls(delimiter, row, columns.index("image"), columns.index("caption"))

    def problem(self, first: int, lines: list[str], row: list[str] | csv.Error) -> str | None:
        """What is wrong with a row read from ``lines`` (starting at line ``first``), or
        None."""
        if self._unclosed_quote(lines, row):
            last = first + len(lines) - 1
            quoted = shown(lines[0].rstrip("\r\n"), SHOWN_CHARS)
            if last == first:
                return (f"unclosed quote in {quoted}: it is still open at the end of the file; "
                        "the line is skipped")
            again = (f"line {last} is read again on its own" if last == first + 1 else
                     f"lines {first + 1}-{last} are read again on their own")
            return (f"unclosed quote in {quoted}: it ran on over lines {first}-{last} "
                    f"({len(lines)} lines read as one record); line {first} is skipped and "
                    f"{again}")
        if isinstance(row, csv.Error):
            return str(row)
        line = lines[0].rstrip("\r\n")
        if (self.delimiter == "," and len(lines) == 1
                and not self._strictly_quoted([line.rstrip(" \t")])):
            # The csv module drops the quotes of '"a dog" on grass' and reads on: the
            # caption's own quotes, or a field's, lost without a word.
            return (f"a quote closes before the end of its field in {shown(line, SHOWN_CHARS)}; "
                    'quote the whole field, doubling the quotes inside it ("""a dog"" on grass")')
        if len(row) != len(self.header):
            # TSV is read literally (no quoting): a tab cannot be part of a caption there.
            advice = ("captions holding a comma must be quoted" if self.delimiter == "," else
                      "a caption cannot hold a tab in TSV")
            return (f"{len(row)} fields, expected {len(self.header)} "
                    f"({self.delimiter.join(self.header)}); {advice}")
        return None

    def _unclosed_quote(self, lines: list[str], row: list[str] | csv.Error) -> bool:
        """Whether a quote was left open: a field ran over a line end, as a quoted caption
        holding a line break does too, and then the row is broken: refused by the csv module
        (a field over its size limit), the wrong number of fields, a quote not closed right
        before a delimiter or line end (as at the next quote of the file, or the end of the
        file), or later lines that read as records of their own."""
        fields = row if isinstance(row, list) else []
        if len(lines) == 1 and not any("\n" in f or "\r" in f for f in fields):
            return False
        return (isinstance(row, csv.Error) or len(row) != len(self.header)
                or not self._strictly_quoted(lines)
                or any(self._is_record(line) for line in lines[1:]))

    def _strictly_quoted(self, lines: list[str]) -> bool:
        try:
            list(csv.reader(lines, delimiter=self.delimiter, strict=True))
        except csv.Error:
            return False
        return True

    def _is_record(self, line: str) -> bool:
        """Whether ``line`` alone reads as a record whose image is an image file name."""
        fields = next(csv.reader([line], delimiter=self.delimiter), [])
        return (len(fields) == len(self.header)
                and PurePosixPath(fields[self.image].strip()).suffix.lower() in IMAGE_SUFFIXES)


def _read_delimited(path: Path, delimiter: str, log: ProblemLog) -> list[CaptionRecord]:
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    lines = _Lines(_text_lines(path))
    rows = _rows(lines, csv.reader(lines, delimiter=delimiter, quoting=quoting))
    table = _Table.from_header(path, delimiter, rows)
    records = []
    for first, text, row in rows:
        if isinstance(row, list) and not any(field.strip() for field in row):
            continue
        where = f"{path.name} line {first}"
        problem = table.problem(first, text, row)
        if problem is None:
            caption = Caption(row[table.caption], where, first)
            records.append(CaptionRecord(row[table.image], [caption], where, first))
        else:
            log.add("malformed_record", where, f"{path} line {first}: {problem}",
                    where=where, order=first)
            lines.read_again_after_first()  # a row over several lines is an unclosed quote
    return records


def _read_coco(path: Path, log: ProblemLog) -> list[CaptionRecord]:
    try:
        data = parse_json(_read_text(path))
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


def _gather(records: Iterable[CaptionRecord], log: ProblemLog, *, merge: bool
            ) -> list[CaptionRecord]:
    """Normalize the paths; with ``merge``, join the captions of records of the same image,
    else report every later record of an image as a duplicate entry."""
    kept: dict[str, CaptionRecord] = {}
    for record in records:
        image = normalize_image_path(record.image)
        if image is None:
            log.add("invalid_path", record.where, f"{record.where}: image path {record.image!r} "
                    "must be a non-empty path relative to the image folder, without '..'",
                    where=record.where, order=record.order)
        elif image not in kept:
            record.image = image
            kept[image] = record
        elif merge:
            kept[image].captions.extend(record.captions)
        else:
            log.add("duplicate_entry", image, f"{image}: listed again at {record.where} (first "
                    f"at {kept[image].where})", where=record.where, order=record.order,
                    skipping="the later entry is skipped")
    return list(kept.values())


# --- checks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """A usable image: ``sentences`` holds ``(raw, tokens)`` per caption, in input order;
    ``where`` and ``order`` are its record's."""

    image: str
    sentences: tuple[tuple[str, tuple[str, ...]], ...]
    where: str
    order: int
    cocoid: int | None = None


def tokenized_items(records: Iterable[CaptionRecord], log: ProblemLog) -> list[Item]:
    """Tokenize every caption (see :func:`_sentences`); images left without captions are
    reported as ``no_captions``."""
    items = []
    for record in records:
        sentences = _sentences(record, log)
        if sentences:
            items.append(Item(record.image, tuple(sentences), record.where, record.order,
                              record.cocoid))
        else:
            log.add("no_captions", record.image,
                    f"{record.image} ({record.where}) has no non-empty caption",
                    where=record.where, order=record.order)
    return items


def _sentences(record: CaptionRecord, log: ProblemLog) -> list[tuple[str, tuple[str, ...]]]:
    """``(raw, tokens)`` of the captions of ``record``. A caption without words is reported as
    ``empty_caption``, one with the tokens of an earlier caption of the image as
    ``duplicate_caption`` (the first is kept: a caption listed twice would weigh twice in
    training and in the references of the scores); both are left out."""
    sentences = []
    first_with: dict[tuple[str, ...], Caption] = {}
    for number, caption in enumerate(record.captions, start=1):
        tokens = tuple(tokenize(caption.text))
        if not tokens:
            log.add("empty_caption", f"{record.image} caption {number}",
                    f"{record.image}: {caption.where} has no words: {caption.text!r}",
                    where=caption.where, order=caption.order)
        elif tokens in first_with:
            earlier = first_with[tokens]
            log.add("duplicate_caption", caption.where,
                    f"{record.image}: {caption.where} {caption.text!r} repeats {earlier.where} "
                    f"{earlier.text!r} (tokens: {' '.join(tokens)})", where=caption.where,
                    order=caption.order, skipping="the later one is skipped")
        else:
            first_with[tokens] = caption
            sentences.append((caption.text.strip(), tokens))
    return sentences


def _probe(path: Path) -> tuple[str, str] | None:
    """None when ``path`` is a usable image, else ``(reason, message)``."""
    if not path.exists():
        twin = _normalization_twin(path)
        return "missing_image", f"{path}: file not found" + (
            f"; the folder holds {twin!r}, the same name in another Unicode normalization "
            "(as macOS writes names): rename the file or the captions file's entry"
            if twin else "")
    try:
        # A full decode, as training does: truncated JPEGs pass a header check.
        load_image(path)
    except ImageLoadError as exc:
        return "unreadable_image", str(exc)
    return None


def _normalization_twin(path: Path) -> str | None:
    """The name of a file beside ``path`` that differs from its name only in Unicode
    normalization (NFC / NFD), if any."""
    if path.name.isascii() or not path.parent.is_dir():
        return None
    wanted = unicodedata.normalize("NFC", path.name)
    return next((entry for entry in os.listdir(path.parent)
                 if unicodedata.normalize("NFC", entry) == wanted), None)


def readable_items(items: list[Item], image_root: Path, log: ProblemLog, *,
                   progress: bool = False) -> list[Item]:
    """The items whose image file exists and decodes (:func:`data_prep.images.load_image`,
    which also refuses images over ``MAX_IMAGE_PIXELS``); the others are reported as
    ``missing_image`` or ``unreadable_image``. Files are decoded on a few threads (Pillow
    releases the GIL while decoding)."""
    from tqdm.auto import tqdm

    good = []
    pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    try:
        results = pool.map(_probe, [image_root / item.image for item in items])
        with tqdm(total=len(items), desc="checking images", unit="img",
                  disable=not progress) as bar:
            for item, result in zip(items, results, strict=True):
                bar.update()
                if result is None:
                    good.append(item)
                else:
                    reason, message = result
                    log.add(reason, item.image, f"{message} (listed at {item.where})",
                            where=item.where, order=item.order)
                    log.stop_if_failing()
    finally:
        # At the first failure with on_error="fail", images not yet started are not decoded.
        pool.shutdown(wait=True, cancel_futures=True)
    return good


def uncaptioned_images(image_root: Path, listed: set[str]) -> list[str]:
    """Image files (by :data:`data_prep.images.IMAGE_SUFFIXES`) under ``image_root`` whose
    relative path is not in ``listed``, sorted."""
    found = (path for path in image_root.rglob("*")
             if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file())
    return sorted(
        name for name in (path.relative_to(image_root).as_posix() for path in found)
        if name not in listed
    )


# --- splits ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitSpec:
    """How images are split: ``fractions`` (three exact fractions summing to 1), ``counts``
    (three image counts) or ``lists`` (image path -> split, from a split file)."""

    fractions: tuple[Fraction, ...] | None = None
    counts: tuple[int, ...] | None = None
    lists: dict[str, str] | None = None


def parse_split(text: str) -> SplitSpec:
    """Parse ``--split``: ``0.8,0.1,0.1`` (fractions: numbers with a decimal point, summing to
    exactly 1), ``800,100,100`` (image counts: integers) or the path of a JSON split file
    ``{"train": [paths], "val": [...], "test": [...]}`` (paths as in the captions file)."""
    if text.lower().endswith(".json") or Path(text).is_file():
        return SplitSpec(lists=_read_split_file(Path(text)))
    parts = [part.strip() for part in text.split(",")]
    usage = ("expected train,val,test fractions (0.8,0.1,0.1), counts (800,100,100) or a JSON "
             "split file")
    if len(parts) != 3:
        raise DatasetImportError(f"--split {text!r}: {usage}")
    if all(part.isdecimal() for part in parts):  # not isdigit: int() refuses '²'
        return SplitSpec(counts=tuple(int(part) for part in parts))
    try:
        fractions = tuple(Fraction(part) for part in parts)
    except (ValueError, ZeroDivisionError):
        raise DatasetImportError(f"--split {text!r}: {usage}") from None
    if any(f < 0 for f in fractions) or sum(fractions) != 1:
        raise DatasetImportError(
            f"--split {text!r}: fractions must be >= 0 and sum to 1, they sum to "
            f"{_decimal(sum(fractions))}"
        )
    return SplitSpec(fractions=fractions)


def _decimal(value: Fraction) -> str:
    """``value`` in decimal, to 30 significant digits: a sum of 1 + 1e-16 is not "1"."""
    quotient = decimal.Context(prec=30).divide(value.numerator, value.denominator)
    return f"{quotient.normalize():f}"


def _read_split_file(path: Path) -> dict[str, str]:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            data = parse_json(handle.read())
    except FileNotFoundError:
        raise DatasetImportError(f"--split {path}: split file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetImportError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or set(data) - set(SPLITS):
        keys = first_names(sorted(data)) if isinstance(data, dict) else type(data).__name__
        raise DatasetImportError(f"{path}: split file must be an object with keys among "
                                 f"{', '.join(SPLITS)}, got {keys}")
    split_of: dict[str, str] = {}
    for split, names in data.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DatasetImportError(f"{path}: field {split!r} must be a list of image paths")
        for name in names:
            image = normalize_image_path(name)
            if image is None:
                raise DatasetImportError(f"{path}: field {split!r}: invalid image path {name!r}")
            if image in split_of:
                raise DatasetImportError(f"{path}: image {image!r} is listed in {split_of[image]!r}"
                                         f" and again in {split!r}")
            split_of[image] = split
    return split_of


def split_sizes(n: int, fractions: tuple[Fraction, ...]) -> tuple[int, ...]:
    """Split ``n`` images by ``fractions`` (summing to 1): each split gets the floor of its
    share and the images left over go to the largest remainders, ties to the earlier split."""
    exact = [n * f for f in fractions]
    sizes = [int(share) for share in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: n - sum(sizes)]:
        sizes[i] += 1
    return tuple(sizes)


def assign_splits(items: list[Item], spec: SplitSpec, seed: int, log: ProblemLog, *,
                  listed: set[str]) -> tuple[dict[str, list[Item]], list[str]]:
    """Images per split (each split in path order) and the paths left out by ``counts``.

    Random splits cut the images in the order of :func:`_draw_order`, so the result depends
    only on the set of usable images and the seed, not on the order of the captions file, and
    an image added or removed moves at most a few others to another split. With a split
    file, usable images it does not list are reported as ``not_in_split_file``, and names it
    lists that no record of the captions file has (``listed`` holds every path the captions
    file named) as ``unknown_in_split_file``.
    """
    by_path = {item.image: item for item in items}
    if spec.lists is not None:
        chosen: dict[str, list[str]] = {split: [] for split in SPLITS}
        for image in sorted(by_path):
            if image in spec.lists:
                chosen[spec.lists[image]].append(image)
            else:
                item = by_path[image]
                log.add("not_in_split_file", image, f"{image} is in no list of the split file",
                        where=item.where, order=item.order)
        for image in sorted(set(spec.lists) - listed):
            log.add("unknown_in_split_file", image,
                    f"{image} ({spec.lists[image]}) is in the split file but not in the captions",
                    where=f"the split file's {spec.lists[image]!r} list", order=math.inf)
        log.stop_if_failing()
        return _items_by_split(chosen, by_path), []

    order = _draw_order(by_path, seed)
    if spec.counts is not None:
        sizes = spec.counts
        if sum(sizes) > len(order):
            skipped = _skipped_summary(log)
            raise DatasetImportError(
                f"--split {','.join(map(str, sizes))}: {sum(sizes)} images requested, "
                f"{len(order)} usable{'; ' + skipped if skipped else ''}"
            )
    else:
        sizes = split_sizes(len(order), spec.fractions)
    chosen, start = {}, 0
    for split, size in zip(SPLITS, sizes, strict=True):
        chosen[split] = sorted(order[start:start + size])
        start += size
    return _items_by_split(chosen, by_path), sorted(order[start:])


def _draw_order(paths: Iterable[str], seed: int) -> list[str]:
    """``paths`` in the order of the SHA-256 of seed and path: a random order that gives each
    image its place whatever the other images are. A shuffle of the whole list would deal
    most images anew when one is added or removed (a photo fixed and the file rebuilt), moving
    test images into training."""
    def place(path: str) -> bytes:
        return hashlib.sha256(f"{seed}\n{path}".encode("utf-8", "surrogateescape")).digest()

    return sorted(paths, key=place)


def _items_by_split(chosen: dict[str, list[str]], by_path: dict[str, Item]
                    ) -> dict[str, list[Item]]:
    return {split: [by_path[image] for image in sorted(names)] for split, names in chosen.items()}


# --- output ------------------------------------------------------------------------------------


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


# --- the whole import --------------------------------------------------------------------------


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


def _skipped_summary(log: ProblemLog) -> str:
    """What was skipped, by reason, with an example each: the likely cause of too few images
    (a wrong --images folder: every image missing), for a message after which no report comes."""
    return "; ".join(f"{len(found)} skipped as {REASONS[reason]}, e.g. {found[0].skipped}"
                     for reason, found in log.by_reason().items())


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
            skipped = _skipped_summary(log)
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
