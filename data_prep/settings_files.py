"""Settings files read as data, within limits that every reader shares (size, aliases,
nesting), and JSON parsed so that every text it cannot take raises ``json.JSONDecodeError``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from data_prep.paths import check_input_file
from data_prep.wording import shown


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``, where a text that cannot be parsed always raises
    ``json.JSONDecodeError``: json raises RecursionError for arrays or objects nested past
    Python's recursion limit, and a plain ValueError for an integer of more than 4,300 digits,
    which the readers of users' files, naming the file for a JSONDecodeError, would miss.
    So does a string escaping half of a UTF-16 surrogate pair (``"\\ud83d"``, an emoji cut in
    two), which json accepts but is no Unicode text: nothing could write it as UTF-8, and an
    object that gives one key twice, of which json would keep the last value without a word."""
    try:
        value = json.loads(text, object_pairs_hook=_without_repeated_keys)
    except json.JSONDecodeError:
        raise
    except _RepeatedKey as exc:
        raise json.JSONDecodeError(str(exc), "", 0) from None
    except RecursionError:
        raise json.JSONDecodeError("arrays or objects nested too deeply", "", 0) from None
    except ValueError as exc:  # the limit of int() on digit strings
        reason = str(exc).partition(":")[0] or "a value out of range"
        raise json.JSONDecodeError(f"an integer too long ({reason})", "", 0) from None
    escapes = (b"\\ud", b"\\uD") if isinstance(text, bytes) else ("\\ud", "\\uD")
    if any(escape in text for escape in escapes):  # only an escape makes a surrogate
        cut = _lone_surrogate(value)
        if cut is not None:
            source = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            half = next(char for char in cut if "\ud800" <= char <= "\udfff")
            at = max(source.lower().find(f"\\u{ord(half):04x}"), 0)  # where json reports
            raise json.JSONDecodeError(
                f"the string {shown(cut)} holds half of a UTF-16 surrogate pair, not text",
                source, at)
    return value


# Limits on a settings file that a command reads as data (a --config, a run folder's
# config.yaml and progress.json): the paper configs hold about 60 values, 3 levels deep and
# 2 KB. 400 bytes of nested YAML aliases expand to 10**8 values (all memory), and a file
# nested past Python's recursion limit fails inside the parser.
MOST_SETTINGS_BYTES = 1 << 20
MOST_SETTINGS_VALUES = 100_000
MOST_SETTINGS_DEPTH = 64


class SettingsFileError(ValueError):
    """A settings file that cannot be read as data (the message names it)."""


class SettingsLimitError(SettingsFileError):
    """A settings file past a limit that every reader shares (size, aliases, nesting)."""


def read_settings(path: str | Path, what: str = "settings file") -> Any:
    """The document of the YAML settings file ``path`` (JSON: a ``.json`` file, read as
    :func:`parse_json` reads it), read as data (``yaml.safe_load``: no tags that build
    objects), within the limits every reader shares:
    :data:`MOST_SETTINGS_BYTES` bytes, :data:`MOST_SETTINGS_VALUES` values with its aliases
    expanded, :data:`MOST_SETTINGS_DEPTH` levels of nesting. ``what`` names such a file in
    the messages ("config").

    Raises:
        SettingsLimitError: past a limit (one line naming ``path``).
        SettingsFileError: not UTF-8 or not YAML (one line naming ``path``).
        OSError: the file cannot be read.
    """
    import yaml

    path = Path(path)
    check_input_file(path)
    too_deep = SettingsLimitError(f"{path}: nested more than {MOST_SETTINGS_DEPTH} levels "
                                  f"deep; a {what} holds settings")
    with path.open("rb") as handle:
        data = handle.read(MOST_SETTINGS_BYTES + 1)
    if len(data) > MOST_SETTINGS_BYTES:
        raise SettingsLimitError(f"{path}: larger than {MOST_SETTINGS_BYTES:,} bytes; a {what} "
                                 "holds settings")
    try:
        text = data.decode("utf-8")
        document = parse_json(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        if "nested too deeply" in exc.msg:
            raise too_deep from None
        raise SettingsFileError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise SettingsFileError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise too_deep from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
        reason = getattr(exc, "problem", None) or type(exc).__name__
        raise SettingsFileError(f"{path}: not valid YAML ({reason}{where})") from None
    values, depth = _expanded_size(document)
    if values > MOST_SETTINGS_VALUES:
        raise SettingsLimitError(f"{path}: its YAML aliases expand to more than "
                                 f"{MOST_SETTINGS_VALUES:,} values; a {what} holds settings")
    if depth > MOST_SETTINGS_DEPTH:
        raise too_deep
    return document


def _expanded_size(document: Any) -> tuple[float, int]:
    """How many values ``document`` holds with every alias expanded (a list or dict that
    occurs in several places counts each time; one inside itself is endless), and how deeply
    its lists and dicts nest, without recursion (a recursive walk would fail on what it should
    measure); once the walk passes :data:`MOST_SETTINGS_DEPTH` it stops and gives 0 values."""
    if not isinstance(document, dict | list):
        return 1, 0
    sizes: dict[int, float] = {}
    heights: dict[int, int] = {}
    # (node, its depth, whether its children are counted): each list or dict is met twice.
    stack: list[tuple[Any, int, bool]] = [(document, 1, False)]
    while stack:
        node, depth, counted_children = stack.pop()
        children = list(node.values()) if isinstance(node, dict) else node
        containers = [child for child in children if isinstance(child, dict | list)]
        if counted_children:
            sizes[id(node)] = 1 + len(children) - len(containers) + sum(
                sizes[id(child)] for child in containers)
            heights[id(node)] = 1 + max((heights[id(child)] for child in containers), default=0)
        elif id(node) not in sizes:
            if depth > MOST_SETTINGS_DEPTH:
                return 0, depth  # too deep to measure on
            sizes[id(node)] = math.inf  # until counted: an alias inside itself is endless
            heights[id(node)] = MOST_SETTINGS_DEPTH + 1
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in containers)
    return sizes[id(document)], heights[id(document)]


class _RepeatedKey(ValueError):
    """An object of a JSON text gives a key twice."""


def _without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        key = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _RepeatedKey(f"an object gives the key {shown(key)} twice")
    return document


def _lone_surrogate(value: Any) -> str | None:
    """The first string in ``value`` (parsed JSON: keys too) holding a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= char <= "\udfff" for char in item):
                return item
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def check_options_at_least(options: Iterable[tuple[str, int | None, int]]) -> None:
    """ValueError ``--NAME must be >= LEAST, got VALUE`` for the first of the command-line
    ``options`` (name, value, least) whose value is below its least; None (not given)
    passes."""
    for name, value, least in options:
        if value is not None and value < least:
            raise ValueError(f"--{name} must be >= {least}, got {value}")


def check_integers(settings: Iterable[tuple[str, Any, int]],
                   error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first of ``settings`` (name, value, least) whose value is not
    an integer (a bool is none) of at least its least."""
    for name, value, low in settings:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise error(f"{name} must be an integer >= {low}, got {value!r}")
