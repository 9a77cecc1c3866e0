"""The text of a captions file: UTF-8 (with or without a byte-order mark) or UTF-16 with its
byte-order mark; anything else refused in one line naming the first byte that is not text and
how to convert the file."""

from __future__ import annotations

import codecs
import io
import shlex
from collections.abc import Iterator
from pathlib import Path

from data_prep.importers.records import DatasetImportError


def read_text(path: Path) -> str:
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


def text_lines(path: Path) -> Iterator[str]:
    """The lines of ``path`` with their line ends, split as by ``open(newline="")``."""
    return iter(io.StringIO(read_text(path), newline=""))


def first_line(path: Path, text: str) -> str:
    """The first line of ``text`` (the captions file ``path``'s) that is not blank."""
    for line in io.StringIO(text, newline=""):
        if line.strip():
            return line
    raise DatasetImportError(f"{path}: captions file is empty")
