"""Output files written atomically, with the user's permissions.

Every file that a command writes goes through :func:`atomic_write`: the content is written to a
temporary file in the destination folder, flushed to disk, given the mode a plain ``open`` would
give it (``0o666`` less the umask: ``tempfile.mkstemp`` creates files readable by their owner
only, and ``os.replace`` would keep that), then renamed over the destination. An interrupted or
failed write leaves the previous file (or none), never a truncated one, and no temporary file.
"""

from __future__ import annotations

import fcntl
import glob
import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from data_prep.disk_space import DISK_FULL, disk_full
from data_prep.paths import file_to_replace


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0o666`` less the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_json(path: str | Path, document: Any, *, indent: int = 1) -> None:
    """Write ``document`` to ``path`` as strict JSON (:func:`atomic_write`), non-finite floats
    (an undefined metric's NaN) as ``null``: Python's own ``NaN`` is not JSON, and strict
    readers (JavaScript's JSON.parse, jq before 1.7) refuse the whole file."""
    text = json.dumps(_finite_or_none(document), indent=indent, ensure_ascii=False,
                      allow_nan=False)
    with atomic_write(path) as handle:
        handle.write(text + "\n")


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(item) for item in value]
    return value


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing (``mode`` "w" text UTF-8, or "wb");
    on a clean exit it is fsynced, given :func:`file_mode` and renamed over ``path``; on an
    exception it is removed and ``path`` is left as it was. A symbolic link stays a link: the
    file it leads to is replaced. A folder, device or other non-regular file at ``path`` is
    refused (:class:`~data_prep.paths.OutputPathError`), never replaced
    (:func:`~data_prep.paths.file_to_replace`).

    The writer holds a ``flock`` on its temporary file while it writes: the temporaries of
    ``path`` that nobody holds were left by a writer that was killed (kill -9, the OOM
    killer), and are removed before a new one is made (:func:`remove_stale_temporaries`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    path = file_to_replace(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp_name = tempfile.mkstemp(prefix=temporary_prefix(path.name), suffix=".tmp",
                                    dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else holds it
        os.fchmod(fd, file_mode())
        # A file name of bytes that are not UTF-8 (surrogate escapes) is written as its bytes.
        text = {"encoding": "utf-8", "errors": "surrogateescape"} if mode == "w" else {}
        with os.fdopen(fd, mode, **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except OSError as exc:
        written = _size(tmp_name)
        Path(tmp_name).unlink(missing_ok=True)
        if exc.errno in DISK_FULL:
            raise disk_full(exc.errno, path, written) from None
        raise
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _size(name: str) -> int | None:
    try:
        return os.stat(name).st_size
    except OSError:
        return None


# mkstemp's random part and the suffix of atomic_write's temporary files.
_RANDOM_AND_SUFFIX = r"[a-z0-9_]{8}\.tmp"


def temporary_prefix(name: str) -> str:
    """``.NAME.`` for the temporary files of ``name``, NAME cut so that the whole temporary
    name (``.NAME.`` + 8 random characters + ``.tmp``) fits the system's limit on a file
    name: an output named near that limit would fail only once its work was done."""
    room = os.pathconf("/", "PC_NAME_MAX") - len(".") - len(".") - 8 - len(".tmp")
    encoded = os.fsencode(name)
    return f".{os.fsdecode(encoded[:room]) if len(encoded) > room else name}."


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of :func:`atomic_write` for ``path`` that no writer holds
    (one killed while writing left them, as large as the file); returns them."""
    prefix = temporary_prefix(path.name)
    pattern = re.compile(re.escape(prefix) + _RANDOM_AND_SUFFIX)
    removed = []
    for candidate in path.parent.glob(glob.escape(prefix) + "*.tmp"):
        if not pattern.fullmatch(candidate.name) or candidate.is_symlink():
            continue
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a writer at work
        else:
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
        finally:
            os.close(fd)
    return removed


# The names of atomic_write's temporary files: ".NAME." + mkstemp's 8 random characters + ".tmp".
_TEMPORARY_NAME = re.compile(r"\..+\." + _RANDOM_AND_SUFFIX)


def atomic_temporaries(folder: Path) -> list[Path]:
    """The temporary files of :func:`atomic_write` in ``folder``, which a process killed while
    writing leaves behind: regular files named as it names them, sorted."""
    return sorted(path for path in Path(folder).glob(".*.tmp")
                  if _TEMPORARY_NAME.fullmatch(path.name) and path.is_file()
                  and not path.is_symlink())
