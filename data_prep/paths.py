"""Paths checked before work starts: an input that is no regular file (a FIFO would block
the reader) is refused by name, an output that cannot be written is refused before hours of
captioning or encoding are spent on it, and the same file given twice is found by what it leads
to, not by its spelling."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

# Folders of the kernel's pseudo-filesystems: os.access says root may write there, but no file
# can be created in them.
_KERNEL_FOLDERS = ("/proc", "/sys")


class OutputPathError(ValueError):
    """An output path that cannot be written (its message names the path and the reason)."""


def check_output_file(path: str | Path, reads: Iterable[tuple[str, str | Path]] = (), *,
                      overwrite: bool = True) -> Path:
    """Check that ``path`` can be written as a file (its folder may not exist yet), and that
    writing it would not replace one of the files the command reads.

    Args:
        path: the output file.
        reads: (what, path) of the command's input files, e.g. ``("key file", key)``: an
            output that is one of them (by any spelling or link) would destroy it.
        overwrite: whether an existing file may be replaced (a command's ``--overwrite``).

    Raises:
        OutputPathError: ``path`` is a folder or another non-regular file, one of ``reads``,
            an existing file and not ``overwrite``, or its nearest existing parent is not a
            writable folder.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder, expected a file name")
    target = file_to_replace(path)
    if target.is_file():
        identity = _identity(target)
        for what, read in reads:
            if _identity(read) == identity:
                raise OutputPathError(f"{path}: is the {what} this command reads; writing the "
                                      "output there would replace it")
        if not overwrite:
            raise OutputPathError(f"{path}: exists; choose another --out, or pass --overwrite "
                                  "to replace it")
    _check_writable_parent(target)
    return path


def _identity(path: str | Path) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``, or None where there is none."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return status.st_dev, status.st_ino


def file_to_replace(path: Path) -> Path:
    """The file that writing ``path`` replaces: ``path``, or the file that a symbolic link at
    ``path`` leads to (renaming over the link would make it a plain file).

    Raises:
        OutputPathError: it exists and is not a regular file (a folder, a device, a FIFO), or
            a link on the way goes through /proc, as /dev/stdout does: a process's open file,
            which the rename would not reach and the link would be lost.
    """
    hop, hops = path, 0
    while hop.is_symlink() and hops < 40:  # the kernel's own limit on links in a row
        if Path(os.path.realpath(hop.parent)).is_relative_to("/proc"):
            raise OutputPathError(f"{path}: leads to a process's open file ({hop}), not a "
                                  "regular file")
        hop = hop.parent / os.readlink(hop)  # a relative target is relative to its folder
        hops += 1
    target = Path(os.path.realpath(path)) if hops else path
    if target.exists() and not target.is_file():
        raise OutputPathError(f"{path}: exists and is not a regular file")
    return target


def check_output_dir(path: str | Path) -> Path:
    """Check that ``path`` is, or can be created as, a writable folder.

    Raises:
        OutputPathError: ``path`` exists and is not a folder, or is not writable.
    """
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise OutputPathError(f"{path}: exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputPathError(f"{path}: folder is not writable")
        return path
    _check_writable_parent(path)
    return path


def _check_writable_parent(path: Path) -> None:
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{path}: cannot write to it: {parent} is not a folder")
    if any(Path(os.path.realpath(parent)).is_relative_to(root) for root in _KERNEL_FOLDERS):
        raise OutputPathError(f"{path}: cannot write to the folder {parent}: it belongs to the "
                              "kernel's pseudo-filesystems")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: cannot write to the folder {parent}: it is not writable")


def path_problem(text: str) -> str | None:
    """Why the path ``text`` (read from a file) cannot name a file on this system, or None:
    longer than the system's limit on a path, or a component longer than that on a name
    (every system call on it would fail with "File name too long")."""
    encoded = os.fsencode(text)
    if len(encoded) >= os.pathconf("/", "PC_PATH_MAX"):
        return f"a path of {len(encoded):,} bytes, longer than the system's limit"
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > os.pathconf("/", "PC_NAME_MAX"):
        return f"a file name of {longest:,} bytes in it, longer than the system's limit"
    return None


def check_input_file(path: str | Path) -> Path:
    """Refuse a FIFO, device or socket by name before anything opens it (opening a FIFO for
    reading blocks until a writer appears). Missing paths and regular files pass through.

    Raises:
        ValueError: ``path`` exists and is not a regular file or a folder.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        return path  # missing or a broken link: the reader reports it by name
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise ValueError(f"{path}: is {kind}, not a regular file")
    return path


def require_file(path: str | Path, what: str) -> Path:
    """``path``, an existing regular file; ``what`` names it in messages ("checkpoint").

    Raises:
        FileNotFoundError: no such file. ValueError: a folder, FIFO, device or socket.
    """
    path = check_input_file(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder, not a file")
    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def refuse_repeated(paths: Sequence[Path], what: str) -> None:
    """ValueError naming the first ``what`` ("checkpoint", "image") that ``paths`` hold twice,
    compared as the files they lead to (``a.ckpt``, ``./a.ckpt``, a link to it and a folder's
    entry are one file): a command would caption it twice, write its figures twice into one
    folder, or show it twice to a rater."""
    seen: dict[str, Path] = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            also = "" if seen[real] == path else f" (also as {seen[real]})"
            raise ValueError(f"{what} {path} is given twice{also}; give each {what} once")
        seen[real] = path
