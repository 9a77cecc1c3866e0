"""Run folders of ``captioner fit`` as ``captioner runs`` lists them: ``ROOT/NAME/version_N``
(or a version the fit named), the ``progress.json`` its last save wrote in ``checkpoints/``, the
attention its ``config.yaml`` names and whether a fit trains there now.

Plain files only, no torch or Lightning: listing runs starts at once. What trains in these
folders is :mod:`captioner.training.runs`.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from data_prep.locks import hold_exclusively, let_go
from data_prep.paths import path_problem
from data_prep.settings_files import read_settings

LAST_NAME = "last.ckpt"
PROGRESS_NAME = "progress.json"
_VERSION_DIR = re.compile(r"^version_(\d+)$")


@dataclass(frozen=True)
class RunInfo:
    """One run folder and its ``progress.json`` (None before the first checkpoint)."""

    name: str
    folder: Path  # ROOT/NAME/version_N, or ROOT/NAME/V of a version the fit named
    progress: dict | None


def version_number(folder: Path) -> int | None:
    """N when ``folder`` is named like a run version, ``version_N``; else None."""
    match = _VERSION_DIR.match(folder.name)
    return int(match.group(1)) if match else None


def version_folders(root: Path, name: str) -> list[tuple[int, Path]]:
    """``(N, ROOT/NAME/version_N)`` of every version of run NAME, by N."""
    folder = root / name
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        version = version_number(child)
        if version is not None and child.is_dir():
            found.append((version, child))
    return sorted(found)


def training_now(folder: Path) -> bool | None:
    """Whether a fit holds the run ``folder`` (:class:`RunLock`) now; None where the file
    system cannot lock a folder (NFS)."""
    try:
        fd = hold_exclusively(folder)
    except OSError:
        return None
    if fd is None:
        return True
    let_go(fd)
    return False


def recorded_checkpoint(checkpoints: Path, recorded: str | None) -> Path | None:
    """The checkpoint that the progress.json in ``checkpoints`` records as ``recorded`` (an
    absolute path), where it is now: in ``checkpoints`` when it was written in a folder laid
    out as that one (``VERSION/checkpoints/FILE``; a runs folder moved or copied keeps its
    checkpoints there, and the recorded path names the first place, or the original's file),
    whether the file is there or not; else the recorded path (``--checkpoint.dirpath``);
    None when none is recorded."""
    if not recorded:
        return None
    recorded = Path(recorded)
    here = checkpoints / recorded.name
    if here.is_file() or recorded.parent.parts[-2:] == checkpoints.parts[-2:]:
        return here
    return recorded


# The fields of progress.json (write_progress) and the types each may have; max_epochs may be
# missing too (files of earlier versions).
_OPTIONAL_FIELDS = {"max_epochs": (int, type(None))}
_PROGRESS_FIELDS = {
    "epochs_done": (int,), "global_step": (int,), "monitor": (str, type(None)),
    "best_score": (int, float, type(None)), "best_checkpoint": (str, type(None)),
    "last_checkpoint": (str,),
}


def read_progress(checkpoints: Path) -> dict:
    """The ``progress.json`` of a run's checkpoints folder ({} when absent or unreadable, or
    when a field is missing or of another type, or a checkpoint path no file can have: a
    damaged file is no run's progress), read within the limits of every settings file
    (:func:`data_prep.settings_files.read_settings`)."""
    try:
        progress = read_settings(checkpoints / PROGRESS_NAME)
    except (OSError, ValueError):
        return {}
    if not isinstance(progress, dict) or any(
        # A missing field reads as ``...`` (of no kind), a missing optional one as None.
        not isinstance(value := progress.get(field, None if field in _OPTIONAL_FIELDS else ...),
                       kinds) or isinstance(value, bool)
        for field, kinds in {**_PROGRESS_FIELDS, **_OPTIONAL_FIELDS}.items()
    ):
        return {}
    recorded = (progress[field] for field in ("best_checkpoint", "last_checkpoint"))
    if any(path is not None and path_problem(path) for path in recorded):
        return {}
    return progress


def tested_scores(folder: Path) -> str | None:
    """The scores of the last ``captioner test`` of the run version ``folder`` and the
    checkpoint they are of, as ``test of best-epoch02-cider0.8100.ckpt: CIDEr 0.8123 Bleu_4
    0.2345`` (``test:`` where its config.yaml names none): the last row of ``metrics.csv`` in
    the newest of ``test``, ``test_2``, ... (each test logs into a folder of its own beside the
    run, with the config.yaml that names its checkpoint). None when it was not tested or the
    file cannot be read; a run's files are untrusted, so a value that is not a finite number is
    left out."""
    tests = {1: folder / "test"}
    for path in folder.glob("test_*"):
        if match := re.fullmatch(r"test_(\d+)", path.name):
            tests[int(match.group(1))] = path
    logged = [tests[n] / "metrics.csv" for n in sorted(tests)
              if (tests[n] / "metrics.csv").is_file()]
    if not logged:
        return None
    try:
        with logged[-1].open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    scores = []
    for key, value in (rows[-1] if rows else {}).items():
        if not (isinstance(key, str) and key.startswith("test/")):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            scores.append(f"{key.removeprefix('test/')} {number:.4f}")
    if not scores:
        return None
    scores.sort(key=lambda score: not score.startswith("CIDEr "))
    checkpoint = scored_checkpoint(logged[-1].parent)
    scored = f" of {PurePath(checkpoint).name}" if checkpoint else ""
    return f"test{scored}: {' '.join(scores)}"


def scored_checkpoint(folder: Path) -> str | None:
    """The checkpoint that the validate or test logged in ``folder`` scored, as its
    ``config.yaml`` names it (``ckpt_path``; a fit's is null); None where it names none or the
    file cannot be read."""
    try:
        config = read_settings(folder / "config.yaml")
    except (OSError, ValueError):
        return None
    ckpt_path = config.get("ckpt_path") if isinstance(config, dict) else None
    return ckpt_path if isinstance(ckpt_path, str) and ckpt_path else None


def evaluation_only(folder: Path) -> tuple[str, str] | None:
    """("test" or "validate", the checkpoint) when the version ``folder`` holds only the scores
    of a checkpoint from outside the runs (``captioner test`` of such a checkpoint logs into a
    new version of its config's name): no checkpoints, a ``config.yaml`` that names a
    ``ckpt_path`` (a fit's is null) and a ``metrics.csv`` without training columns
    (``train/...``); None for a training run, also one that has not saved a checkpoint yet."""
    if (folder / "checkpoints").exists():
        return None
    checkpoint = scored_checkpoint(folder)
    if checkpoint is None:
        return None
    try:
        with (folder / "metrics.csv").open(newline="", encoding="utf-8") as handle:
            columns = next(csv.reader(handle), [])
    except (OSError, ValueError, csv.Error):
        return None
    if any(column.startswith("train/") for column in columns):
        return None
    for prefix, stage in (("test/", "test"), ("val/", "validate")):
        if any(column.startswith(prefix) for column in columns):
            return stage, checkpoint
    return None


def run_attention(folder: Path) -> str:
    """The attention a run trained with, from its ``config.yaml``: ``INPUT/OUTPUT`` mapping,
    the output's keywords after it (``softmax/tvmax lam=0.01``), so that runs of one config
    name with other mappings (``--model.output_attention``) are told apart; ``?`` where the
    file is missing, unreadable or says no mapping. Read as data within the limits of every
    settings file (:func:`data_prep.settings_files.read_settings`): a run's files are untrusted."""
    try:
        config = read_settings(folder / "config.yaml")
    except (OSError, ValueError):
        return "?"
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return "?"
    mappings = [model.get("input_attention"), model.get("output_attention")]
    if not all(isinstance(name, str) and name for name in mappings):
        return "?"
    kwargs = model.get("output_attention_kwargs")
    keywords = ([f"{key}={value}" for key, value in kwargs.items()]
                if isinstance(kwargs, dict) else [])
    return " ".join(["/".join(mappings), *keywords])


def list_runs(root: Path) -> list[RunInfo]:
    """Every run under ``root``, by name: ``ROOT/NAME/version_N`` by N, then the versions a fit
    named (``--trainer.logger.init_args.version V``: ``ROOT/NAME/V``) that hold checkpoints, by
    V (not a test's ``version_N/test/`` when ``root`` is a run's folder)."""
    runs = []
    if not root.is_dir():
        return runs
    for named in sorted(p for p in root.iterdir() if p.is_dir()):
        folders = [folder for _, folder in version_folders(root, named.name)]
        folders += sorted((p for p in named.iterdir() if p.is_dir() and version_number(p) is None
                           and (p / "checkpoints").is_dir()), key=_natural_order)
        for folder in folders:
            progress = read_progress(folder / "checkpoints") or None
            runs.append(RunInfo(named.name, folder, progress))
    return runs


def _natural_order(path: Path) -> list[tuple[int, int | str]]:
    """A sort key that orders the numbers in a name by value: V2 before V10."""
    return [(0, int(part)) if part.isdecimal() else (1, part)
            for part in re.split(r"(\d+)", path.name) if part]
