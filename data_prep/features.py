"""HDF5 cache of encoder grid features, keyed by image id.

With a frozen encoder the ResNet runs once per image (``captioner prepare-features``) and
training reads the (H, W, C) grid of each image from this file: float16, 8x8x2048 = 256 KiB per
image for the paper's ResNet at 256 px. Layout of the file:

* ``features``: float16 (N, H, W, C), chunked one image per chunk, each chunk with HDF5's
  Fletcher-32 checksum (h5py's ``fletcher32``), which HDF5 checks on every read;
* ``image_ids``: int64 (N,), row i of ``features`` belongs to ``image_ids[i]``;
* ``row_crc32``: uint32 (N,), the CRC-32 of row i's image id (8 bytes, little-endian int64)
  followed by its features' bytes (:func:`row_checksum`), checked on every read: it ties a row
  to its image, which a chunk checksum cannot (a chunk pointer moved to another row's chunk
  reads a whole chunk), and catches a row rewritten without it (absent in caches of older
  versions: not checked);
* ``image_names``: a JSON string, ``{"image id": "filepath/filename"}`` for every source image
  of the split file the cache was made from, so that a split file whose ids name other images
  is refused (absent in caches of older versions: not checked);
* attributes ``format``, ``version``, ``grid`` (H, W), ``channels`` (C) and ``encoder``
  (a JSON object describing the encoder that produced the features, e.g. arch, weights, image
  size), so that a cache made by another encoder is detected instead of silently used;
* attribute ``skipped_ids``: JSON list of the ids of source images that have no features
  because they could not be read (absent in caches of older versions: none skipped); their
  paths and reasons are in the sidecar file ``NAME.skipped.json`` (:func:`skipped_images_path`),
  a JSON list of ``{"id", "path", "reason"}``, written only when images were skipped;
* a resumable cache (``resume_key`` given to the writer) also keeps its bookkeeping:
  ``resume_key`` (JSON: whatever determines the rows, e.g. encoder settings and the ordered
  image ids) and ``progress`` (JSON: ``rows``, ``skipped`` records and CRC-32 checksums of the
  committed ``features`` and ``image_ids`` bytes).

The writer fills a temporary file beside the destination and renames it over the destination
only when its ``with`` block ends without an exception, so an interrupted run never leaves a
truncated cache behind. With a ``resume_key`` the temporary file is ``.NAME.partial.h5``
(:func:`partial_cache_path`): :meth:`FeatureCacheWriter.commit` makes the rows written so far
durable, and a later writer with the same key continues from the committed rows instead of
starting over (a process killed at any point loses at most the rows since the last commit).
Files are created with the process's umask (0644 normally).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import time
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.atomic import atomic_write
from data_prep.disk_space import check_room
from data_prep.images import one_line
from data_prep.settings_files import parse_json
from data_prep.wording import first_names, shown

_FORMAT = "captioner.feature-cache"
_VERSION = 1
_VERIFY_ROWS = 256  # rows read at a time when the checksums of a partial file are verified
# HDF5's own structures (chunk index, attributes) beside a row's float16 values, and the room
# kept free for what a commit and the close write besides a batch's rows.
_ROW_OVERHEAD = 1.01
_COMMIT_ROOM = 1 << 16


def cache_lock_path(path: str | Path) -> Path:
    """The lock file that the one process making the cache ``path`` holds while it works
    (:func:`data_prep.locks.held_alone`): ``dir/.NAME.lock`` for ``dir/NAME.h5``, beside the
    file a symbolic link leads to (two runs reaching one cache by two links hold one lock)."""
    path = Path(os.path.realpath(path))
    return path.with_name(f".{path.stem}.lock")


def partial_cache_path(path: str | Path) -> Path:
    """The file a resumable :class:`FeatureCacheWriter` fills for the cache ``path``:
    ``dir/.NAME.partial.h5`` for ``dir/NAME.h5``."""
    path = Path(path)
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def skipped_images_path(path: str | Path) -> Path:
    """The sidecar file listing the skipped images of the cache ``path``:
    ``dir/NAME.skipped.json`` for ``dir/NAME.h5``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.skipped.json")


# How long a partial file locked by another process is waited for before it is called busy.
IN_USE_WAIT_SECONDS = 5.0


class PartialCacheInUseError(OSError):
    """The partial file of a cache is open for writing in another process."""


def partial_resume_key(path: str | Path) -> dict[str, Any] | None:
    """The ``resume_key`` recorded in the partial file of the cache ``path``; None when there is
    no partial file or it cannot be read (the writer then says why when it opens).

    Raises:
        PartialCacheInUseError: another process is writing the partial file.
    """
    partial = partial_cache_path(path)
    if not partial.is_file():
        return None
    try:
        with _open_partial(partial, "r") as file:
            return json.loads(file.attrs["resume_key"])
    except OSError as exc:
        _raise_if_in_use(exc, partial)
        return None
    except (KeyError, TypeError, ValueError):
        return None


def _in_use(exc: OSError) -> bool:
    # HDF5 locks a file it writes; opening it again would fail, and creating it anew would
    # truncate it under the other process.
    return exc.errno == errno.EAGAIN or "unable to lock file" in str(exc)


def _open_partial(path: Path, mode: str):
    """``h5py.File(path, mode)``, waiting up to IN_USE_WAIT_SECONDS while another process
    holds the file's lock: image-loader workers forked while it was open keep the lock until
    they notice that their parent was killed (about a second after a ``kill -9``)."""
    import h5py

    deadline = time.monotonic() + IN_USE_WAIT_SECONDS
    while True:
        try:
            return h5py.File(path, mode)
        except OSError as exc:
            if not _in_use(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _raise_if_in_use(exc: OSError, partial: Path) -> None:
    if _in_use(exc):
        raise PartialCacheInUseError(
            f"{partial} is open in another process (another run writing the same cache?): "
            "wait for it to finish, or stop it"
        ) from None


class FeatureCacheWriter:
    """Write a feature cache; use as a context manager and call :meth:`add` per batch.

    Args:
        path: destination ``.h5`` file (replaced atomically on success).
        grid: (H, W) of the feature grid.
        channels: C, the feature size per grid cell.
        encoder: JSON-serialisable description of the encoder, stored in the file.
        names: each source image's name (``filepath/filename`` of the split file) by image id,
            stored in the file (dataset ``image_names``, JSON) so that a cache used with
            another split file whose ids name other images can be refused.
        resume_key: JSON-serialisable description of everything that determines the rows
            (encoder settings, the ordered source image ids, ...). With it the writer is
            resumable: it fills :func:`partial_cache_path`, :meth:`commit` makes the rows
            durable, and opening finds the committed rows of an earlier writer with the same
            key, ``grid``, ``channels`` and ``encoder`` (checksums verified): :attr:`done`
            says how many source images they cover. A partial file that cannot be read, is
            damaged or was made with another key is replaced, and :attr:`restarted` says why;
            one that another process is writing raises :class:`PartialCacheInUseError`.

    Every source image is either written (:meth:`add`) or skipped (:meth:`skip`), in source
    order, so ``done`` = rows + skipped images is the position to continue from.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        grid: tuple[int, int],
        channels: int,
        encoder: Mapping[str, Any],
        names: Mapping[int, str] | None = None,
        resume_key: Mapping[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.grid = _positive_ints(grid, "grid", length=2)
        (self.channels,) = _positive_ints((channels,), "channels", length=1)
        self._encoder_json = _json_object(encoder, "encoder description")
        self._key_json = None if resume_key is None else _json_object(resume_key, "resume_key")
        self._names_json = None if names is None else json.dumps(
            {str(_image_id(image_id)): str(name) for image_id, name in names.items()})
        if self._key_json is None:
            self._temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        else:
            self._temporary = partial_cache_path(self.path)
        self._file = None
        self._ids: set[int] = set()
        self._skipped: list[dict[str, Any]] = []
        self._crc = {"features": 0, "image_ids": 0}
        self._committed = 0  # source images dealt with at the last commit
        self.restarted: str | None = None

    @property
    def resumable(self) -> bool:
        return self._key_json is not None

    @property
    def rows(self) -> int:
        """Rows written so far (committed or not)."""
        return len(self._ids)

    @property
    def done(self) -> int:
        """Source images dealt with so far: rows written plus images skipped."""
        return len(self._ids) + len(self._skipped)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Skipped images so far: ``{"id", "path", "reason"}`` records in source order."""
        return [dict(record) for record in self._skipped]

    def __enter__(self) -> FeatureCacheWriter:
        import h5py

        if self._file is not None:
            raise RuntimeError(f"feature cache writer for {self.path} is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.resumable and self._temporary.exists():
            self.restarted = self._resume()
            if self.restarted is None:
                self._record_names()
                return self
            self._temporary.unlink()  # a new file, not one truncated under a reader
        self._file = h5py.File(self._temporary, "w")
        self._file.attrs.update(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "grid": np.array(self.grid, dtype=np.int64),
                "channels": self.channels,
                "encoder": self._encoder_json,
            }
        )
        height, width = self.grid
        shape = (0, height, width, self.channels)
        self._file.create_dataset(
            "features",
            shape=shape,
            maxshape=(None, *shape[1:]),
            dtype=np.float16,
            chunks=(1, *shape[1:]),
            fletcher32=True,
        )
        self._file.create_dataset("image_ids", shape=(0,), maxshape=(None,), dtype=np.int64)
        self._file.create_dataset("row_crc32", shape=(0,), maxshape=(None,), dtype=np.uint32)
        self._record_names()
        if self.resumable:
            self._file.attrs["resume_key"] = self._key_json
            self.commit()
        return self

    def _record_names(self) -> None:
        # A scalar dataset: an attribute of a large dataset's names would pass HDF5's 64 KiB.
        if self._names_json is not None and "image_names" not in self._file:
            self._file.create_dataset("image_names", data=self._names_json)

    def _resume(self) -> str | None:
        """Open the partial file and keep its committed rows; returns None, or why it cannot be
        used (it is then closed and will be overwritten)."""
        try:
            file = _open_partial(self._temporary, "a")
        except OSError as exc:
            _raise_if_in_use(exc, self._temporary)
            return f"cannot be read ({one_line(exc)})"
        try:
            reason = self._adopt(file)
        except (OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            reason = f"is damaged ({one_line(exc)})"
        if reason is not None:
            file.close()
            return reason
        self._file = file
        return None

    def _adopt(self, file) -> str | None:
        attrs = file.attrs
        if attrs.get("format") != _FORMAT or "progress" not in attrs:
            return "is not a partial feature cache"
        if attrs.get("resume_key") != self._key_json:
            return "was made with other settings or for other images"
        if (
            tuple(int(v) for v in attrs["grid"]) != self.grid
            or int(attrs["channels"]) != self.channels
            or attrs["encoder"] != self._encoder_json
        ):
            return "was made by another encoder"
        if "row_crc32" not in file:
            return "was made by an older version (no row checksums)"
        progress = json.loads(attrs["progress"])
        rows = int(progress["rows"])
        features, ids, checksums = file["features"], file["image_ids"], file["row_crc32"]
        if min(features.shape[0], ids.shape[0], checksums.shape[0]) < rows:
            return f"is damaged (it commits {rows} rows but holds {features.shape[0]})"
        # Rows written after the last commit may be torn: drop them.
        for dataset in (features, ids, checksums):
            dataset.resize(rows, axis=0)
        crc = {"features": 0, "image_ids": 0}
        for start in range(0, rows, _VERIFY_ROWS):
            for name in crc:
                block = np.ascontiguousarray(file[name][start : start + _VERIFY_ROWS])
                crc[name] = zlib.crc32(block.tobytes(), crc[name])
        if crc != progress["crc32"]:
            return "is damaged (checksum of its committed rows differs)"
        stored = [int(i) for i in ids[:]]
        if len(set(stored)) != rows:
            return "is damaged (duplicate image ids)"
        self._ids = set(stored)
        self._skipped = [dict(record) for record in progress["skipped"]]
        self._crc = crc
        self._committed = self.done
        return None

    def add(self, image_ids: Sequence[int], feats: np.ndarray) -> None:
        """Append features ``feats`` (N, H, W, C), floating point (stored as float16, must be
        finite after the cast) of the images ``image_ids`` (N distinct ints, new to the file)."""
        self._check_open("add")
        ids = [_image_id(value) for value in image_ids]
        feats = np.asarray(feats)
        expected = (len(ids), *self.grid, self.channels)
        if feats.shape != expected:
            raise ValueError(
                f"features for {len(ids)} images must have shape (N, H, W, C) = {expected}, "
                f"got {feats.shape}"
            )
        if not np.issubdtype(feats.dtype, np.floating):
            raise TypeError(f"features must be floating point, got dtype {feats.dtype}")
        self._check_new(ids)
        self.check_room(len(ids), f"the cache {self.path.name} ({self.rows} rows written so far, "
                        "kept for the rerun)", slack=_COMMIT_ROOM)
        with np.errstate(over="ignore"):  # overflow is reported below, naming the images
            half = np.ascontiguousarray(feats.astype(np.float16))
        finite = np.isfinite(half).reshape(len(ids), -1).all(axis=1)
        if not finite.all():
            bad = [ids[i] for i in np.flatnonzero(~finite)]
            raise ValueError(
                f"features of image ids {first_names(bad)} are not finite in float16 (NaN, inf, or "
                f"beyond +-65504)"
            )
        stored = np.array(ids, dtype=np.int64)
        start = len(self._ids)
        features, stored_ids = self._file["features"], self._file["image_ids"]
        checksums = self._file["row_crc32"]
        for dataset in (features, stored_ids, checksums):
            dataset.resize(start + len(ids), axis=0)
        features[start:] = half
        stored_ids[start:] = stored
        checksums[start:] = [row_checksum(i, row) for i, row in zip(ids, half, strict=True)]
        self._ids.update(ids)
        self._crc["features"] = zlib.crc32(half.tobytes(), self._crc["features"])
        self._crc["image_ids"] = zlib.crc32(stored.tobytes(), self._crc["image_ids"])

    def check_room(self, rows: int, what: str, *, slack: int = 0) -> None:
        """Refuse, before ``rows`` more rows are written, a write that cannot fit: more bytes
        (and ``slack``) than the folder has free, or a file past the file size limit (``ulimit
        -f``). HDF5 does not survive a write that fails midway (h5py ends in a segmentation
        fault), so the writer must not start one; the rows committed so far stay for the rerun.
        ``what`` names the cache in the message.

        Raises:
            OSError: ENOSPC or EFBIG, one line naming the folder, the size needed and the room
                (:func:`data_prep.disk_space.check_room`).
        """
        grows = int(rows * 2 * math.prod(self.grid) * self.channels * _ROW_OVERHEAD) + slack
        try:
            size = self._temporary.stat().st_size
        except FileNotFoundError:
            size = 0
        check_room(self.path.parent, grows, size + grows, what)

    def skip(self, image_id: int, path: str | Path, reason: str) -> None:
        """Record that the source image ``image_id`` (file ``path``) has no features because of
        ``reason`` (one line)."""
        self._check_open("skip")
        image_id = _image_id(image_id)
        self._check_new([image_id])
        self._skipped.append({"id": image_id, "path": str(path), "reason": str(reason)})

    def commit(self) -> None:
        """Make the rows and skipped images so far durable (resumable writers only): the data
        are flushed to the file before the ``progress`` attribute that counts them is written,
        so rows torn by a crash are never counted."""
        self._check_open("commit")
        if not self.resumable:
            raise RuntimeError("FeatureCacheWriter.commit needs a resume_key")
        self._file.flush()
        self._file.attrs["progress"] = json.dumps(
            {"rows": len(self._ids), "skipped": self._skipped, "crc32": self._crc},
            sort_keys=True,
        )
        self._file.flush()
        self._committed = self.done

    def _check_open(self, method: str) -> None:
        if self._file is None:
            raise RuntimeError(
                f"FeatureCacheWriter.{method} must be called inside its 'with' block"
            )

    def _check_new(self, ids: list[int]) -> None:
        seen = self._ids | {record["id"] for record in self._skipped}
        counts = Counter(ids)
        duplicates = sorted(i for i, n in counts.items() if n > 1 or i in seen)
        if duplicates:
            raise ValueError(f"image ids already written to {self.path}: {first_names(duplicates)}")

    def __exit__(self, exc_type, exc, traceback) -> None:
        file = self._file
        try:
            if exc_type is None:
                if self.resumable:
                    self.commit()
                file.attrs["skipped_ids"] = json.dumps([r["id"] for r in self._skipped])
            file.close()
            if exc_type is None:
                _fsync(self._temporary)
                os.replace(self._temporary, self.path)
                _write_skipped_sidecar(skipped_images_path(self.path), self._skipped)
        finally:
            self._file = None
            # A resumable writer keeps its partial file for the next run, if it holds work: an
            # empty one would only stand in the way of a rerun with other settings (after
            # weights that give non-finite features, say).
            if not self.resumable or (exc_type is not None and self._committed == 0):
                self._temporary.unlink(missing_ok=True)


class FeatureCache:
    """Read-only access to a cache written by :class:`FeatureCacheWriter`.

    The HDF5 file is opened lazily in each process, so instances can be handed to DataLoader
    worker processes. ``skipped_ids`` lists the source images that were skipped as unreadable
    when the cache was made (see :func:`skipped_images_path` for their paths and reasons).
    """

    def __init__(self, path: str | Path):
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"feature cache not found: {self.path}")
        try:
            with h5py.File(self.path, "r") as file:
                self._check_format(file)
                attrs = file.attrs
                self.grid: tuple[int, int] = self._positive_attr(attrs["grid"], "grid", (2,))
                (self.channels,) = self._positive_attr(attrs["channels"], "channels", ())
                self.encoder: dict[str, Any] = self._json(attrs["encoder"], "encoder", dict)
                self.skipped_ids: list[int] = self._skipped_ids(attrs.get("skipped_ids", "[]"))
                # What made the rows, for a resumable cache (None otherwise).
                key = attrs.get("resume_key")
                self.resume_key: dict[str, Any] | None = (
                    None if key is None else self._json(key, "resume_key", dict)
                )
                # SHA-256 of the encoder weights file it was written with, when recorded.
                self.weights_sha256: str | None = (self.resume_key or {}).get("weights_sha256")
                ids = self._image_ids(file)
                self._checksums = self._row_checksums(file, len(ids))
        except OSError as exc:
            raise ValueError(f"{self.path}: not a readable HDF5 feature cache ({exc})") from exc
        self._row = {int(image_id): row for row, image_id in enumerate(ids)}
        self._file = None
        self._pid = None

    def image_names(self) -> dict[int, str] | None:
        """Each cached image's name (``filepath/filename`` of the split file it was made
        from) by image id; None for a cache written before names were recorded."""
        import h5py

        with h5py.File(self.path, "r") as file:
            if "image_names" not in file:
                return None
            dataset = self._dataset(file, "image_names")
            names = self._json(dataset[()], "image_names", dict, where="dataset")
        result = {}
        for key, name in names.items():
            # The writer writes str(id); int() would also take "04" or " 4", and two keys could
            # then name one id.
            if not re.fullmatch(r"-?[1-9][0-9]*|0", key):
                raise ValueError(
                    f"{self.path}: dataset 'image_names' has key {key!r}, not an image id"
                )
            if not isinstance(name, str):
                raise ValueError(
                    f"{self.path}: dataset 'image_names' gives image id {key} the name "
                    f"{name!r}, not a string"
                )
            result[int(key)] = name
        return result

    def _check_format(self, file) -> None:
        if file.attrs.get("format") != _FORMAT:
            raise ValueError(f"{self.path}: not a feature cache (attribute 'format' is missing)")
        if file.attrs.get("version") != _VERSION:
            raise ValueError(
                f"{self.path}: feature cache version {file.attrs.get('version')}, "
                f"expected {_VERSION}"
            )
        for name in ("grid", "channels", "encoder"):
            if name not in file.attrs:
                raise ValueError(f"{self.path}: attribute {name!r} is missing")
        for name in ("features", "image_ids"):
            if name not in file:
                raise ValueError(f"{self.path}: dataset {name!r} is missing")

    def _positive_attr(self, value: Any, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The attribute ``name``, which the writer writes as integers of ``shape``."""
        array = np.asarray(value)
        if array.shape != shape or array.dtype.kind not in "iu" or (array < 1).any():
            wanted = "a positive integer" if shape == () else f"{shape[0]} positive integers"
            raise ValueError(
                f"{self.path}: attribute {name!r} must be {wanted}, got {shown(value)}"
            )
        return tuple(int(v) for v in array.reshape(-1))

    def _json(self, value: Any, name: str, kind: type, *, where: str = "attribute") -> Any:
        """The JSON text ``value`` of the attribute (or dataset) ``name``, which must hold a
        ``kind`` (dict or list)."""
        field = f"{where} {name!r}"
        if isinstance(value, bytes):  # a fixed-length or scalar-dataset string
            try:
                value = value.decode()
            except UnicodeDecodeError as exc:
                raise ValueError(f"{self.path}: {field} is not UTF-8 text ({exc})") from None
        if not isinstance(value, str):
            raise ValueError(f"{self.path}: {field} must be JSON text, got {shown(value)}")
        try:
            parsed = parse_json(value)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {field} is not valid JSON ({one_line(exc)})") from None
        if not isinstance(parsed, kind):
            raise ValueError(
                f"{self.path}: {field} must be a JSON {_JSON_KINDS[kind]}, "
                f"got {_json_kind(parsed)}"
            )
        return parsed

    def _skipped_ids(self, value: Any) -> list[int]:
        ids = self._json(value, "skipped_ids", list)
        for image_id in ids:
            if isinstance(image_id, bool) or not isinstance(image_id, int):
                raise ValueError(
                    f"{self.path}: attribute 'skipped_ids' holds {image_id!r}, "
                    "not an image id (an integer)"
                )
        return ids

    def _dataset(self, file, name: str):
        import h5py

        dataset = file[name]
        if not isinstance(dataset, h5py.Dataset):
            raise ValueError(
                f"{self.path}: {name!r} must be a dataset, got {type(dataset).__name__}"
            )
        return dataset

    def _image_ids(self, file) -> np.ndarray:
        """The ids of the rows, after checking both datasets against the attributes and each
        other from their metadata (the features themselves are not read)."""
        features, ids = self._dataset(file, "features"), self._dataset(file, "image_ids")
        # float16 is all the writer writes, and what the readers allocate and copy into.
        if features.dtype != np.float16:
            raise ValueError(
                f"{self.path}: dataset 'features' has dtype {features.dtype}, expected float16"
            )
        if features.ndim != 4 or features.shape[1:] != (*self.grid, self.channels):
            row = ", ".join(str(n) for n in (*self.grid, self.channels))
            raise ValueError(
                f"{self.path}: dataset 'features' has shape {features.shape}, but attributes "
                f"grid and channels say (N, {row})"
            )
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(
                f"{self.path}: dataset 'image_ids' must hold integers of shape (N,), got "
                f"{ids.dtype} of shape {ids.shape}"
            )
        if len(ids) != len(features):
            raise ValueError(
                f"{self.path}: dataset 'image_ids' has {len(ids)} ids, but dataset 'features' "
                f"has {len(features)} rows"
            )
        values = ids[:]
        unique, counts = np.unique(values, return_counts=True)
        if (counts > 1).any():
            first = int(np.argmax(counts > 1))
            times = "twice" if counts[first] == 2 else f"{counts[first]} times"
            raise ValueError(
                f"{self.path}: dataset 'image_ids' holds image id {unique[first]} {times}"
            )
        return values

    def _row_checksums(self, file, rows: int) -> np.ndarray | None:
        """The ``row_crc32`` of every row, uint32 (N,); None for a cache of an older version."""
        if "row_crc32" not in file:
            return None
        checksums = self._dataset(file, "row_crc32")
        if checksums.shape != (rows,) or checksums.dtype != np.uint32:
            raise ValueError(f"{self.path}: dataset 'row_crc32' must hold {rows} uint32 "
                             f"checksums, got {checksums.dtype} of shape {checksums.shape}")
        return checksums[:]

    def _features(self):
        import h5py

        if self._file is None or self._pid != os.getpid():
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file["features"]

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._row

    @property
    def image_ids(self) -> list[int]:
        """Ids in file order."""
        return list(self._row)

    def get(self, image_id: int) -> np.ndarray:
        """Features of one image, float16 (H, W, C)."""
        return self.get_many([image_id])[0]

    def get_many(self, image_ids: Sequence[int]) -> np.ndarray:
        """Features of several images in the given order, float16 (N, H, W, C), each row read
        straight into one array (h5py's fancy indexing, one selection of N rows, measured 25x
        slower for a batch of 64 of 8x8x2048 rows: 371 ms against 7 ms)."""
        rows = [self._lookup(i) for i in image_ids]
        features = self._features()
        out = np.empty((len(rows), *self.grid, self.channels), dtype=features.dtype)
        for k, row in enumerate(rows):
            try:
                features.read_direct(out, np.s_[row], np.s_[k])
            except OSError as exc:  # HDF5's Fletcher-32 check, or a chunk it cannot find
                raise self._damaged(image_ids[k], f"it cannot be read: {one_line(exc)}") from None
        self._check_finite(out, image_ids)
        if self._checksums is not None:
            for k, row in enumerate(rows):
                if row_checksum(int(image_ids[k]), out[k]) != self._checksums[row]:
                    raise self._damaged(image_ids[k], "it fails its checksum (row_crc32)")
        return out

    def _damaged(self, image_id: int, problem: str) -> ValueError:
        return ValueError(f"{self.path}: the features of image id {image_id} are damaged "
                          f"({problem}); make the cache again with captioner prepare-features")

    def _check_finite(self, features: np.ndarray, image_ids: Sequence[int]) -> None:
        """ValueError naming the first image whose features hold NaN or inf: the writer
        refuses them, so the file is damaged, and the model would fail on unnamed NaN scores.
        float16 bits, whose exponent is all ones for NaN and inf only: 6x faster than
        np.isfinite on float16 (1.4 against 8.3 ms a batch of 64 8x8x2048 rows)."""
        bad = (features.view(np.uint16) & _F16_EXPONENT) == _F16_EXPONENT
        if bad.any():
            first = int(np.flatnonzero(bad.reshape(len(features), -1).any(axis=1))[0])
            raise ValueError(f"{self.path}: dataset 'features' holds NaN or inf in the row of "
                             f"image id {image_ids[first]}: the cache is damaged; make it again "
                             "with captioner prepare-features")

    def _lookup(self, image_id: int) -> int:
        try:
            return self._row[int(image_id)]
        except KeyError:
            raise KeyError(f"image id {image_id} is not in the feature cache {self.path}") from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> FeatureCache:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_pid"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"FeatureCache({str(self.path)!r}, images={len(self)}, grid={self.grid}, "
            f"channels={self.channels})"
        )


_F16_EXPONENT = np.uint16(0x7C00)  # the exponent bits of an IEEE half


def row_checksum(image_id: int, features: np.ndarray) -> int:
    """The CRC-32 of a cache row: ``image_id`` as a little-endian int64, then the bytes of its
    ``features`` (float16 (H, W, C), C order)."""
    head = zlib.crc32(np.int64(image_id).astype("<i8").tobytes())
    return zlib.crc32(np.ascontiguousarray(features, dtype=np.float16).tobytes(), head)


def _positive_ints(values: Sequence[int], name: str, *, length: int) -> tuple[int, ...]:
    values = tuple(values)
    if len(values) != length or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values
    ):
        raise ValueError(f"{name} must be {length} positive integer(s), got {values!r}")
    return tuple(int(v) for v in values)


def _json_object(value: Mapping[str, Any], name: str) -> str:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    try:
        return json.dumps(dict(value), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} is not JSON-serialisable: {exc}") from exc


_JSON_KINDS = {dict: "object", list: "list"}


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, for a message: "an object", "a list", "a number", ..."""
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string"}[type(value)]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_skipped_sidecar(path: Path, skipped: list[dict[str, Any]]) -> None:
    """Write the skipped-images list atomically, or remove a stale one when none was skipped."""
    if not skipped:
        path.unlink(missing_ok=True)
        return
    with atomic_write(path) as handle:
        json.dump(skipped, handle, indent=1)
        handle.write("\n")


def _image_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"image ids must be integers, got {value!r}")
    return int(value)
