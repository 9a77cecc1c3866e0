"""Output folders that belong to one run: claimed under a lock, checked before any work,
filled through a hidden staging folder and moved into place only once the result is whole; files
that are no result's are never removed."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from data_prep.atomic import temporary_prefix
from data_prep.locks import held_alone
from data_prep.paths import OutputPathError, check_output_dir
from data_prep.stop_signals import stops_held
from data_prep.wording import first_names


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
    return real.with_name(f"{temporary_prefix(real.name)}lock")


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
