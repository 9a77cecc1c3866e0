"""HDF5 cache of encoder grid features, keyed by image id.

With a frozen encoder the ResNet runs once per image (``captioner prepare-features``) and
training reads the (H, W, C) grid of each image from this file: float16, 8x8x2048 = 256 KiB per
image for the paper's ResNet at 256 px. Layout of the file:

* ``features``: float16 (N, H, W, C), chunked one image per chunk;
* ``image_ids``: int64 (N,), row i of ``features`` belongs to ``image_ids[i]``;
* attributes ``format``, ``version``, ``grid`` (H, W), ``channels`` (C) and ``encoder``
  (a JSON object describing the encoder that produced the features, e.g. arch, weights, image
  size), so that a cache made by another encoder is detected instead of silently used.

The writer fills a temporary file beside the destination and renames it over the destination
only when its ``with`` block ends without an exception, so an interrupted run never leaves a
truncated cache behind.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

_FORMAT = "captioner.feature-cache"
_VERSION = 1


class FeatureCacheWriter:
    """Write a feature cache; use as a context manager and call :meth:`add` per batch.

    Args:
        path: destination ``.h5`` file (replaced atomically on success).
        grid: (H, W) of the feature grid.
        channels: C, the feature size per grid cell.
        encoder: JSON-serialisable description of the encoder, stored in the file.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        grid: tuple[int, int],
        channels: int,
        encoder: Mapping[str, Any],
    ):
        self.path = Path(path)
        self.grid = _positive_ints(grid, "grid", length=2)
        (self.channels,) = _positive_ints((channels,), "channels", length=1)
        if not isinstance(encoder, Mapping):
            raise TypeError(f"encoder must be a dict, got {type(encoder).__name__}")
        try:
            self._encoder_json = json.dumps(dict(encoder), sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"encoder description is not JSON-serialisable: {exc}") from exc
        self._temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._file = None
        self._ids: set[int] = set()

    def __enter__(self) -> FeatureCacheWriter:
        import h5py

        if self._file is not None:
            raise RuntimeError(f"feature cache writer for {self.path} is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        height, width = self.grid
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
        shape = (0, height, width, self.channels)
        self._file.create_dataset(
            "features",
            shape=shape,
            maxshape=(None, *shape[1:]),
            dtype=np.float16,
            chunks=(1, *shape[1:]),
        )
        self._file.create_dataset("image_ids", shape=(0,), maxshape=(None,), dtype=np.int64)
        return self

    def add(self, image_ids: Sequence[int], feats: np.ndarray) -> None:
        """Append features ``feats`` (N, H, W, C), floating point (stored as float16, must be
        finite after the cast) of the images ``image_ids`` (N distinct ints, new to the file)."""
        if self._file is None:
            raise RuntimeError("FeatureCacheWriter.add must be called inside its 'with' block")
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
        counts = Counter(ids)
        duplicates = sorted(i for i, n in counts.items() if n > 1 or i in self._ids)
        if duplicates:
            raise ValueError(f"image ids already written to {self.path}: {duplicates[:10]}")
        with np.errstate(over="ignore"):  # overflow is reported below, naming the images
            half = feats.astype(np.float16)
        finite = np.isfinite(half).reshape(len(ids), -1).all(axis=1)
        if not finite.all():
            bad = [ids[i] for i in np.flatnonzero(~finite)]
            raise ValueError(
                f"features of image ids {bad[:10]} are not finite in float16 (NaN, inf, or "
                f"beyond +-65504)"
            )
        start = len(self._ids)
        features, stored_ids = self._file["features"], self._file["image_ids"]
        features.resize(start + len(ids), axis=0)
        stored_ids.resize(start + len(ids), axis=0)
        features[start:] = half
        stored_ids[start:] = np.array(ids, dtype=np.int64)
        self._ids.update(ids)

    def __exit__(self, exc_type, exc, traceback) -> None:
        file, self._file = self._file, None
        try:
            file.close()
            if exc_type is None:
                os.replace(self._temporary, self.path)
        finally:
            self._temporary.unlink(missing_ok=True)


class FeatureCache:
    """Read-only access to a cache written by :class:`FeatureCacheWriter`.

    The HDF5 file is opened lazily in each process, so instances can be handed to DataLoader
    worker processes.
    """

    def __init__(self, path: str | Path):
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"feature cache not found: {self.path}")
        try:
            with h5py.File(self.path, "r") as file:
                self._check_format(file)
                self.encoder: dict[str, Any] = json.loads(file.attrs["encoder"])
                self.grid: tuple[int, int] = tuple(int(v) for v in file.attrs["grid"])
                self.channels = int(file.attrs["channels"])
                ids = file["image_ids"][:]
        except OSError as exc:
            raise ValueError(f"{self.path}: not a readable HDF5 feature cache ({exc})") from exc
        self._row = {int(image_id): row for row, image_id in enumerate(ids)}
        self._file = None
        self._pid = None

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
        return self._features()[self._lookup(image_id)]

    def get_many(self, image_ids: Sequence[int]) -> np.ndarray:
        """Features of several images in the given order, float16 (N, H, W, C), read with one
        HDF5 selection."""
        rows = np.array([self._lookup(i) for i in image_ids], dtype=np.int64)
        if rows.size == 0:
            return np.zeros((0, *self.grid, self.channels), dtype=np.float16)
        # HDF5 needs increasing, unique indices.
        unique, inverse = np.unique(rows, return_inverse=True)
        return self._features()[unique][inverse]

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


def _positive_ints(values: Sequence[int], name: str, *, length: int) -> tuple[int, ...]:
    values = tuple(values)
    if len(values) != length or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values
    ):
        raise ValueError(f"{name} must be {length} positive integer(s), got {values!r}")
    return tuple(int(v) for v in values)


def _image_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"image ids must be integers, got {value!r}")
    return int(value)
