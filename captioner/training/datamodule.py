"""Lightning data for captioning: Karpathy-split JSON plus images, or a feature cache.

Training iterates over image-caption pairs (each of an image's references is one sample, as in
the paper's cross-entropy training); validation and test iterate over images and carry all
their references, so that decoded captions can be scored with BLEU and CIDEr.

Batches are dicts:

- training: ``inputs`` float32 (B, 3, S, S) images or float16 (B, h, w, C) cached grid
  features (half the bytes to copy to a GPU; the model computes in float32); ``captions``
  int64 (B, L) = START, token ids, END, then PAD (0) up to the longest caption. With
  ``preload_features: device`` the loaders' ``inputs`` are int64 (B,) rows of the features held
  on the device, swapped for the features once the batch is there (``on_after_batch_transfer``).
- validation / test: ``inputs`` as above; ``image_ids`` int64 (B,); ``references``: list of B
  lists of reference strings (the Karpathy tokens joined by single spaces).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from functools import cached_property, partial
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import DataLoader, Dataset

from data_prep.features import FeatureCache
from data_prep.images import imagenet_transform, load_image
from data_prep.karpathy import ImageEntry, KarpathyDataset, load_karpathy
from data_prep.machine import usable_cpus
from data_prep.settings_files import check_integers
from data_prep.vocab import Vocabulary, word_counts
from data_prep.wording import counted, first_names

_STAGE_SPLITS = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("test",),
}
_MISSING_SHOWN = 5  # how many missing files or ids an error message lists


class ImageInputs:
    """Reads an entry's image from disk and preprocesses it as in the paper (resize to
    ``image_size`` x ``image_size``, ImageNet normalization) -> float32 (3, S, S)."""

    def __init__(self, image_size: int) -> None:
        self.transform = imagenet_transform(image_size)

    def __call__(self, entry: ImageEntry) -> torch.Tensor:
        return self.transform(load_image(entry.path))

    def many(self, entries) -> torch.Tensor:
        """float32 (N, 3, S, S): each image decoded on its own."""
        return torch.stack([self(entry) for entry in entries])


class CachedFeatureInputs:
    """Reads grid features from a :class:`data_prep.features.FeatureCache` -> float16 (h, w, C)
    per entry, or (N, h, w, C) for a whole batch into one array (:meth:`many`).

    The HDF5 file is opened lazily so that each DataLoader worker holds its own handle.
    :meth:`preload` reads the features of given entries into memory once instead (in the main
    process, before the workers start, so that they share the pages).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._cache: FeatureCache | None = None
        self._memory: np.ndarray | None = None
        self._memory_row: dict[int, int] = {}

    @property
    def cache(self) -> FeatureCache:
        if self._cache is None:
            self._cache = FeatureCache(self.path)
        return self._cache

    def preload(self, entries) -> None:
        """Hold the features of ``entries`` in memory (float16, about h*w*C*2 bytes each)."""
        ids = sorted({entry.image_id for entry in entries} - set(self._memory_row))
        if not ids:
            return
        loaded = np.empty((len(ids), *self.cache.grid, self.cache.channels), dtype=np.float16)
        for start, chunk in read_in_chunks(self.cache, ids):
            loaded[start : start + len(chunk)] = chunk
        if self._memory is not None:
            loaded = np.concatenate([self._memory, loaded])
        offset = len(self._memory_row)
        self._memory_row.update({image_id: offset + row for row, image_id in enumerate(ids)})
        self._memory = loaded

    def many(self, entries) -> torch.Tensor:
        ids = [entry.image_id for entry in entries]
        if self._memory is not None and all(i in self._memory_row for i in ids):
            return torch.from_numpy(self._memory[[self._memory_row[i] for i in ids]])
        return torch.from_numpy(self.cache.get_many(ids))

    def __call__(self, entry: ImageEntry) -> torch.Tensor:
        return self.many([entry])[0]

    def __getstate__(self) -> dict:
        # Spawned workers (and pickles) reopen the file; preloaded features travel along.
        return {**self.__dict__, "_cache": None}


_PRELOAD_CHUNK = 1024  # images per HDF5 read while preloading


def read_in_chunks(cache: FeatureCache, image_ids: list[int]) -> Iterator[tuple[int, np.ndarray]]:
    """(first position, float16 (n, h, w, C) features) of ``image_ids`` in order, read a chunk
    at a time behind a progress bar."""
    from tqdm.auto import tqdm

    with tqdm(total=len(image_ids), desc="preloading features", unit="image",
              disable=len(image_ids) <= _PRELOAD_CHUNK) as bar:
        for start in range(0, len(image_ids), _PRELOAD_CHUNK):
            chunk = cache.get_many(image_ids[start : start + _PRELOAD_CHUNK])
            yield start, chunk
            bar.update(len(chunk))


class DeviceFeatures:
    """The cached features of the splits in use held in one tensor on the training device
    (``preload_features: device``): no features cross the input pipeline at all.

    The loaders carry each image's row in that tensor (:meth:`many`: int64 (N,)) in place of its
    features, and :meth:`gather` swaps the rows of a batch for the features (float16 (N, h, w, C))
    once the batch is on the device. The features are read from the HDF5 file there, straight
    into the device tensor, at the first batch: the device is not known before.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._rows: dict[int, int] = {}
        self._features: torch.Tensor | None = None

    def preload(self, entries) -> None:
        """Give the images of ``entries`` their rows (read at the next :meth:`gather`)."""
        for entry in entries:
            self._rows.setdefault(entry.image_id, len(self._rows))

    def many(self, entries) -> torch.Tensor:
        return torch.tensor([self._rows[entry.image_id] for entry in entries], dtype=torch.long)

    def __call__(self, entry: ImageEntry) -> torch.Tensor:
        return self.many([entry])[0]

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """float16 (N, h, w, C) features of int64 ``rows`` (N,), on the device of ``rows``."""
        if self._features is None or self._features.device != rows.device:
            self._features = self._read(0, rows.device)
        if len(self._features) < len(self._rows):  # rows added since (test after fit)
            self._features = torch.cat([self._features,
                                        self._read(len(self._features), rows.device)])
        return self._features.index_select(0, rows)

    def _read(self, first: int, device: torch.device) -> torch.Tensor:
        """The features of the rows from ``first`` on, read onto ``device``."""
        ids = list(self._rows)[first:]
        with FeatureCache(self.path) as cache:
            shape = (len(ids), *cache.grid, cache.channels)
            _check_device_memory(device, shape, self.path)
            features = torch.empty(shape, dtype=torch.float16, device=device)
            for start, chunk in read_in_chunks(cache, ids):
                features[start : start + len(chunk)] = torch.from_numpy(chunk)
        return features

    def __getstate__(self) -> dict:
        # Workers only look rows up; the device tensor stays in the training process.
        return {**self.__dict__, "_features": None}


def _check_device_memory(device: torch.device, shape: tuple[int, ...], path: Path) -> None:
    """Refuse, in one line, features that would not fit in ``device``'s free memory."""
    if device.type != "cuda":
        return
    needed = int(np.prod(shape)) * 2  # float16
    free, _ = torch.cuda.mem_get_info(device)
    if needed > free:
        raise ValueError(
            f"data.preload_features device: the features of {shape[0]:,} images in {path} need "
            f"{needed / 2**30:.1f} GiB on {device}, which has {free / 2**30:.1f} GiB free; "
            "use data.preload_features true (host memory) or false"
        )


class CaptionPairs(Dataset):
    """One sample per (image, reference caption) pair; a batch is built whole by
    :meth:`__getitems__` (the DataLoader calls it with the sampled indices): the inputs by one
    ``inputs.many`` call, the captions by one slice of an array padded once here, so no Python
    runs per sample in the training loop.

    captions: int64 (pairs, longest) = START, token ids, END, then PAD; lengths: (pairs,).
    """

    def __init__(self, entries, inputs, vocabulary: Vocabulary, max_caption_length: int) -> None:
        self.entries = entries
        self.inputs = inputs
        encoded = [
            [Vocabulary.START_ID, *vocabulary.encode(tokens[:max_caption_length]),
             Vocabulary.END_ID]
            for entry in entries
            for tokens in entry.sentences
        ]
        self.image_index = np.repeat(np.arange(len(entries)),
                                     [len(entry.sentences) for entry in entries])
        self.lengths = np.array([len(caption) for caption in encoded], dtype=np.int64)
        width = int(self.lengths.max(initial=0))
        self.captions = np.full((len(encoded), width), Vocabulary.PAD_ID, dtype=np.int64)
        self.captions[np.arange(width) < self.lengths[:, None]] = np.fromiter(
            itertools.chain.from_iterable(encoded), dtype=np.int64, count=self.lengths.sum())

    def __len__(self) -> int:
        return len(self.image_index)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One pair: the image's inputs and its caption, int64 (length,)."""
        return (self.inputs(self.entries[self.image_index[index]]),
                torch.from_numpy(self.captions[index, : self.lengths[index]]))

    def __getitems__(self, indices: list[int]) -> dict:
        """The training batch of ``indices`` (see the module docstring)."""
        indices = np.asarray(indices, dtype=np.int64)
        entries = [self.entries[image] for image in self.image_index[indices]]
        width = int(self.lengths[indices].max())
        return {"inputs": self.inputs.many(entries),
                "captions": torch.from_numpy(self.captions[indices, :width])}


class CaptionImages(Dataset):
    """One sample per image: (inputs, image id, list of reference strings); a batch is built
    whole by :meth:`__getitems__`, its inputs by one ``inputs.many`` call."""

    def __init__(self, entries, inputs) -> None:
        self.entries = entries
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int):
        entry = self.entries[index]
        return self.inputs(entry), entry.image_id, reference_strings(entry)

    def __getitems__(self, indices: list[int]) -> dict:
        """The validation or test batch of ``indices`` (see the module docstring)."""
        entries = [self.entries[index] for index in indices]
        return {"inputs": self.inputs.many(entries),
                "image_ids": torch.tensor([entry.image_id for entry in entries]),
                "references": [reference_strings(entry) for entry in entries]}


def reference_strings(entry: ImageEntry) -> list[str]:
    """The image's reference captions as the metrics read them: its tokens joined by spaces."""
    return [" ".join(tokens) for tokens in entry.sentences]


def _built_by_getitems(batch: dict) -> dict:
    """The DataLoader's ``collate_fn``: the datasets' ``__getitems__`` built the batch."""
    return batch


# Loader worker processes when the config leaves num_workers null (at most the usable CPUs).
DEFAULT_LOADER_WORKERS = 4


# How long a loader worker outlives a SIGTERM (start_worker).
WORKER_GRACE_S = 3.0


def start_worker(worker_id: int, *, rank: int) -> None:
    """A loader worker's ``worker_init_fn``: SIGTERM and SIGHUP end it only after
    :data:`WORKER_GRACE_S`, and then with status 0.

    ``timeout``, Slurm's ``scancel`` and a closed terminal signal the whole process group: the
    main process stops as by Ctrl-C (``captioner.cli``) and ends its workers itself, but a
    worker that the signal ended made torch raise "DataLoader worker ... is killed by signal"
    in the main process, amid that stop (a traceback, or status 1 and no line saying how to
    resume). Ignored for good, the signal would hang the main process at exit, where
    multiprocessing ends the workers still alive with SIGTERM and waits for them. Then
    Lightning's seeding of the worker where it would add its own (``seed_everything(...,
    workers=True)``, as LightningCLI seeds), ``rank`` being the process's global rank."""
    def end_soon(signum, frame) -> None:
        ending = threading.Timer(WORKER_GRACE_S, os._exit, (0,))
        ending.daemon = True
        ending.start()

    signal.signal(signal.SIGTERM, end_soon)
    signal.signal(signal.SIGHUP, end_soon)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id, rank=rank)


class CaptionDataModule(L.LightningDataModule):
    """Karpathy-split captions with images (``image_root``) or cached features.

    Args:
        karpathy_json: a Karpathy split file (``dataset_coco.json``, ``dataset_flickr30k.json``,
            the synthetic ``dataset_synthetic.json``); "restval" counts as training data.
        image_root: folder the JSON's ``filepath/filename`` are relative to.
        feature_cache: HDF5 file written by ``captioner prepare-features``; when given, batches
            carry cached grid features instead of images (the encoder must be frozen and match
            the cache's encoder, which :class:`~captioner.training.module.CaptioningModule`
            checks).
        min_count: training-token count below which a word maps to ``<unk>``.
        max_caption_length: reference captions are cut to this many tokens for training.
        image_size: images are resized to ``image_size`` x ``image_size`` (paper: 256).
        batch_size: image-caption pairs per training batch.
        eval_batch_size: images per validation / test batch (decoded with beam search).
        num_workers: DataLoader worker processes; None (the default): 4, or fewer where
            fewer CPUs are usable (more would only contend for them, and torch warns about
            them at every epoch), and none with ``preload_features: device``, whose batches
            are index lookups that take the training process less time to make than to
            receive from a worker. Batches of cached features are read into one array each,
            so few workers keep a GPU busy.
        preload_features: read the cached features of the splits in use once instead of
            from the HDF5 file at every batch (float16, h*w*C*2 bytes per image: 32 GB for
            COCO's 123,287 images at 8x8x2048): ``true`` into host memory, ``"device"`` into
            the training device's memory, where each batch's features are gathered by one
            kernel (:class:`DeviceFeatures`; each DDP process holds its own copy).
        pin_memory: page-locked batches for faster, asynchronous copies to a GPU (default:
            when CUDA is available).
    """

    def __init__(
        self,
        karpathy_json: str | Path,
        image_root: str | Path,
        feature_cache: str | Path | None = None,
        min_count: int = 5,
        max_caption_length: int = 20,
        image_size: int = 256,
        batch_size: int = 64,
        eval_batch_size: int = 32,
        num_workers: int | None = None,
        preload_features: bool | Literal["device"] = False,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        # Here, named, rather than by torch's loader in the middle of the fit's start.
        check_integers([
            ("data.min_count", min_count, 1), ("data.max_caption_length", max_caption_length, 1),
            ("data.image_size", image_size, 1), ("data.batch_size", batch_size, 1),
            ("data.eval_batch_size", eval_batch_size, 1),
            ("data.num_workers", 0 if num_workers is None else num_workers, 0),
        ])
        if preload_features not in (False, True, "device"):
            raise ValueError(f"data.preload_features must be false, true or device, "
                             f"got {preload_features!r}")
        if preload_features and feature_cache is None:
            raise ValueError(f"data.preload_features {str(preload_features).lower()} preloads "
                             "cached features: it needs data.feature_cache")
        self.karpathy_json = Path(karpathy_json)
        self.image_root = Path(image_root)
        self.feature_cache = None if feature_cache is None else Path(feature_cache)
        # Plain strings in the hyperparameters keep checkpoints loadable with weights_only=True.
        karpathy_json, image_root = str(self.karpathy_json), str(self.image_root)
        feature_cache = None if self.feature_cache is None else str(self.feature_cache)
        self.save_hyperparameters()
        self.datasets: dict[str, Dataset] = {}
        self._feature_inputs: CachedFeatureInputs | DeviceFeatures | None = None

    @property
    def loader_workers(self) -> int:
        """The loaders' worker processes: ``num_workers``, or its default (see the class)."""
        if self.hparams.num_workers is not None:
            return self.hparams.num_workers
        if self.hparams.preload_features == "device":
            return 0
        return min(DEFAULT_LOADER_WORKERS, usable_cpus())

    @cached_property
    def karpathy(self) -> KarpathyDataset:
        return load_karpathy(self.karpathy_json, self.image_root)

    @cached_property
    def vocabulary(self) -> Vocabulary:
        """Built from the training split's tokens (deterministic, so every process agrees)."""
        train = self.karpathy.split("train")
        if not train:
            raise ValueError(f"{self.karpathy_json}: the training split has no images")
        counts = word_counts(tokens for entry in train for tokens in entry.sentences)
        most = max(counts.values(), default=0)
        if most < self.hparams.min_count:
            # Else the model could only write <unk> (never generated) or end: empty captions.
            raise ValueError(
                f"data.min_count={self.hparams.min_count} leaves no word in the vocabulary: "
                f"the most frequent word of the training captions of {self.karpathy_json} "
                f"occurs {most} times" + (f"; set data.min_count to at most {most}" if most
                                          else "")
            )
        return Vocabulary.from_counts(counts, min_count=self.hparams.min_count)

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    @property
    def cached_features(self) -> FeatureCache | None:
        """The feature cache, with the encoder settings it recorded (None without a cache)."""
        if self.feature_cache is None:
            return None
        return FeatureCache(self.feature_cache)

    def prepare_data(self) -> None:
        # Runs once per node before setup: only checks that the inputs exist, so that a typo
        # in a path fails before any process builds datasets. Nothing is downloaded.
        inputs = ("feature_cache", self.feature_cache) if self.feature_cache else (
            "image_root", self.image_root)
        for key, path in (("karpathy_json", self.karpathy_json), inputs):
            if not path.exists():
                raise FileNotFoundError(f"data.{key}: {path} does not exist")

    def setup(self, stage: str) -> None:
        if stage not in _STAGE_SPLITS:
            raise ValueError(f"unknown stage {stage!r}; expected one of {sorted(_STAGE_SPLITS)}")
        inputs = self._inputs()
        splits = {split: self.karpathy.split(split) for split in _STAGE_SPLITS[stage]
                  if split not in self.datasets}
        for split, entries in splits.items():
            if not entries:
                raise ValueError(f"{self.karpathy_json}: the {split!r} split has no images")
        # Every split of the stage at once: a refusal names all that is missing, not the
        # first split's alone.
        self._check_inputs_exist([entry for entries in splits.values() for entry in entries])
        for split, entries in splits.items():
            if split == "train":
                self.datasets[split] = CaptionPairs(
                    entries, inputs, self.vocabulary, self.hparams.max_caption_length
                )
            else:
                self.datasets[split] = CaptionImages(entries, inputs)
        if self.hparams.preload_features and self.feature_cache is not None:
            # The stage's splits at once: one array, not one grown (and copied) per split.
            inputs.preload(
                [entry for split in _STAGE_SPLITS[stage] for entry in self.datasets[split].entries]
            )

    def _inputs(self):
        if self.feature_cache is None:
            return ImageInputs(self.hparams.image_size)
        if self._feature_inputs is None:  # one reader (and one preload) for every split
            on_device = self.hparams.preload_features == "device"
            self._feature_inputs = (DeviceFeatures if on_device else CachedFeatureInputs)(
                self.feature_cache)
        return self._feature_inputs

    def on_after_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        if isinstance(self._feature_inputs, DeviceFeatures):
            batch["inputs"] = self._feature_inputs.gather(batch["inputs"])
        return batch

    def _check_inputs_exist(self, entries) -> None:
        """Fail before training when an image file is missing or no image, or a cached feature
        is missing."""
        note = ""
        if self.feature_cache is None:
            from data_prep.images import header_problem

            # From the headers, so that an empty or foreign file stops the command before
            # training, not in the middle of an epoch, which would be lost.
            missing = [f"{entry.path} ({problem})" for entry in entries
                       if (problem := header_problem(entry.path))]
            what = f"{counted(len(missing), 'image file')} missing or unusable"
        else:
            from data_prep.karpathy import image_name

            cache = FeatureCache(self.feature_cache)
            absent = [entry for entry in entries if entry.image_id not in cache]
            missing_ids = [entry.image_id for entry in absent]
            missing = [f"{entry.image_id} ({image_name(entry, self.image_root)})"
                       for entry in absent]
            what = (f"{counted(len(missing), 'image')} missing from the feature cache "
                    f"{self.feature_cache} (id and file)")
            skipped = set(cache.skipped_ids).intersection(missing_ids)
            if skipped:
                from data_prep.features import skipped_images_path

                note = (
                    f" ({len(skipped)} of them skipped as unusable images when the cache was "
                    f"made: files and reasons in {skipped_images_path(self.feature_cache)})"
                )
        if missing:
            raise FileNotFoundError(
                f"{self.karpathy_json}: {what}: "
                f"{first_names(missing, _MISSING_SHOWN)}{note}"
            )
        if self.feature_cache is not None:
            self._check_cache_images(entries, cache)

    def _check_cache_images(self, entries, cache: FeatureCache) -> None:
        """Fail when ``cache`` holds other images under these ids: split files that number
        their images alike (``prepare-dataset`` counts from 0) would otherwise train on
        another dataset's features. Caches written before names were recorded pass."""
        from data_prep.karpathy import image_name

        names = cache.image_names()
        if names is None:
            return
        ours = {entry.image_id: image_name(entry, self.image_root) for entry in entries}
        others = [(image_id, names[image_id], name) for image_id, name in ours.items()
                  if names[image_id] != name]
        if others:
            image_id, cached, here = others[0]
            raise ValueError(
                f"feature cache {self.feature_cache} was made from other images than "
                f"{self.karpathy_json}: image id {image_id} is {cached} there and {here} here "
                f"({len(others)} of {len(entries)} ids differ); make a cache of this split file "
                "with captioner prepare-features"
            )

    def _loader(self, split: str, *, train: bool) -> DataLoader:
        if split not in self.datasets:
            raise RuntimeError(f"CaptionDataModule: split {split!r} was not set up")
        pin = self.hparams.pin_memory
        if pin is None:
            pin = torch.cuda.is_available()
        if self.hparams.num_workers is None and self.loader_workers == 0:
            # No workers by choice (see the class): Lightning's advice to add some is not for us.
            warnings.filterwarnings("ignore", message=r"The '\w+' does not have many workers")
        return DataLoader(
            self.datasets[split],
            batch_size=self.hparams.batch_size if train else self.hparams.eval_batch_size,
            shuffle=train,
            drop_last=False,
            num_workers=self.loader_workers,
            # Workers start afresh every epoch, as without workers: each epoch's iterator then
            # draws its shuffle and worker seeds from the global RNG at the same point in an
            # uninterrupted run and in a resumed one (whose loaders are new), so that resuming
            # ends with the same weights. Persistent workers skip those draws after the first
            # epoch, and a resume made them again. The cost: the workers start once per epoch.
            persistent_workers=False,
            pin_memory=pin,
            collate_fn=_built_by_getitems,
            worker_init_fn=partial(start_worker, rank=self.trainer.global_rank
                                   if self.trainer is not None else 0),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)
