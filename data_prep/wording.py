"""English wording of one-line messages: counts with their nouns, the first few of a list,
values cut to a readable length; and the reading of a list of names as a user writes it
(``train,val``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def first_names(names: Sequence[object], limit: int = 10, separator: str = ", ") -> str:
    """The first ``limit`` of ``names`` (files, ids, problems; each as ``str`` gives it) joined
    by ``separator``, then how many are left out: ``a, b, c`` or ``a, b, c and 7 more``, as a
    one-line message lists them (``separator="; "`` where the names hold commas)."""
    shown = separator.join(str(name) for name in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one: "1 image", "2 images" (regular nouns)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a one-line message (a numpy value as its Python list or number),
    cut to ``limit`` characters, with its whole length, when longer."""
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars
    text = repr(tolist() if callable(tolist) else value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"


def agreeing(count: int, one: str, many: str) -> str:
    """The word that agrees with ``count`` things: ``one`` ("is", "has") for one, else
    ``many`` ("are", "have"), for the verb after :func:`counted`."""
    return one if count == 1 else many


def names(what: str, check: Callable[[str], None] | None = None
          ) -> Callable[[str], list[str]]:
    """A reader of a comma-separated list of at least one ``what`` ("split", "mapping"): it
    returns the names, each passed to ``check`` first, and raises ValueError naming the text
    that lists none, a name twice or an empty name (a stray comma), or ``check``'s own
    (an unknown name is refused before any other is used)."""

    def parse(text: str) -> list[str]:
        listed = [name.strip() for name in text.split(",")]
        if not any(listed):
            raise ValueError(f"{text!r} names no {what}")
        if not all(listed):  # a stray comma, or a name lost from the list
            raise ValueError(f"{text!r} holds an empty {what} name (a stray comma)")
        twice = [name for name in dict.fromkeys(listed) if listed.count(name) > 1]
        if twice:  # one row each would drop one silently
            raise ValueError(f"{text!r} names {what} {twice[0]!r} twice")
        for name in listed if check else ():
            check(name)
        return listed

    return parse
