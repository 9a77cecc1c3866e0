"""Run folders of ``captioner fit`` and the state that makes a resume exact.

A run lives in ``ROOT/NAME/version_N/`` (:mod:`captioner.training.folders`): the CSV logger's
files and ``checkpoints/`` with the best checkpoint(s) (:class:`BestCheckpoint`), ``last.ckpt``
with every process's random number generators (:class:`LastCheckpoint`) and ``progress.json``.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import random
import shutil
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only

from captioner.checkpointing import (
    CheckpointError,
    load_safely,
    nonfinite_weights,
    save_atomically,
)
from captioner.training.folders import (
    LAST_NAME,
    PROGRESS_NAME,
    read_progress,
    recorded_checkpoint,
    version_folders,
)
from data_prep.atomic import atomic_temporaries, atomic_write
from data_prep.locks import hold_exclusively, let_go
from data_prep.wording import first_names

# RunLock tries a held run this many times, so long apart, before it tells of another fit.
_LOCK_TRIES, _LOCK_WAIT_S = 10, 0.05


# What Lightning reads from a checkpoint it restores: always, and to resume a fit.
_LIGHTNING_KEYS = ("pytorch-lightning_version", "state_dict", "epoch", "global_step")
_RESUME_KEYS = ("loops", "optimizer_states", "lr_schedulers")


def restore_problem(checkpoint: Mapping[str, Any], *, resume: bool) -> str | None:
    """Why Lightning cannot restore ``checkpoint`` (for ``fit`` to resume when ``resume``),
    in one line, or None: an entry it reads is missing or malformed (it would fail with a
    KeyError, or resume with a fresh optimizer or from epoch 0), or weights are not finite."""
    missing = [key for key in _LIGHTNING_KEYS + (_RESUME_KEYS if resume else ())
               if key not in checkpoint]
    if missing == ["optimizer_states"]:
        return ("it holds the model without the optimizer's state, as a best checkpoint does; "
                f"a fit goes on from its run's {LAST_NAME} (--ckpt_path last)")
    if missing:
        names = first_names([repr(key) for key in missing])
        return (f"no {names} {'entry' if len(missing) == 1 else 'entries'}; not "
                f"a checkpoint written by captioner fit")
    if resume:
        for key, what in (("optimizer_states", "optimizer"),
                          ("lr_schedulers", "learning-rate schedule")):
            value = checkpoint[key]
            if not (isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict)
                    and value[0]):
                return f"entry {key!r} does not hold the state of one {what}"
        if not isinstance(checkpoint["loops"], dict):
            return "entry 'loops' does not hold the training loops' progress"
    nonfinite = nonfinite_weights(checkpoint["state_dict"])
    if nonfinite:
        return f"its weights hold NaN or inf ({first_names(nonfinite, 3)})"
    return None



class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO plugin: atomic writes, the optimizer's state in ``last.ckpt``
    only (the one checkpoint a fit resumes from), ``weights_only=True`` reads, and removals
    held until :meth:`remove_now` (a best checkpoint that a better one supersedes goes once
    ``last.ckpt`` names the new one: :class:`BestCheckpoint`)."""

    def __init__(self) -> None:
        super().__init__()
        self.superseded: list[str] = []  # the checkpoints Lightning asked to remove

    def remove_checkpoint(self, path) -> None:
        self.superseded.append(str(path))

    def remove_now(self, path) -> None:
        super().remove_checkpoint(path)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        if Path(path).name != LAST_NAME:
            # Only last.ckpt resumes a fit; the best checkpoints, which a sweep keeps one or
            # more of per run, are two thirds smaller without Adam's two moments per weight.
            checkpoint = {key: value for key, value in checkpoint.items()
                          if key != "optimizer_states"}
        save_atomically(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None):
        if weights_only is False:
            raise ValueError(
                f"{type(self).__name__} only loads checkpoints with weights_only=True"
            )
        return load_safely(path, map_location="cpu" if map_location is None else map_location)


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint (``--checkpoint.*``: the best checkpoints), but a checkpoint
    it supersedes is removed only once :class:`LastCheckpoint`, which runs after it, has
    written ``last.ckpt`` and ``progress.json`` naming the new one (the checkpoint plugin,
    :class:`AtomicCheckpointIO`, holds the removals Lightning asks for
    until then): a run killed between the two writes resumes from a ``last.ckpt`` whose best
    checkpoint still exists, and ``captioner runs`` and ``--ckpt_path best`` name a file that
    exists.

    A resume from this folder's ``last.ckpt`` also removes the best checkpoints of the epochs
    it replays (:meth:`_of_replayed_epochs`). Its state key is ModelCheckpoint's, so that runs
    checkpointed by either resume alike."""

    _restored: tuple[str, ...] = ()  # superseded, as the last.ckpt resumed from says
    _io: AtomicCheckpointIO | None = None  # the trainer's checkpoint plugin, if it is ours

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__,
                                         ModelCheckpoint.__qualname__, 1)

    def state_dict(self) -> dict[str, Any]:
        # last.ckpt records what it supersedes: a run killed after writing it, before the
        # removal, removes them when it resumes (on_train_start).
        superseded = self._io.superseded if self._io is not None else []
        return {**super().state_dict(), "superseded": list(superseded)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        superseded = state_dict.get("superseded") or []
        self._restored = tuple(path for path in superseded if isinstance(path, str))
        # A run copied or moved: its best checkpoint is the one of that name in its own folder,
        # not the file the checkpoint names where it was written.
        here = Path(self.dirpath or ".") / Path(self.best_model_path or ".").name
        if self.dirpath and self.best_model_path and here.is_file():
            self.best_model_path = str(here)

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        io = trainer.strategy.checkpoint_io
        self._io = io if isinstance(io, AtomicCheckpointIO) else None

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        if self._io is not None:
            self._io.superseded += [*self._restored, *self._of_replayed_epochs(trainer)]
        self.remove_superseded(trainer)

    def _of_replayed_epochs(self, trainer: L.Trainer) -> list[str]:
        """The best checkpoints written after the ``last.ckpt`` of this folder that the fit
        resumes from (a run killed before the next last.ckpt named them): their epochs are done
        again, and on a GPU, whose kernels are not deterministic, may score otherwise and be
        saved under another name, leaving a best checkpoint that none is. Each is known by the
        state it holds: this callback's, naming it as the best, at a later step."""
        try:
            resumed_here = bool(trainer.ckpt_path and self.dirpath) and os.path.samefile(
                trainer.ckpt_path, Path(self.dirpath) / LAST_NAME)
        except OSError:  # no last.ckpt here, or a checkpoint that is not a local file
            resumed_here = False
        if not resumed_here:
            return []
        kept = {Path(path).name for path in (self.best_model_path, *self.best_k_models) if path}
        replayed = []
        for path in Path(self.dirpath).glob("*.ckpt"):
            if path.name == LAST_NAME or path.name in kept or not self._in_own_folder(path):
                continue
            try:
                checkpoint = load_safely(path)
            except (CheckpointError, OSError):
                continue  # not a checkpoint of this run's: left alone
            state = (checkpoint.get("callbacks") or {}).get(self.state_key)
            step = checkpoint.get("global_step")
            if (isinstance(state, dict) and isinstance(step, int) and step > trainer.global_step
                    and Path(str(state.get("best_model_path"))).name == path.name):
                replayed.append(str(path))
        return replayed

    def remove_superseded(self, trainer: L.Trainer) -> None:
        """Remove the checkpoints superseded since the last call (on the first process, where
        Lightning asks for them), but one written again since and the one the fit resumed
        from (Lightning's own rule). The paths come from a checkpoint when the fit resumed,
        so they are untrusted: only a ``.ckpt`` file right in this callback's folder is
        removed (Lightning's own check lets ``DIR/../../x`` and remote URLs pass)."""
        if self._io is None or not trainer.is_global_zero:
            return
        kept = {str(path) for path in (self.best_model_path, *self.best_k_models) if path}
        resumed = Path(trainer.ckpt_path).absolute() if trainer.ckpt_path else None
        for filepath in self._io.superseded:
            if (str(filepath) not in kept and self._in_own_folder(filepath)
                    and Path(filepath).absolute() != resumed):
                self._io.remove_now(filepath)
        self._io.superseded = []

    def _in_own_folder(self, filepath: str) -> bool:
        if self.dirpath is None or "://" in str(filepath):
            return False
        path = Path(filepath)
        return (path.suffix == ".ckpt" and not path.is_symlink()
                and os.path.realpath(path.parent) == os.path.realpath(self.dirpath))


class LastCheckpoint(Checkpoint):
    """``last.ckpt`` at the end of every training epoch, after its validation, and every
    ``every_n_train_steps`` steps, with the random number generators' states of every process:
    a run resumed from an end-of-epoch checkpoint draws the same shuffles and dropout masks as
    an uninterrupted run and ends with the same weights (a mid-epoch one continues at its
    step, with a new shuffle for the rest of that epoch).

    A :class:`~lightning.pytorch.callbacks.Checkpoint`, so that Lightning runs it after the
    callbacks that are not and, among checkpoint callbacks, in the order given: after the
    best-checkpoint ModelCheckpoint, whose updated state it then stores.

    Args:
        every_n_train_steps: also save every this many optimizer steps (0: only per epoch).
    """

    def __init__(self, every_n_train_steps: int = 0) -> None:
        if every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps must be >= 0, got {every_n_train_steps}")
        self.every_n_train_steps = every_n_train_steps
        self.path: Path | None = None
        self.epochs_done = 0  # the epochs finished at the last save
        self._saved_step: int | None = None  # the global step of the last save
        self._rank = 0
        self._states_by_rank: list[dict[str, Any]] = []

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        # Before a checkpoint is restored, so load_state_dict knows whose states to take.
        self._rank = trainer.global_rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = self.every_n_train_steps
        if n and trainer.global_step % n == 0 or _stops_inside_the_epoch(trainer):
            self._save(trainer, epoch_done=False)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # An epoch that --trainer.max_steps or max_time ended early was saved at its last batch,
        # as a checkpoint inside the epoch: saved here, Lightning counts its epoch as done,
        # and a resume skips its other batches.
        complete = _epoch_complete(trainer)
        if complete or self._saved_step != trainer.global_step:
            self._save(trainer, epoch_done=complete)

    def _save(self, trainer: L.Trainer, *, epoch_done: bool) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        best = _best_callback(trainer)
        beside_the_log = _log_dir(trainer)  # every rank: trainer.log_dir is a collective
        folder = Path(best.dirpath) if best is not None and best.dirpath else beside_the_log
        self.path = folder / LAST_NAME
        self._states_by_rank = _gather(_rng_states(), trainer.world_size)
        epochs = trainer.current_epoch + int(epoch_done)
        written_before = _file_identity(self.path)
        try:
            trainer.save_checkpoint(self.path, weights_only=False)  # full state
        except BaseException:
            # Under DDP the save ends at a barrier, which fails when another process is lost
            # after the first wrote the file (atomically: a new file is a whole one); the
            # progress, which the resume line and ``captioner runs`` read, must say so.
            if trainer.is_global_zero and _file_identity(self.path) != written_before:
                self._write_progress(trainer, folder, beside_the_log, epochs)
            raise
        self._saved_step = trainer.global_step
        self.epochs_done = epochs
        # Other checkpoints (the best ones) store no stale states: only "rng", current.
        self._states_by_rank = []
        if trainer.is_global_zero:
            self._write_progress(trainer, folder, beside_the_log, epochs)
        if isinstance(best, BestCheckpoint):
            best.remove_superseded(trainer)

    def _write_progress(self, trainer: L.Trainer, folder: Path, beside_the_log: Path,
                        epochs: int) -> None:
        """progress.json of the last.ckpt just written into ``folder``, and beside the log
        when the checkpoints are kept elsewhere (first process only)."""
        write_progress(folder, trainer, self.path, epochs_done=epochs)
        if trainer.loggers and beside_the_log.resolve() != folder.resolve():
            # Checkpoints kept elsewhere (--checkpoint.dirpath): the run's own folder, where
            # ``captioner runs`` looks, still says where they are.
            beside_the_log.mkdir(parents=True, exist_ok=True)
            write_progress(beside_the_log, trainer, self.path, epochs_done=epochs)

    def state_dict(self) -> dict[str, Any]:
        # Called while the checkpoint is written, so these are the states at the save; "rng"
        # is this process's, for checkpoints of a run with another number of processes.
        return {"rng": _rng_states(), "rng_by_rank": self._states_by_rank}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Called when fit restores a checkpoint, before any data is drawn.
        by_rank = state_dict.get("rng_by_rank") or []
        if self._rank < len(by_rank):
            _set_rng_states(by_rank[self._rank])
        elif "rng" in state_dict:
            _set_rng_states(state_dict["rng"])


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, modification time in ns) of ``path``, None when it does not exist: an atomic
    write replaces the file, which changes both."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _epoch_complete(trainer: L.Trainer) -> bool:
    """Whether the training epoch has run all its batches (as Lightning's loop decides)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return progress.is_last_batch or progress.current.ready == trainer.num_training_batches


def _stops_inside_the_epoch(trainer: L.Trainer) -> bool:
    """Whether training stops after this batch, before the end of its epoch: ``max_steps``
    reached, or a stop asked for (``max_time``'s Timer, which runs before this callback)."""
    reached = 0 <= trainer.max_steps <= trainer.global_step
    return (reached or trainer.should_stop) and not _epoch_complete(trainer)


def _gather(state: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every process's ``state`` in rank order (a collective under DDP: all ranks call it)."""
    if world_size == 1 or not torch.distributed.is_initialized():
        return [state]
    states: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(states, state)
    return states


def _best_callback(trainer: L.Trainer) -> ModelCheckpoint | None:
    return next((c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)), None)


def _log_dir(trainer: L.Trainer) -> Path:
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"


def _rng_states() -> dict[str, Any]:
    """The generators' states as tensors and plain data (loadable with weights_only=True)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (the global state is what code draws from)
    version, python_state, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "python": [version, list(python_state), gauss],
    }


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))  # noqa: NPY002
    version, python_state, gauss = states["python"]
    random.setstate((version, tuple(python_state), gauss))


def write_progress(folder: Path, trainer: L.Trainer, last: Path, *, epochs_done: int) -> None:
    """``progress.json`` beside ``last``: epochs done (and the max_epochs the fit trains to,
    when it has one), step, best score and checkpoints."""
    best = _best_callback(trainer)
    score = getattr(best, "best_model_score", None)
    progress = {
        "epochs_done": epochs_done,
        "max_epochs": trainer.max_epochs if (trainer.max_epochs or 0) > 0 else None,
        "global_step": trainer.global_step,
        "monitor": getattr(best, "monitor", None),
        "best_score": None if score is None else float(score),
        "best_checkpoint": getattr(best, "best_model_path", "") or None,
        "last_checkpoint": str(last),
    }
    with atomic_write(folder / PROGRESS_NAME) as handle:
        json.dump(progress, handle, indent=1)


def new_version(root: Path, name: str) -> int:
    """Make the folder of a new run version, ``ROOT/NAME/version_N`` with N one more than the
    largest version there (or the next one free), and return N. Picking is making: of two
    runs started together, ``mkdir`` fails for one, which goes on to N + 1."""
    (root / name).mkdir(parents=True, exist_ok=True)
    version = max((version for version, _ in version_folders(root, name)), default=-1) + 1
    while True:
        try:
            (root / name / f"version_{version}").mkdir()
            return version
        except FileExistsError:
            version += 1


class RunLogger(CSVLogger):
    """Lightning's CSVLogger (its arguments), but a new version is picked by making its
    folder (:func:`new_version`), on the first process: Lightning's own pick lists the
    folders, and two runs of one name started together would both pick ``version_N``."""

    def __init__(self, save_dir: str | Path, name: str | None = "lightning_logs",
                 version: int | str | None = None, prefix: str = "",
                 flush_logs_every_n_steps: int = 100) -> None:
        super().__init__(save_dir, name, version, prefix, flush_logs_every_n_steps)
        self._picked = version

    @property
    def version(self) -> int | str:
        if self._picked is None:
            if rank_zero_only.rank != 0:  # writes nothing: Lightning's pick, without a folder
                return super().version
            self._picked = new_version(Path(self.save_dir), self.name or "")
        return self._picked


class RunInUse(ValueError):
    """A run folder that another running fit holds (its message names the folder)."""


class RunLock:
    """Holds a run's version folder while a fit trains in it, so that no other fit resumes
    into it or names its version: an exclusive ``flock`` on the folder itself, which the
    kernel drops when the process ends (a killed run resumes) and forked loader workers let go
    of at once; :meth:`release` once the fit has ended. Where the file system cannot lock a
    folder (NFS), it warns and holds nothing.

    Raises:
        RunInUse: another process holds ``folder``.
    """

    def __init__(self, folder: Path) -> None:
        self._fd: int | None = None
        try:
            fd = hold_exclusively(folder)
            for _ in range(_LOCK_TRIES - 1):
                if fd is not None:
                    break
                # `captioner runs` holds a run for an instant to see whether a fit trains
                # there (training_now): a fit starting then is not refused for it.
                time.sleep(_LOCK_WAIT_S)
                fd = hold_exclusively(folder)
        except OSError as exc:
            # The lock guards against a second fit; a file system that locks no folder (NFS)
            # must not stop this one.
            warnings.warn(f"{folder}: {exc.strerror}: a second fit resuming this run while "
                          "this one trains would not be refused", stacklevel=2)
            return
        if fd is None:
            raise RunInUse(f"{folder}: another fit is training in this run now; wait for it "
                           "to end (or stop it) before training in it again")
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            let_go(self._fd)
        self._fd = None


def claim_evaluation_folder(run: Path, subcommand: str) -> tuple[str, int | None]:
    """The folder beside the run ``run`` (``ROOT/NAME/version_N``) that ``validate`` or
    ``test`` of one of its checkpoints logs into, made and held as :class:`RunLock` holds a
    run: the first of ``<subcommand>``, ``<subcommand>_2``, ... that holds no ``metrics.csv``
    (the CSV logger would delete it) and that no other evaluation holds now.

    Returns:
        The folder's name and the descriptor of the hold, for :func:`let_go` (None where the
        file system cannot lock a folder).
    """
    for k in itertools.count(1):
        name = subcommand if k == 1 else f"{subcommand}_{k}"
        folder = run / name
        if (folder / "metrics.csv").exists():
            continue
        folder.mkdir(exist_ok=True)
        try:
            fd = hold_exclusively(folder)
        except OSError:
            return name, None
        if fd is None:  # another evaluation is logging there now
            continue
        if (folder / "metrics.csv").exists():  # one that ended between the two looks
            let_go(fd)
            continue
        return name, fd


def latest_resumable(root: Path, name: str) -> tuple[int, Path] | None:
    """The newest numbered version of run NAME that has a ``last.ckpt``, and that file
    (:func:`last_checkpoint`)."""
    for version, folder in reversed(version_folders(root, name)):
        last = last_checkpoint(folder)
        if last is not None:
            return version, last
    return None


def last_checkpoint(run: Path) -> Path | None:
    """The ``last.ckpt`` of the run folder ``run``: in its ``checkpoints/``, or where the
    ``progress.json`` there says it keeps its checkpoints (``--checkpoint.dirpath``); None
    when it has none."""
    checkpoints = run / "checkpoints"
    last = recorded_checkpoint(checkpoints, read_progress(checkpoints).get("last_checkpoint"))
    last = checkpoints / LAST_NAME if last is None else last
    return last if last.is_file() else None


def set_aside_metrics(folder: Path, resumed_step: int) -> Path | None:
    """Before a resume into ``folder``: Lightning's CSV logger would delete ``metrics.csv``, so
    its rows up to ``resumed_step`` (the part the resume does not replay) are kept as
    ``metrics.partK.csv`` (K = 1, 2, ... per resume); returns that file, or None."""
    metrics = folder / "metrics.csv"
    if not metrics.is_file():
        return None
    with metrics.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fieldnames = reader.fieldnames or []
        rows = [r for r in reader if not r.get("step") or int(float(r["step"])) < resumed_step]
    part = 1
    while (folder / f"metrics.part{part}.csv").exists():
        part += 1
    kept = folder / f"metrics.part{part}.csv"
    with atomic_write(kept) as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    metrics.unlink()
    return kept


_HELD_METRICS = "metrics.before-resume.csv"


def remove_interrupted_writes(folders: Iterable[Path]) -> list[Path]:
    """Remove the temporary files of atomic writes (:func:`data_prep.atomic.atomic_temporaries`)
    in ``folders``, which a run killed while writing a checkpoint leaves, as large as a
    checkpoint; returns them. Only for a resume holding the run (:class:`RunLock`): no other
    fit is writing there."""
    removed = []
    for folder in dict.fromkeys(Path(folder) for folder in folders):
        for path in atomic_temporaries(folder):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def hold_metrics_for_resume(folder: Path) -> None:
    """Before a resume into ``folder``: move ``metrics.csv`` out of the way of Lightning's CSV
    logger, which deletes it when the trainer sets up (before the checkpoint is checked);
    :class:`WorkBegun` then sets its rows aside, or the CLI puts it back if the resume is refused.
    A file held by an earlier resume that never started is kept."""
    metrics, held = folder / "metrics.csv", folder / _HELD_METRICS
    if metrics.is_file() and not held.exists():
        metrics.rename(held)


def put_back_held_metrics(folder: Path) -> bool:
    """Move what :func:`hold_metrics_for_resume` held back to ``metrics.csv``; False if none."""
    held = folder / _HELD_METRICS
    if not held.is_file():
        return False
    held.replace(folder / "metrics.csv")
    return True


class WorkBegun(Callback):
    """Tells whether a command's work has begun (``begun``): a training step done (fit), the
    scores made (validate, test). A command that stops before then leaves nothing of its own
    behind (:func:`remove_unbegun_run`). A resume's earlier ``metrics.csv``, held back from
    Lightning's CSV logger (:func:`hold_metrics_for_resume`), has its rows set aside as
    ``metrics.partK.csv`` (:func:`set_aside_metrics`) once the fit starts.

    Args:
        resumed: a resume's run folder and the global step of the checkpoint it continues
            from; None otherwise.
    """

    def __init__(self, resumed: tuple[Path, int] | None = None) -> None:
        self.resumed = resumed
        self.begun = False

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        if self.resumed is not None and trainer.is_global_zero:
            folder, step = self.resumed
            if put_back_held_metrics(folder):
                set_aside_metrics(folder, step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch,
                           batch_idx) -> None:
        self.begun = True

    # After on_*_epoch_end, where the module logs its scores; a fit's validation comes after
    # its first training step.
    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        self.begun = self.begun or not trainer.sanity_checking

    def on_test_end(self, trainer: L.Trainer, pl_module) -> None:
        self.begun = True


def remove_unbegun_run(folder: Path | None, new_root: Path | None) -> None:
    """Remove the log ``folder`` that a command made (a new run version, or an evaluation's
    folder beside a run) when it stopped before its work began (:class:`WorkBegun`): its
    ``config.yaml``, ``hparams.yaml``, ..., unless a checkpoint is in it; then its parent
    (``ROOT/NAME``) and ``new_root`` (``ROOT`` when this command made it) if left empty."""
    if folder is not None and folder.is_dir() and not any(folder.rglob("*.ckpt")):
        shutil.rmtree(folder)
        remove_if_empty(folder.parent)
    if new_root is not None:
        remove_if_empty(new_root)


def remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


class SaveConfigOnceRestored(SaveConfigCallback):
    """LightningCLI's ``config.yaml`` of a fit, written once the checkpoint to resume (if
    any) has been restored and checked (``on_fit_start``, not ``setup``): a refused resume
    leaves the run's own ``config.yaml`` as it was. validate and test write at ``setup``,
    and nothing without a logger: they log nothing then, and Lightning would write into the
    folder they run in.

    A fit's ``config.yaml`` is the recipe of its run, with the settings in ``recorded`` (set by
    the CLI) in place of those it resolved: ``ckpt_path: null`` and the version as given, not
    the checkpoint and version_N a resume continued. ``fit --config`` of it trains the recipe
    anew; ``--ckpt_path last`` resumes the run.
    """

    recorded: dict[str, Any] = {}  # dotted key -> the value config.yaml records

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        if stage != "fit" and trainer.logger is not None:
            super().setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        self.config = self.config.clone()
        for key, value in self.recorded.items():
            self.config[key] = value
        super().setup(trainer, pl_module, "fit")
