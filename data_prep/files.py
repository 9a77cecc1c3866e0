"""Output files: written atomically, with the user's permissions, checked before work starts.

Every file that a command writes goes through :func:`atomic_write`: the content is written to a
temporary file in the destination folder, flushed to disk, given the mode a plain ``open`` would
give it (``0o666`` less the umask: ``tempfile.mkstemp`` creates files readable by their owner
only, and ``os.replace`` would keep that), then renamed over the destination. An interrupted or
failed write leaves the previous file (or none), never a truncated one, and no temporary file.

:func:`check_output_file` and :func:`check_output_dir` run before a command starts its work, so
that hours of captioning or encoding are not lost to an output path that cannot be written.
:func:`check_input_file` refuses FIFOs, devices and sockets by name before anything opens them
(opening a FIFO for reading blocks until a writer appears). :func:`first_names` shortens the
list of files (or other items) that a one-line message names.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Any

# Folders of the kernel's pseudo-filesystems: os.access says root may write there, but no file
# can be created in them.
_KERNEL_FOLDERS = ("/proc", "/sys")


class OutputPathError(ValueError):
    """An output path that cannot be written (its message names the path and the reason)."""


# Descriptors of the files and folders this process holds (hold_exclusively).
_HELD: set[int] = set()


def _let_go_in_child() -> None:
    # A forked process (a loader worker) shares each lock until it closes its copy, and outlives
    # a killed parent by about a second: the rerun that follows would be refused.
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


def hold_exclusively(path: Path) -> int | None:
    """Take an exclusive ``flock`` on the folder or file ``path`` (a file is made if missing):
    returns its descriptor, for :func:`let_go`, or None when another process holds it. The
    kernel drops the lock when the process ends, also when it is killed; processes forked
    while it is held let go of their copy at once.

    Raises:
        OSError: the file system cannot lock ``path`` (it names ``path``): NFS emulates
            ``flock`` with byte-range locks, and refuses an exclusive one on a descriptor not
            open for writing, as a folder's always is (EBADF); some mounts lock nothing.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY if path.is_dir() else os.O_RDWR | os.O_CREAT
    fd = os.open(path, flags, file_mode())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        raise OSError(exc.errno, f"cannot be locked ({exc.strerror})", str(path)) from None
    _HELD.add(fd)
    return fd


def let_go(fd: int) -> None:
    """Release a hold of :func:`hold_exclusively` (in a forked process: nothing left to do)."""
    if fd in _HELD:
        _HELD.discard(fd)
        os.close(fd)


@contextmanager
def held_alone(lock: Path, busy: str) -> Iterator[None]:
    """Run the block holding the lock file ``lock`` (made, then removed at the end), so that
    no other process runs such a block on the same ``lock`` meanwhile.

    Raises:
        OutputPathError: ``busy``, when another process holds ``lock``.
    """
    while True:
        fd = hold_exclusively(lock)
        if fd is None:
            raise OutputPathError(busy)
        try:
            # A holder that removed the file after we opened it left us a lock that the next
            # process, which makes a new file, would not see: take the new file's.
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        let_go(fd)
    try:
        yield
    finally:
        try:
            lock.unlink(missing_ok=True)  # before letting go: the next holder makes a new file
        finally:
            let_go(fd)


@contextmanager
def made_folder(folder: Path) -> Iterator[Path]:
    """Make ``folder`` and its missing parents for the block; if the block fails, remove the
    ones it made that are still empty, deepest first (a failed command leaves no trace)."""
    made = [path for path in (folder, *folder.parents) if not path.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for path in made:
            if not path.is_dir() or any(path.iterdir()):
                break
            path.rmdir()
        raise


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
    refused (:class:`OutputPathError`), never replaced (:func:`_file_to_replace`).

    The writer holds a ``flock`` on its temporary file while it writes: the temporaries of
    ``path`` that nobody holds were left by a writer that was killed (kill -9, the OOM
    killer), and are removed before a new one is made (:func:`remove_stale_temporaries`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    path = _file_to_replace(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp_name = tempfile.mkstemp(prefix=_temporary_prefix(path.name), suffix=".tmp",
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


# The errors of a write that the disk, a quota or the file size limit (ulimit -f) stopped.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full(number: int, path: Path, written: int | None) -> OSError:
    """The error of a write of ``path`` that ``number`` (one of :data:`DISK_FULL`) stopped
    after ``written`` bytes, naming the folder and saying what was kept: one line."""
    reason = {errno.EFBIG: "the file size limit (ulimit -f) was reached",
              errno.EDQUOT: "the disk quota is used up"}.get(number, "no space left on device")
    so_far = "" if written is None else f" after {_megabytes(written)} of {path.name}"
    kept = (f"the previous {path.name} is kept" if path.exists()
            else f"{path.name} was not written")
    advice = ("raise the limit and run again" if number == errno.EFBIG
              else "free space there and run again")
    return OSError(number, f"{reason}{so_far}; {kept}; {advice}", str(path.parent))


def check_room(folder: Path, needed: int, largest_file: int, what: str) -> None:
    """Refuse, before a long write into ``folder``, one that cannot fit: ``needed`` more bytes
    than the file system has free there, or a file of ``largest_file`` bytes past the file size
    limit (``ulimit -f``). HDF5 does not survive a write that fails midway (h5py ends in a
    segmentation fault), so a cache must not start one. ``what`` names it in the message.

    Raises:
        OSError: ENOSPC or EFBIG, one line naming ``folder``, the size needed and the room.
    """
    import resource

    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OSError(errno.ENOSPC, f"{what} needs about {_megabytes(needed)} more, and "
                      f"{_megabytes(free)} are free; free space there and run again",
                      str(folder))
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and largest_file > limit:
        raise OSError(errno.EFBIG, f"{what} grows to about {_megabytes(largest_file)}, past "
                      f"the file size limit (ulimit -f) of {_megabytes(limit)}; raise the "
                      "limit and run again", str(folder))


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"


def _size(name: str) -> int | None:
    try:
        return os.stat(name).st_size
    except OSError:
        return None


# mkstemp's random part and the suffix of atomic_write's temporary files.
_RANDOM_AND_SUFFIX = r"[a-z0-9_]{8}\.tmp"


def _temporary_prefix(name: str) -> str:
    """``.NAME.`` for the temporary files of ``name``, NAME cut so that the whole temporary
    name (``.NAME.`` + 8 random characters + ``.tmp``) fits the system's limit on a file
    name: an output named near that limit would fail only once its work was done."""
    room = os.pathconf("/", "PC_NAME_MAX") - len(".") - len(".") - 8 - len(".tmp")
    encoded = os.fsencode(name)
    return f".{os.fsdecode(encoded[:room]) if len(encoded) > room else name}."


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of :func:`atomic_write` for ``path`` that no writer holds
    (one killed while writing left them, as large as the file); returns them."""
    prefix = _temporary_prefix(path.name)
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
    target = _file_to_replace(path)
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


def _file_to_replace(path: Path) -> Path:
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


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of the file's bytes, in hex (read 1 MiB at a time)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def check_integers(settings: Iterable[tuple[str, Any, int]],
                   error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first of ``settings`` (name, value, least) whose value is not
    an integer (a bool is none) of at least its least."""
    for name, value, low in settings:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise error(f"{name} must be an integer >= {low}, got {value!r}")


def agreeing(count: int, one: str, many: str) -> str:
    """The word that agrees with ``count`` things: ``one`` ("is", "has") for one, else
    ``many`` ("are", "have"), for the verb after :func:`counted`."""
    return one if count == 1 else many


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


def check_output_folder(folder: Path, what: str, marker: str, tag: str, overwrite: bool,
                        ours: Callable[[Path], Collection[str]]) -> bool:
    """Check, before any work, that ``folder`` can take a whole new result of a command that
    writes a folder (heatmaps, gallery, rating kit): it is new or empty, or, with
    ``overwrite``, holds an earlier result, recognised by the file ``marker`` containing
    ``tag``, and nothing else. Two runs' files in one folder would look like one result (stale
    images beside new ones, figures on two colour scales); files that are no result's are
    never removed: a folder of them, or an earlier result beside them, is refused.

    ``ours(folder)`` gives the paths, relative to ``folder`` and ``/``-separated, of the files
    and folders that its earlier result wrote (as its index or page lists them); the folders
    on the way to them are the result's too. Every other entry, at any depth, is not
    (:func:`foreign_entries`): a note left in a subfolder of the result is refused as one
    beside it is.

    Returns whether the folder holds an earlier result for :func:`clear_folder` to remove.

    Raises:
        OutputPathError: ``folder`` is unusable, holds an earlier result and ``overwrite`` is
            False, or holds files that are no earlier result's.
    """
    check_output_dir(folder)
    # A staging folder left by a killed run is nobody's result: result_folder removes it.
    entries = sorted(entry.name for entry in folder.iterdir()
                     if not entry.name.startswith(STAGING_PREFIX)) if folder.exists() else []
    if not entries:
        return False
    if not _holds(folder / marker, tag):
        raise OutputPathError(
            f"{folder}: folder is not empty ({first_names(entries, 3)}) and holds no {what} "
            "of an earlier run; choose a new or empty folder"
        )
    if not overwrite:
        raise OutputPathError(f"{folder}: holds the {what} of an earlier run ({folder / marker}); "
                              "choose a new or empty folder, or pass --overwrite to replace it")
    others = foreign_entries(folder, ours(folder))
    if others:
        raise OutputPathError(
            f"{folder}: holds the {what} of an earlier run and other files too "
            f"({first_names(others, 3)}), which --overwrite would delete; move them out or "
            "choose a new or empty folder"
        )
    return True


def refuse_inputs_in_output(folder: Path, inputs: Iterable[Path]) -> None:
    """Check, before any work, that the ``inputs`` of a command that writes the output
    ``folder`` (heatmaps, gallery, rating kit) lie outside it, and that it lies outside every
    input folder. The command fills the folder with images and --overwrite empties it first:
    an input inside would be read back as the command's own earlier figures, or deleted, and
    an output folder inside an input folder would feed its figures to the next run.

    ``inputs``: the image files read and the folders searched for them, as given (compared as
    the files they lead to: another spelling or a link is the same file).

    Raises:
        OutputPathError: naming the first input inside the folder, or the input folder that
            holds it.
    """
    out = Path(os.path.realpath(folder))
    for path in inputs:
        real = Path(os.path.realpath(path))
        if real.is_relative_to(out):
            raise OutputPathError(
                f"{path}: an input inside the output folder {folder}, which the command fills "
                "with its figures (and --overwrite empties first); choose an --out outside "
                "the inputs")
        if real.is_dir() and out.is_relative_to(real):
            raise OutputPathError(
                f"{folder}: the output folder lies inside the input folder {path}, so its "
                "figures would be read as input images by the next run; choose an --out "
                "outside the inputs")


# The hidden folder inside an output folder where --overwrite draws the new result, until it
# replaces the earlier one (:func:`result_folder`); one left by a killed run is nobody's file.
STAGING_PREFIX = ".partial-"


def foreign_entries(folder: Path, ours: Collection[str]) -> list[str]:
    """The entries under ``folder`` that are not in ``ours``, as ``/``-separated paths relative
    to ``folder``, sorted, at any depth: files (links, FIFOs and the like included) not in
    ``ours``, and folders that neither are in ``ours`` nor lead to an entry of it, each named
    once rather than by its content. Links are never followed.

    ``ours``: ``/``-separated paths relative to ``folder`` (``index.json``,
    ``tvmax/photo/00_a.png``, ``images``). A staging folder left by a killed run
    (:data:`STAGING_PREFIX`) is not counted: the next replacement removes it."""
    ours = set(ours)
    on_the_way = {str(parent) for name in ours for parent in PurePosixPath(name).parents}
    foreign: list[str] = []

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        for entry in entries:
            name = prefix + entry.name
            if name.startswith(STAGING_PREFIX):
                continue  # a killed run's unfinished result: the next replacement removes it
            is_folder = entry.is_dir(follow_symlinks=False)
            if is_folder and (name in ours or name in on_the_way):
                walk(Path(entry.path), name + "/")
            elif is_folder or name not in ours:
                foreign.append(name)

    walk(folder, "")
    return foreign


def _holds(path: Path, tag: str) -> bool:
    try:
        return path.is_file() and tag in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


# The signals that stop a command: Ctrl-C, and those that captioner.cli turns into Ctrl-C
# (`kill`, `timeout`, a closed terminal).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stops_held() -> Iterator[None]:
    """Hold the stop signals (Ctrl-C, SIGTERM, SIGHUP) that arrive inside the block and deliver
    them once it has ended: writes that must all happen or none (a result and its key, renames
    that replace an earlier result, torch.save's zip writer, which turns a KeyboardInterrupt
    into a RuntimeError) are not cut midway (kill -9 still can). Signal handlers belong to the
    main thread; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # A handler installed outside Python (getsignal gives None) cannot be put back: not held.
    held = [number for number in STOP_SIGNALS if signal.getsignal(number) is not None]
    previous = {number: signal.signal(number, lambda signum, frame: received.append(signum))
                for number in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)


@contextmanager
def result_folder(folder: Path, earlier: bool) -> Iterator[Path]:
    """The folder that a command writing a whole result (heatmaps, gallery, rating kit) fills,
    for ``folder``: new or empty, or holding an ``earlier`` result that --overwrite replaces
    (:func:`check_output_folder`). Hold the folder's claim (:func:`claimed_output`) around
    both, so that no other run writes there meanwhile.

    It yields a hidden staging folder inside ``folder`` (the same file system, also where
    ``folder`` is a link or a mount point), and only once the new result is whole are the
    earlier result's entries removed and the new ones moved in. An exception (Ctrl-C too)
    removes the staging folder and leaves ``folder`` as it was (made, if it was not there,
    and empty); a run killed outright leaves
    its staging folder, which no check counts as a result and the next run removes."""
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.glob(glob.escape(STAGING_PREFIX) + "*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=folder))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with stops_held():  # never half the earlier result and half the new one
        if earlier:
            clear_folder(folder, [entry.name for entry in folder.iterdir() if entry != staging])
        for entry in staging.iterdir():
            entry.rename(folder / entry.name)
        staging.rmdir()


def output_lock_path(path: Path) -> Path:
    """The lock file of the output ``path`` (a file or a folder) that the run writing it holds
    (:func:`claimed_output`): ``dir/.NAME.lock`` for ``dir/NAME``, beside what a symbolic link
    leads to (two runs reaching one output by two names hold one lock), cut to fit the
    system's limit on a name."""
    real = Path(os.path.realpath(path))
    return real.with_name(f"{_temporary_prefix(real.name)}lock")


@contextmanager
def claimed_output(path: Path, what: str, check: Callable[[], Any]) -> Iterator[Any]:
    """Claim the output ``path`` of a command (a folder it fills, a file it writes) for the
    block: ``check()`` (the command's check of its output, raising :class:`OutputPathError`)
    runs, then the output's lock is taken (:func:`output_lock_path`, removed at the end; the
    kernel drops it when a run is killed), then ``check()`` runs again, as the output now
    stands; yields what it returns. Two runs into one output would mix their files, or the
    second replace the first's; one killed would remove the other's.

    Raises:
        OutputPathError: from ``check()``, or, naming the lock, while another run holds it.
    """
    check()
    lock = output_lock_path(path)
    busy = (f"{path}: another run is writing its {what} there now (it holds {lock}); wait for "
            "it to end, or choose another --out")
    with made_folder(lock.parent), held_alone(lock, busy):
        yield check()


def clear_folder(folder: Path, names: Iterable[str] | None = None) -> None:
    """Remove everything inside ``folder`` (an earlier result that --overwrite replaces), or
    only its entries ``names``; not the folder itself, which may be a link or a mount point
    the user made; links inside are removed, never followed."""
    entries = folder.iterdir() if names is None else (folder / name for name in names)
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
