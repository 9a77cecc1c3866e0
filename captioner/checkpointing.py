"""Checkpoint files: written atomically (an interrupted run leaves the previous checkpoint or
the new one, never a truncated file), read as untrusted data: :func:`load_safely` checks every
member's CRC-32 and loads tensors and plain data only (``weights_only=True``), and
:func:`constructor_arguments` checks the stored hyperparameters against the model's constructor
before anything is built from them (no ``class_path`` that jsonargparse would import).
"""

from __future__ import annotations

import inspect
import pickle
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from data_prep.atomic import atomic_write
from data_prep.paths import check_input_file
from data_prep.stop_signals import stops_held
from data_prep.vocab import Vocabulary
from data_prep.wording import counted, first_names, shown

# Where Lightning stores a module's hyperparameters (LightningModule.CHECKPOINT_HYPER_PARAMS_KEY),
# named here so that reading a checkpoint needs no Lightning.
HYPERPARAMETERS_KEY = "hyper_parameters"
# The checkpoint's entry that holds the vocabulary, so that a checkpoint is self-contained.
VOCABULARY_KEY = "vocabulary"
# Keys that LightningCLI stores beside a module's own hyperparameters (Lightning >= 2.3).
LIGHTNING_HPARAM_KEYS = frozenset({"_instantiator", "_class_path"})
# Keys of jsonargparse's class specification: a checkpoint holding them could import anything.
_CLASS_SPEC_KEYS = frozenset({"class_path", "init_args", "__path__"})
_MAX_DEPTH = 8


class CheckpointError(ValueError):
    """A file that is not a usable captioner checkpoint (the message names file and reason)."""


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to ``path`` through :func:`data_prep.atomic.atomic_write`, with Ctrl-C
    (and the other stops) held back until the file is in place: torch.save's zip writer turns
    a KeyboardInterrupt raised inside it into a RuntimeError, which Lightning's graceful
    shutdown does not recognize, so a fit stopped while writing a checkpoint would end with a
    traceback and without that checkpoint (:func:`data_prep.stop_signals.stops_held`)."""
    with stops_held(), atomic_write(path, "wb") as handle:
        kept = _KeepsWriteError(handle)
        try:
            torch.save(checkpoint, kept)
        except RuntimeError:
            if kept.error is None:
                raise
            raise kept.error from None  # atomic_write says a full disk in one line


class _KeepsWriteError:
    """A binary file for ``torch.save`` that keeps the OSError its ``write`` raised: torch
    turns it into a RuntimeError of its own ("unexpected pos"), which says nothing of a full
    disk."""

    def __init__(self, handle: Any):
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.handle.flush()


def load_safely(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``.

    Raises:
        FileNotFoundError: no such file. CheckpointError: a folder, an empty file, a file
            that is not a torch checkpoint, or one holding objects other than tensors and
            plain data (it is refused, never unpickled).
    """
    path = Path(path)
    try:
        check_input_file(path)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a checkpoint file")
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"{path}: is not a regular file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: is empty (0 bytes), not a checkpoint")
    problem = _format_problem(path)
    if problem is not None:
        raise CheckpointError(f"{path}: not a torch checkpoint ({problem})")
    damage = _checksum_problem(path)
    if damage is not None:
        raise CheckpointError(f"{path}: damaged ({damage}); the file changed after it was "
                              "written: use another checkpoint or a good copy of it")
    try:
        with warnings.catch_warnings():
            # torch's note that the file's pickle protocol is not its own: the error, if the
            # file cannot be read, says what matters.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _unpickler_reason(exc)
        if "GLOBAL" in reason:  # a class or function to import: code that would run
            raise CheckpointError(
                f"{path}: holds objects other than tensors and plain data ({reason}); "
                "refused, it is not loaded"
            ) from None
        raise CheckpointError(
            f"{path}: not a torch checkpoint (pickle data it cannot read: {reason})") from None
    except Exception as exc:
        # The first sentence: torch's reading errors go on with general advice.
        text = str(exc).strip()
        first = text.splitlines()[0].split(". ")[0] if text else type(exc).__name__
        raise CheckpointError(f"{path}: not a torch checkpoint ({first})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{path}: holds a {type(checkpoint).__name__}, not a checkpoint dictionary"
        )
    return checkpoint


def _format_problem(path: Path) -> str | None:
    """Why the file's first bytes rule out a torch checkpoint, else None: ``torch.save``
    writes a zip archive (a truncated one has lost its directory at the end), and wrote
    pickle data (protocol 2 or later, first byte 0x80) before torch 1.6."""
    with path.open("rb") as handle:
        head = handle.read(2)
    if head == b"PK":
        return None if zipfile.is_zipfile(path) else "a truncated or damaged zip archive"
    if head[:1] == b"\x80":
        return None
    return "neither the zip archive that torch.save writes nor pickle data"


def _checksum_problem(path: Path) -> str | None:
    """Why the zip archive of a checkpoint fails its checksums, or None (also for the pickle
    data of torch before 1.6, which has none). ``torch.save`` records the CRC-32 of every
    member and ``torch.load`` never checks them: a flipped bit in a tensor loads as another
    weight, silently."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            failed = archive.testzip()  # reads every member, checking its CRC-32
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        return f"its zip archive cannot be read: {exc}"
    if failed is not None:
        return f"the data of {failed} fails its CRC-32 checksum"
    return None


def _unpickler_reason(exc: Exception) -> str:
    """The unpickler's own reason (e.g. 'Unsupported global: GLOBAL os.system'), without
    torch's advice to load the file with weights_only=False."""
    text = str(exc)
    for line in text.splitlines():
        if "GLOBAL" in line:
            return line.split("WeightsUnpickler error:")[-1].strip()
    if "WeightsUnpickler error:" in text:
        after = text.split("WeightsUnpickler error:", 1)[1].strip()
        lines = [line.strip() for line in after.splitlines() if line.strip()]
        if lines and not lines[0].startswith("Check the documentation"):
            return lines[0]
    return "unreadable pickle data"


def constructor_arguments(
    hparams: Any, constructor: Callable, source: str | Path
) -> dict[str, Any]:
    """The hyperparameters ``hparams`` of a checkpoint as keyword arguments of ``constructor``.

    Lightning's bookkeeping keys are dropped; every other key must be a parameter of
    ``constructor`` and every value plain data.

    Raises:
        CheckpointError: not a dict, an unknown key, or a value that is not plain data (the
            message names ``source``, the key and the problem).
    """
    if not isinstance(hparams, Mapping):
        raise CheckpointError(
            f"{source}: hyperparameters must be a dict, got {type(hparams).__name__}"
        )
    parameters = inspect.signature(constructor).parameters
    arguments = {}
    for key, value in hparams.items():
        if key in LIGHTNING_HPARAM_KEYS:
            continue
        if key not in parameters or key == "self":
            raise CheckpointError(
                f"{source}: unknown hyperparameter {key!r}; this version of captioner's model "
                f"takes {', '.join(p for p in parameters if p != 'self')}"
            )
        check_plain_data(value, f"{source}: hyperparameter {key!r}")
        arguments[key] = value
    return arguments


def check_plain_data(value: Any, where: str, depth: int = 0) -> None:
    """Raise :class:`CheckpointError` unless ``value`` is None, a bool, int, float or str, or
    a list / tuple / str-keyed dict of those, without jsonargparse class specifications."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if depth >= _MAX_DEPTH:
        raise CheckpointError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain_data(item, f"{where}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointError(f"{where}: dict key {key!r} is not a string")
            if key in _CLASS_SPEC_KEYS:
                raise CheckpointError(
                    f"{where}: holds a class specification ({key!r}); refused, a checkpoint "
                    "may not name code to import"
                )
            check_plain_data(item, f"{where}[{key!r}]", depth + 1)
        return
    raise CheckpointError(f"{where}: a {type(value).__name__} is not plain data")


def stored_vocabulary(checkpoint: Mapping[str, Any], hparams: Mapping[str, Any],
                      path: Path | str) -> Vocabulary:
    """The vocabulary that ``checkpoint`` (read from ``path``) stores, which must have the
    ``vocab_size`` of its hyperparameters ``hparams``.

    Raises:
        CheckpointError: none stored, not a vocabulary, or of another size (one line).
    """
    if VOCABULARY_KEY not in checkpoint:
        raise CheckpointError(f"{path}: no {VOCABULARY_KEY!r} entry; not a checkpoint written "
                              "by captioner training")
    try:
        vocabulary = Vocabulary.from_dict(checkpoint[VOCABULARY_KEY])
    except ValueError as exc:
        raise CheckpointError(f"{path}: its {exc}") from None
    if len(vocabulary) != hparams.get("vocab_size"):
        raise CheckpointError(f"{path}: vocabulary has {len(vocabulary)} words but vocab_size "
                              f"is {hparams.get('vocab_size')}")
    return vocabulary


def weights_mismatch(model: Mapping[str, Any], stored: Mapping[str, Any], shown: int = 3
                     ) -> str | None:
    """Why the tensors ``stored`` (a checkpoint's ``state_dict``) cannot be loaded strictly into
    a model whose ``state_dict()`` is ``model``, in one line: the missing and unexpected names
    and the tensors of another shape, ``shown`` of each at most (torch's own message lists
    every name, hundreds for a ResNet). None when they fit.

    Args:
        model, stored: parameter name -> tensor (anything else in ``stored`` counts as a
            tensor of another shape).
    """
    missing = [name for name in model if name not in stored]
    unexpected = [name for name in stored if name not in model]
    reshaped = [
        f"{name} {_shape(stored[name])} in the checkpoint, {_shape(model[name])} in the model"
        for name in model
        if name in stored and _shape(stored[name]) != _shape(model[name])
    ]
    parts = []
    for what, names in (("missing from the checkpoint", missing),
                        ("not in the model", unexpected), ("of another shape", reshaped)):
        if names:
            parts.append(f"{counted(len(names), 'tensor')} {what} ({first_names(names, shown)})")
    return "; ".join(parts) or None


def nonfinite_weights(stored: Mapping[str, Any]) -> list[str]:
    """Names of the floating-point tensors of ``stored`` (a ``state_dict``) that hold NaN or
    inf: such weights make every attention score NaN, refused only once a caption is made."""
    return [name for name, value in stored.items() if isinstance(value, torch.Tensor)
            and value.is_floating_point() and not bool(torch.isfinite(value).all())]


def optimizer_state_problem(state: Any, parameters: list[tuple[str, torch.Tensor]]
                            ) -> str | None:
    """Why ``state`` (a checkpoint's ``optimizer_states[0]``, torch's ``Optimizer.state_dict()``)
    cannot resume the optimizer of ``parameters`` (the trainable ones, named, in the order the
    optimizer holds them), in one line, or None. torch checks only the count of parameters per
    group when it loads: a moment of another shape fails at the first step, in a traceback,
    and a non-finite one turns every weight it updates into NaN."""
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    moments = state.get("state") if isinstance(state, Mapping) else None
    if not (isinstance(groups, list) and isinstance(moments, Mapping) and all(
            isinstance(group, Mapping) and isinstance(group.get("params"), list)
            for group in groups)):
        return "it is not an optimizer's state (param_groups and state)"
    held = sum(len(group["params"]) for group in groups)
    if held != len(parameters):
        return (f"it holds the state of {counted(held, 'parameter')}, and the model trains "
                f"{len(parameters)}")
    for index, entry in moments.items():
        if not (isinstance(index, int) and 0 <= index < len(parameters)
                and isinstance(entry, Mapping)):
            return f"its state entry {shown(index)} names no parameter the model trains"
        name, parameter = parameters[index]
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                continue  # torch's own loader converts or refuses a plain value (a step)
            if value.dim() and value.shape != parameter.shape:
                return (f"{key!r} of {name} has shape {_shape(value)}, the parameter "
                        f"{_shape(parameter)}")
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"{key!r} of {name} holds NaN or inf"
    return None


def _shape(value: Any) -> tuple[int, ...] | str:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def __getattr__(name: str) -> Any:
    # AtomicCheckpointIO is Lightning's plugin: imported on demand, so that reading or writing
    # a checkpoint (caption, prepare-features) does not import Lightning. Run folders'
    # config.yaml files name it here by class_path.
    if name == "AtomicCheckpointIO":
        from captioner.training.runs import AtomicCheckpointIO

        return AtomicCheckpointIO
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
