"""The model of a training checkpoint in plain torch, for inference: the same settings, checks
and weights as :class:`captioner.training.module.CaptioningModule`, without Lightning (which
takes seconds to import and serves only training)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from captioner.model.caption_model import attention_grid, build_caption_model
from captioner.model.decoding import Hypothesis, decode_captions
from captioner.model.decoding_options import DecodingOptions
from captioner.model.hyperparameters import Hyperparameters, check_settings, model_arguments
from captioner.model.losses import check_output_mapping
from data_prep.vocab import Vocabulary


class CheckpointModel(nn.Module):
    """A captioner built from a checkpoint's hyperparameters (its weights are loaded after).

    Its ``state_dict`` names are the checkpoint's (``model.encoder...``,
    ``model.decoder...``), and it captions as the LightningModule does.

    Args:
        hparams: constructor arguments of ``CaptioningModule``, as
            :func:`captioner.model.hyperparameters.hparams_from_checkpoint` gives them.
        vocabulary: the checkpoint's vocabulary (maps decoded ids to words).

    Raises:
        TypeError: a missing or unexpected argument. ValueError: a setting that builds no
            model, with the message the LightningModule gives. EncoderWeightsError: the
            encoder weights cannot be read.
    """

    def __init__(self, hparams: dict[str, Any], vocabulary: Vocabulary) -> None:
        super().__init__()
        settings = Hyperparameters(**hparams)
        check_output_mapping(settings.output_mapping)  # before anything is built or read
        check_settings(settings.image_size, settings.lr, settings.betas, settings.lr_decay,
                       settings.lr_decay_after, settings.gradient_clip_norm)
        self.decoding = DecodingOptions.coerce(settings.decoding)
        self.hparams = replace(settings, decoding=self.decoding)
        self.model = build_caption_model(**model_arguments(settings))
        self.vocabulary = vocabulary

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def decode(self, features: Tensor, options: DecodingOptions | None = None) -> list[Hypothesis]:
        """Beam-search one caption per image of ``features`` (B, h, w, C) with ``options``
        (default: the checkpoint's own :attr:`decoding`); see
        :func:`captioner.model.decoding.decode_captions`."""
        return decode_captions(self.model.decoder, features, options or self.decoding,
                               self.hparams.output_mapping)

    def grid(self) -> tuple[int, int]:
        """(h, w) of the attention maps at the training image size."""
        return attention_grid(self.model.encoder, self.hparams.image_size, self.device)

    def words(self, token_ids) -> list[str]:
        """The words of a decoded hypothesis, one per id (so they align with its attention)."""
        return [self.vocabulary.itos[int(index)] for index in token_ids]
