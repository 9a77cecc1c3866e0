"""Caption images with a trained checkpoint and get the per-word attention maps.

    >>> captioner = Captioner.load("runs/tvmax/best.ckpt")
    >>> [caption] = captioner.caption(["photo.jpg"], beam_size=3)
    >>> caption.text, caption.attention.shape          # ('a red circle ...', (T, 8, 8))

A checkpoint is self-contained: its hyperparameters rebuild the model, its state dict holds
every weight (the encoder included, even when training read cached features) and its
vocabulary maps ids back to words. It is read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor
from tqdm.auto import tqdm

from captioner.checkpointing import load_safely
from captioner.lightning_module import VOCABULARY_KEY, CaptioningModule
from data_prep.images import imagenet_transform, load_image
from data_prep.vocab import Vocabulary

_HPARAMS_KEY = CaptioningModule.CHECKPOINT_HYPER_PARAMS_KEY


def resolve_device(name: str | None = None) -> torch.device:
    """The torch device ``name``, or CUDA when available (else the CPU) for None.

    Raises:
        ValueError: an unknown device name, or a CUDA device on a machine without one.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: {exc}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


class IncompatibleCheckpointError(ValueError):
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

    def __init__(self, module: CaptioningModule, vocabulary: Vocabulary) -> None:
        self.module = module.eval()
        self.vocabulary = vocabulary
        self.transform = imagenet_transform(module.hparams.image_size)

    @property
    def output_attention_name(self) -> str:
        return self.module.hparams.output_attention

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w) of the attention maps for the training image size."""
        size = self.module.hparams.image_size
        probe = torch.zeros(1, 3, size, size, device=self.module.device)
        with torch.no_grad():
            return tuple(self.module.model.encoder(probe).shape[1:3])

    @classmethod
    def load(cls, checkpoint_path: str | Path, map_location: str | torch.device = "cpu"):
        """Rebuild the model of a ``CaptioningModule`` checkpoint.

        Raises:
            FileNotFoundError: no such file.
            IncompatibleCheckpointError: not a captioner checkpoint, or hyperparameters / weights
                that do not fit this version's model (the message says which).
        """
        path = Path(checkpoint_path)
        checkpoint = load_safely(path, map_location=map_location)
        for key in (_HPARAMS_KEY, "state_dict", VOCABULARY_KEY):
            if key not in checkpoint:
                raise IncompatibleCheckpointError(
                    f"{path}: no {key!r} entry; not a checkpoint written by captioner training"
                )
        hparams = dict(checkpoint[_HPARAMS_KEY])
        # Every weight is in the state dict: do not fetch the pretrained encoder weights again
        # (they may be unavailable offline, or a local file on another machine).
        hparams["encoder_weights"] = None
        try:
            vocabulary = Vocabulary.from_dict(checkpoint[VOCABULARY_KEY])
            module = CaptioningModule(**hparams)
        except (TypeError, ValueError) as exc:
            raise IncompatibleCheckpointError(
                f"{path}: its hyperparameters do not fit this version of captioner: {exc}"
            ) from exc
        if len(vocabulary) != hparams.get("vocab_size"):
            raise IncompatibleCheckpointError(
                f"{path}: vocabulary has {len(vocabulary)} words but vocab_size is "
                f"{hparams.get('vocab_size')}"
            )
        try:
            module.load_state_dict(checkpoint["state_dict"], strict=True)
        except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
            raise IncompatibleCheckpointError(
                f"{path}: weights do not fit the model built from its hyperparameters: {exc}"
            ) from exc
        module.vocabulary = vocabulary
        return cls(module.to(map_location), vocabulary)

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
        *,
        beam_size: int = 3,
        max_length: int = 20,
        batch_size: int = 16,
        progress: bool = False,
    ) -> list[Caption]:
        """Beam-search one caption per image, in input order.

        ``images``: file paths or PIL images. An unreadable file raises
        :class:`data_prep.images.ImageLoadError` naming it.
        """
        if beam_size < 1 or max_length < 1 or batch_size < 1:
            raise ValueError(
                f"beam_size, max_length and batch_size must be >= 1, got {beam_size}, "
                f"{max_length}, {batch_size}"
            )
        images = list(images)
        captions: list[Caption] = []
        starts = range(0, len(images), batch_size)
        for start in tqdm(starts, desc="captioning", unit="batch", disable=not progress):
            chunk = images[start : start + batch_size]
            features = self.module.model.encoder(self._batch(chunk))
            hypotheses = self.module.decode(features, beam_size=beam_size, max_length=max_length)
            for offset, (item, hypothesis) in enumerate(zip(chunk, hypotheses, strict=True)):
                tokens = self.module.words(hypothesis.token_ids)
                source = str(item) if isinstance(item, (str, Path)) else f"<image {start + offset}>"
                captions.append(
                    Caption(
                        text=" ".join(tokens),
                        tokens=tokens,
                        attention=hypothesis.output_attention.float().cpu(),
                        input_attention=hypothesis.input_attention.float().cpu(),
                        log_prob=float(hypothesis.log_prob),
                        source=source,
                    )
                )
        return captions


def _rgb(image: Image.Image) -> Image.Image:
    if not isinstance(image, Image.Image):
        raise TypeError(f"images must be paths or PIL images, got {type(image).__name__}")
    return image.convert("RGB")
