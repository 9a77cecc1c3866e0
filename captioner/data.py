"""Lightning data for captioning: Karpathy-split JSON plus images, or a feature cache.

Training iterates over image-caption pairs (each of an image's references is one sample, as in
the paper's cross-entropy training); validation and test iterate over images and carry all
their references, so that decoded captions can be scored with BLEU and CIDEr.

Batches are dicts:

- training: ``inputs`` float32 (B, 3, S, S) images or (B, h, w, C) cached grid features;
  ``captions`` int64 (B, L) = START, token ids, END, then PAD (0) up to the longest caption.
- validation / test: ``inputs`` as above; ``image_ids`` int64 (B,); ``references``: list of B
  lists of reference strings (the Karpathy tokens joined by single spaces).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data_prep.features import FeatureCache
from data_prep.images import imagenet_transform, load_image
from data_prep.karpathy import ImageEntry, KarpathyDataset, load_karpathy
from data_prep.vocab import Vocabulary

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


class CachedFeatureInputs:
    """Reads an entry's grid features from a :class:`data_prep.features.FeatureCache`
    -> float16 (h, w, C). The HDF5 file is opened lazily so that each DataLoader worker holds
    its own handle."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._cache: FeatureCache | None = None

    def __call__(self, entry: ImageEntry) -> torch.Tensor:
        if self._cache is None:
            self._cache = FeatureCache(self.path)
        return torch.from_numpy(np.asarray(self._cache.get(entry.image_id)))

    def __getstate__(self) -> dict:
        return {"path": self.path, "_cache": None}


class CaptionPairs(Dataset):
    """One sample per (image, reference caption) pair: (inputs, caption ids with START/END)."""

    def __init__(self, entries, inputs, vocabulary: Vocabulary, max_caption_length: int) -> None:
        self.entries = entries
        self.inputs = inputs
        self.encoded = [
            [
                [Vocabulary.START_ID, *vocabulary.encode(tokens[:max_caption_length]),
                 Vocabulary.END_ID]
                for tokens in entry.sentences
            ]
            for entry in entries
        ]
        counts = np.array([len(captions) for captions in self.encoded])
        self.image_index = np.repeat(np.arange(len(entries)), counts)
        self.caption_index = np.concatenate([np.arange(n) for n in counts]) if len(counts) else []

    def __len__(self) -> int:
        return len(self.image_index)

    def __getitem__(self, index: int):
        image, caption = int(self.image_index[index]), int(self.caption_index[index])
        return self.inputs(self.entries[image]), self.encoded[image][caption]


class CaptionImages(Dataset):
    """One sample per image: (inputs, image id, list of reference strings)."""

    def __init__(self, entries, inputs) -> None:
        self.entries = entries
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int):
        entry = self.entries[index]
        references = [" ".join(tokens) for tokens in entry.sentences]
        return self.inputs(entry), entry.image_id, references


def collate_pairs(samples) -> dict:
    inputs, captions = zip(*samples, strict=True)
    padded = torch.full((len(captions), max(map(len, captions))), Vocabulary.PAD_ID)
    for row, caption in enumerate(captions):
        padded[row, : len(caption)] = torch.tensor(caption)
    return {"inputs": torch.stack(inputs).float(), "captions": padded}


def collate_images(samples) -> dict:
    inputs, image_ids, references = zip(*samples, strict=True)
    return {
        "inputs": torch.stack(inputs).float(),
        "image_ids": torch.tensor(image_ids, dtype=torch.long),
        "references": list(references),
    }


class CaptionDataModule(L.LightningDataModule):
    """Karpathy-split captions with images (``image_root``) or cached features.

    Args:
        karpathy_json: a Karpathy split file (``dataset_coco.json``, ``dataset_flickr30k.json``,
            the synthetic ``dataset_synthetic.json``); "restval" counts as training data.
        image_root: folder the JSON's ``filepath/filename`` are relative to.
        feature_cache: HDF5 file written by ``captioner prepare-features``; when given, batches
            carry cached grid features instead of images (the encoder must be frozen and match
            the cache's encoder, which :class:`~captioner.lightning_module.CaptioningModule`
            checks).
        min_count: training-token count below which a word maps to ``<unk>``.
        max_caption_length: reference captions are cut to this many tokens for training.
        image_size: images are resized to ``image_size`` x ``image_size`` (paper: 256).
        batch_size: image-caption pairs per training batch.
        eval_batch_size: images per validation / test batch (decoded with beam search).
        num_workers: DataLoader worker processes.
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
        num_workers: int = 4,
    ) -> None:
        super().__init__()
        self.karpathy_json = Path(karpathy_json)
        self.image_root = Path(image_root)
        self.feature_cache = None if feature_cache is None else Path(feature_cache)
        # Plain strings in the hyperparameters keep checkpoints loadable with weights_only=True.
        karpathy_json, image_root = str(self.karpathy_json), str(self.image_root)
        feature_cache = None if self.feature_cache is None else str(self.feature_cache)
        self.save_hyperparameters()
        self.datasets: dict[str, Dataset] = {}

    @cached_property
    def karpathy(self) -> KarpathyDataset:
        return load_karpathy(self.karpathy_json, self.image_root)

    @cached_property
    def vocabulary(self) -> Vocabulary:
        """Built from the training split's tokens (deterministic, so every process agrees)."""
        train = self.karpathy.split("train")
        if not train:
            raise ValueError(f"{self.karpathy_json}: the training split has no images")
        return Vocabulary.build(
            (tokens for entry in train for tokens in entry.sentences),
            min_count=self.hparams.min_count,
        )

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    @property
    def feature_encoder(self) -> dict | None:
        """The encoder configuration recorded in the feature cache (None without a cache)."""
        if self.feature_cache is None:
            return None
        return FeatureCache(self.feature_cache).encoder

    def prepare_data(self) -> None:
        # Runs once per node before setup: only checks that the inputs exist, so that a typo
        # in a path fails before any process builds datasets. Nothing is downloaded.
        for path in (self.karpathy_json, self.feature_cache or self.image_root):
            if not path.exists():
                raise FileNotFoundError(f"{path} does not exist")

    def setup(self, stage: str) -> None:
        if stage not in _STAGE_SPLITS:
            raise ValueError(f"unknown stage {stage!r}; expected one of {sorted(_STAGE_SPLITS)}")
        inputs = self._inputs()
        for split in _STAGE_SPLITS[stage]:
            if split in self.datasets:
                continue
            entries = self.karpathy.split(split)
            if not entries:
                raise ValueError(f"{self.karpathy_json}: the {split!r} split has no images")
            self._check_inputs_exist(entries)
            if split == "train":
                self.datasets[split] = CaptionPairs(
                    entries, inputs, self.vocabulary, self.hparams.max_caption_length
                )
            else:
                self.datasets[split] = CaptionImages(entries, inputs)

    def _inputs(self):
        if self.feature_cache is None:
            return ImageInputs(self.hparams.image_size)
        return CachedFeatureInputs(self.feature_cache)

    def _check_inputs_exist(self, entries) -> None:
        """Fail before training when an image file or a cached feature is missing."""
        note = ""
        if self.feature_cache is None:
            missing = [str(entry.path) for entry in entries if not entry.path.is_file()]
            what = "image files"
        else:
            cache = FeatureCache(self.feature_cache)
            missing_ids = [entry.image_id for entry in entries if entry.image_id not in cache]
            missing = [str(image_id) for image_id in missing_ids]
            what = f"image ids in the feature cache {self.feature_cache}"
            skipped = set(cache.skipped_ids).intersection(missing_ids)
            if skipped:
                from data_prep.features import skipped_images_path

                note = (
                    f" ({len(skipped)} of them skipped as unusable images when the cache was "
                    f"made: files and reasons in {skipped_images_path(self.feature_cache)})"
                )
        if missing:
            shown = ", ".join(missing[:_MISSING_SHOWN])
            extra = len(missing) - _MISSING_SHOWN
            more = f" and {extra} more" if extra > 0 else ""
            raise FileNotFoundError(
                f"{self.karpathy_json}: {len(missing)} {what} missing: {shown}{more}{note}"
            )

    def _loader(self, split: str, *, train: bool) -> DataLoader:
        if split not in self.datasets:
            raise RuntimeError(f"CaptionDataModule: split {split!r} was not set up")
        return DataLoader(
            self.datasets[split],
            batch_size=self.hparams.batch_size if train else self.hparams.eval_batch_size,
            shuffle=train,
            drop_last=False,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            collate_fn=collate_pairs if train else collate_images,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)
