"""Caption sanitization before the coco-caption Java tools.

pycocoevalcap hands captions to Java line by line: its PTB tokenizer writes one caption per
line and maps output line *i* back to caption *i*, and its METEOR wrapper speaks a
line-based protocol over stdin/stdout. A line break inside a caption therefore shifts every
later caption onto the wrong image (tokenizer) or desynchronises the protocol so that the
process waits forever for a line that never comes (METEOR). Java and the PTB lexer treat
more characters than ``\\n`` as line ends (``\\r``, vertical tab, form feed, the file/group/
record separators ``\\x1c``-``\\x1e``, NEL ``\\x85``, ``\\u2028``, ``\\u2029``), so every control
character and Unicode line/paragraph separator becomes a plain space. ``|||`` is METEOR's field
separator; pycocoevalcap strips it from hypotheses only, so it is removed from every caption.
"""

from __future__ import annotations

from data_prep.text import LINE_BREAKING


def sanitize_caption(caption: str) -> str:
    """Return ``caption`` on one line: control characters and line separators become
    spaces, runs of whitespace collapse to one space, and the ends are stripped.
    Raises TypeError for a non-string."""
    if not isinstance(caption, str):
        raise TypeError(f"a caption must be a str, got {type(caption).__name__}: {caption!r}")
    return " ".join(LINE_BREAKING.sub(" ", caption).split())
