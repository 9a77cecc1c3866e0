"""Caption images with a trained checkpoint and get the per-word attention maps.

    >>> captioner = Captioner.load("runs/coco_tvmax/version_0/checkpoints/best.ckpt")
    >>> [caption] = captioner.caption(["photo.jpg"])    # the checkpoint's decoding options
    >>> caption.text, caption.attention.shape          # ('a red circle ...', (T, 8, 8))

A checkpoint is self-contained: its hyperparameters rebuild the model, its state dict holds
every weight (the encoder included, even when training read cached features) and its
vocabulary maps ids back to words. Every checkpoint that captioner writes loads here, whoever
wrote it: ``captioner fit`` (LightningCLI adds bookkeeping keys to the hyperparameters, which
are dropped), the demo, and earlier versions (whose ``beam_size`` / ``max_length``
hyperparameters become the decoding options). It is read as untrusted data
(:mod:`captioner.checkpointing`), and its model is built in plain torch
(:mod:`captioner.inference.checkpoint_model`): captioning imports no Lightning.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from PIL import Image
from torch import Tensor
from tqdm.auto import tqdm

from captioner.checkpointing import (
    HYPERPARAMETERS_KEY,
    VOCABULARY_KEY,
    CheckpointError,
    load_safely,
    nonfinite_weights,
    stored_vocabulary,
    weights_mismatch,
)
from captioner.features.cache_check import check_feature_cache, model_settings
from captioner.inference.checkpoint_model import CheckpointModel
from captioner.inference.image_files import ImageResult, load_images
from captioner.model.decoding_options import DecodingOptions
from captioner.model.devices import resolve_device
from captioner.model.encoder import EncoderWeightsError
from captioner.model.frozen_encoder import (
    missing_weights_problem,
    put_back_encoder,
    recorded_weights,
)
from captioner.model.hyperparameters import hparams_from_checkpoint
from data_prep.images import imagenet_transform, load_image
from data_prep.vocab import Vocabulary
from data_prep.wording import first_names

if TYPE_CHECKING:
    from data_prep.features import FeatureCache



class IncompatibleCheckpointError(CheckpointError):
    """A checkpoint that this version of captioner cannot turn into a captioner."""


@dataclass
class Caption:
    """One decoded caption.

    text: the words joined by spaces; tokens: the words (no start/end token);
    attention: float32 (T, h, w) output attention, one map per word of ``tokens``;
    input_attention: float32 (T, h, w); log_prob: the hypothesis' log-probability;
    source: the image's path, or ``"<image N>"`` for an in-memory image (N = its position).
    """

    text: str
    tokens: list[str]
    attention: Tensor
    input_attention: Tensor
    log_prob: float
    source: str


class Captioner:
    """A trained captioner ready for inference (eval mode, no gradients)."""

    def __init__(
        self, module: CheckpointModel, vocabulary: Vocabulary, checkpoint: Path | None = None
    ) -> None:
        self.module = module.eval()
        self.vocabulary = vocabulary
        self.checkpoint = checkpoint  # the file it was loaded from, if any
        self.transform = imagenet_transform(module.hparams.image_size)

    @property
    def output_attention_name(self) -> str:
        return self.module.hparams.output_attention

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w) of the attention maps for the training image size."""
        return self.module.grid()

    @property
    def decoding(self) -> DecodingOptions:
        """The checkpoint's own decoding options (the default of :meth:`caption`)."""
        return self.module.decoding

    @classmethod
    def load(cls, checkpoint_path: str | Path, map_location: str | torch.device = "cpu"):
        """Rebuild the model of a ``CaptioningModule`` checkpoint, in plain torch
        (:class:`captioner.inference.checkpoint_model.CheckpointModel`).

        Raises:
            FileNotFoundError: no such file.
            CheckpointError: not a readable checkpoint (see
                :func:`captioner.checkpointing.load_safely`); its subclass
                IncompatibleCheckpointError: not a captioner checkpoint, or hyperparameters /
                weights that do not fit this version's model (the message says which).
        """
        path = Path(checkpoint_path)
        checkpoint = load_safely(path, map_location=map_location)
        for key in (HYPERPARAMETERS_KEY, "state_dict", VOCABULARY_KEY):
            if key not in checkpoint:
                raise IncompatibleCheckpointError(
                    f"{path}: no {key!r} entry; not a checkpoint written by captioner training"
                )
        try:
            hparams = hparams_from_checkpoint(checkpoint[HYPERPARAMETERS_KEY], path)
            vocabulary = stored_vocabulary(checkpoint, hparams, path)
        except CheckpointError as exc:
            raise IncompatibleCheckpointError(str(exc)) from None
        # A self-contained checkpoint holds every weight: the pretrained encoder weights are
        # not fetched again (they may be unavailable offline, or a file on another machine).
        # One of a frozen encoder names the weights to build it from
        # (captioner.model.frozen_encoder).
        problem = missing_weights_problem(checkpoint, path)
        if problem is not None:
            raise IncompatibleCheckpointError(problem)
        hparams["encoder_weights"] = recorded_weights(checkpoint, path)
        try:
            module = CheckpointModel(hparams, vocabulary)
        except EncoderWeightsError as exc:
            raise IncompatibleCheckpointError(f"{path}: its frozen encoder: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise IncompatibleCheckpointError(
                f"{path}: its hyperparameters do not fit this version of captioner: {exc}"
            ) from exc
        put_back_encoder(checkpoint, module.model.encoder, path)
        problem = weights_mismatch(module.state_dict(), checkpoint["state_dict"])
        if problem is not None:
            raise IncompatibleCheckpointError(
                f"{path}: weights do not fit the model built from its hyperparameters: {problem}"
            )
        nonfinite = nonfinite_weights(checkpoint["state_dict"])
        if nonfinite:
            raise IncompatibleCheckpointError(
                f"{path}: its weights hold NaN or inf ({first_names(nonfinite, 3)})")
        module.load_state_dict(checkpoint["state_dict"], strict=True)
        return cls(module.to(map_location), vocabulary, path)

    def _batch(self, images: Sequence) -> Tensor:
        tensors = [
            self.transform(load_image(item) if isinstance(item, (str, Path)) else _rgb(item))
            for item in images
        ]
        return torch.stack(tensors).to(self.module.device)

    @torch.no_grad()
    def caption(
        self,
        images: Sequence[str | Path | Image.Image],
        options: DecodingOptions | None = None,
        *,
        batch_size: int = 16,
        progress: bool = False,
    ) -> list[Caption]:
        """Beam-search one caption per image, in input order, with ``options`` (default: the
        checkpoint's own :attr:`decoding`).

        ``images``: file paths or PIL images. An unreadable file raises
        :class:`data_prep.images.ImageLoadError` naming it.
        """
        def encoded(chunk: list, start: int) -> tuple[Tensor, list[str]]:
            sources = [str(item) if isinstance(item, (str, Path)) else f"<image {start + k}>"
                       for k, item in enumerate(chunk)]
            return self.module.model.encoder(self._batch(chunk)), sources

        return self._in_batches(list(images), encoded, options, batch_size, progress)

    @torch.no_grad()
    def caption_cached(
        self,
        cache: FeatureCache,
        image_ids: Sequence[int],
        options: DecodingOptions | None = None,
        *,
        batch_size: int = 16,
        progress: bool = False,
    ) -> list[Caption]:
        """:meth:`caption` of images by their features in ``cache`` (float16 (h, w, C) rows of
        this checkpoint's frozen encoder; see :func:`cache_problem`), in ``image_ids`` order:
        no image is read or encoded. Each caption's ``source`` is ``image id N``."""
        def cached(chunk: list, start: int) -> tuple[Tensor, list[str]]:
            rows = torch.from_numpy(cache.get_many(chunk))
            return (rows.to(device=self.module.device, dtype=torch.float32),
                    [f"image id {i}" for i in chunk])

        return self._in_batches(list(image_ids), cached, options, batch_size, progress)

    def _in_batches(self, items: list, features_of, options: DecodingOptions | None,
                    batch_size: int, progress: bool) -> list[Caption]:
        """The captions of ``items``, ``batch_size`` at a time: ``features_of(chunk, start)``
        gives a chunk's features (B, h, w, C) and the names of its images."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        captions: list[Caption] = []
        starts = range(0, len(items), batch_size)
        for start in tqdm(starts, desc="captioning", unit="batch", disable=not progress):
            features, sources = features_of(items[start : start + batch_size], start)
            captions += self._captions(features, options, sources)
        return captions

    def _captions(self, features: Tensor, options: DecodingOptions | None,
                  sources: Sequence[str]) -> list[Caption]:
        """The captions of encoded images ``features`` (B, h, w, C), named by ``sources``."""
        hypotheses = self.module.decode(features, options)
        captions = []
        for source, hypothesis in zip(sources, hypotheses, strict=True):
            tokens = self.module.words(hypothesis.token_ids)
            captions.append(Caption(
                text=" ".join(tokens),
                tokens=tokens,
                attention=hypothesis.output_attention.float().cpu(),
                input_attention=hypothesis.input_attention.float().cpu(),
                log_prob=float(hypothesis.log_prob),
                source=source,
            ))
        return captions

    def cache_problem(self, cache: FeatureCache, image_ids: Sequence[int]) -> str | None:
        """Why ``cache`` cannot stand in for this checkpoint's encoder on ``image_ids``, in
        one line, or None: the encoder must be the frozen one that wrote it (architecture,
        weights, layer, image size: :func:`captioner.features.cache_check.check_feature_cache`)
        and every image must be in it."""
        settings = model_settings(self.module.hparams, self.module.model.encoder.weights_source)
        try:
            check_feature_cache(settings, cache, advice=False)
        except ValueError as exc:
            return str(exc)
        missing = [i for i in image_ids if i not in cache]
        if missing:
            return f"{cache.path} lacks {len(missing)} of the {len(image_ids)} images"
        return None

    def caption_files(
        self,
        paths: Sequence[Path],
        options: DecodingOptions | None = None,
        *,
        batch_size: int = 16,
        progress: bool = False,
    ) -> Iterator[tuple[ImageResult, Caption | None]]:
        """Caption image files batch by batch, in input order: yields each file's
        :class:`captioner.inference.image_files.ImageResult` with its caption, or None when the file
        could not be read (the result says why); one unreadable file stops nothing."""
        with tqdm(total=len(paths), desc="captioning", unit="image", disable=not progress,
                  file=sys.stderr) as bar:
            for start in range(0, len(paths), batch_size):
                results = load_images(paths[start : start + batch_size])
                readable = [r for r in results if r.image is not None]
                captions = iter(
                    self.caption([r.image for r in readable], options, batch_size=batch_size)
                )
                for result in results:
                    yield result, (next(captions) if result.image is not None else None)
                bar.update(len(results))


def open_captioner(checkpoint: str | Path, device: str | None = None) -> Captioner:
    """:meth:`Captioner.load` on ``device`` (see :func:`resolve_device`).

    Raises:
        ValueError: an unknown device, or a checkpoint that cannot be loaded (the message names
            the file and the reason).
    """
    map_location = resolve_device(device)
    try:
        return Captioner.load(checkpoint, map_location=map_location)
    except (CheckpointError, FileNotFoundError):
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{checkpoint}: cannot load the checkpoint: {exc}") from exc


def jsonl_record(path: Path, caption: Caption, mapping: str) -> dict:
    """The ``captioner caption --format jsonl`` record of one caption: image, caption, tokens,
    log_prob, mapping, grid [h, w] and attention (T x h x w nested lists)."""
    attention = caption.attention.detach().float().cpu()
    return {
        "image": str(path), "caption": caption.text, "tokens": list(caption.tokens),
        "log_prob": float(caption.log_prob), "mapping": mapping,
        "grid": list(attention.shape[1:]), "attention": attention.tolist(),
    }


def _rgb(image: Image.Image) -> Image.Image:
    if not isinstance(image, Image.Image):
        raise TypeError(f"images must be paths or PIL images, got {type(image).__name__}")
    return image.convert("RGB")
