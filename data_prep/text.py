"""Text read from files that someone else wrote, made safe for a terminal.

A checkpoint's vocabulary, a caption file or a rating's rater name reaches the terminal as the
file gives it. Control characters (C0, DEL, C1: escape sequences that clear the screen, set the
window title, move the cursor or hide text), the Unicode line and paragraph separators and the
format characters (a right-to-left override, a zero-width space) would act on the terminal
instead of being shown: :func:`printable` writes them as escapes, and :func:`unsafe_character`
finds the first one, for readers that refuse such text outright.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

# C0 and C1 control characters (tab, line feed, escape, ..., NEL) and the Unicode
# line/paragraph separators: none of them belongs inside a word or a name shown on one line.
LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _unsafe(char: str) -> bool:
    # Format characters (category Cf) hold the bidi overrides and isolates (U+202A-U+202E,
    # U+2066-U+2069), which reorder what a terminal shows after them.
    return bool(LINE_BREAKING.match(char)) or unicodedata.category(char) == "Cf"


def unsafe_character(text: str) -> str | None:
    """The first control character, line separator or format character of ``text`` (C0, DEL,
    C1, U+2028/U+2029, bidi overrides and other Unicode category Cf), or None."""
    return next((char for char in text if _unsafe(char)), None)


def printable(text: str) -> str:
    """``text`` with its backslashes, control characters, line separators and format
    characters (a right-to-left override, a zero-width space) written as Python escapes
    (``\\\\``, ``\\x1b``, ``\\u202e``), for a terminal: a name read from a file that someone
    else wrote cannot clear the screen, forge a line or reorder it, and reads back
    unambiguously."""
    return "".join(char.encode("unicode_escape").decode() if char == "\\" or _unsafe(char)
                   else char for char in text)


def check_utf8_names(paths: Iterable[Path], output: str) -> None:
    """Refuse, before any work, a file of ``paths`` whose name is not UTF-8: Python holds its
    bytes as surrogate escapes, which the UTF-8 text of ``output`` ("a JSON file") cannot
    hold (it would fail once the work is done).

    Raises:
        ValueError: naming the first such file, its bytes that are not UTF-8 as ``\\xNN``.
    """
    for path in paths:
        name = str(path)
        if any("\udc80" <= char <= "\udcff" for char in name):
            shown = os.fsencode(printable(name)).decode("utf-8", "backslashreplace")
            raise ValueError(f"{shown}: the file name is not UTF-8 text, which "
                             f"{output} cannot hold; rename the file")
