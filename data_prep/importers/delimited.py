"""CSV and TSV captions files: a header line naming the columns ``image`` and ``caption``
(other columns are ignored), then one caption per line; an image has as many lines as captions.
CSV fields follow the usual quoting (Flickr8k's ``captions.txt``: captions holding commas are
quoted); TSV fields are taken literally, without quoting.

A CSV quote left open (``a.jpg,"A dog``) makes the csv module read on over the line ends, up to
the next quote or the end of the file, and so would swallow the captions of the lines after it.
A record read over several lines is therefore kept only when it is well formed (a quoted
caption holding a line break); otherwise its first line is reported as an unclosed quote and
the lines after it are read again as records of their own."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from data_prep.images import IMAGE_SUFFIXES
from data_prep.importers.captions_text import SHOWN_CHARS, text_lines
from data_prep.importers.records import Caption, CaptionRecord, DatasetImportError, ProblemLog
from data_prep.wording import shown


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


def read_delimited(path: Path, delimiter: str, log: ProblemLog) -> list[CaptionRecord]:
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    lines = _Lines(text_lines(path))
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
