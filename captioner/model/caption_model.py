"""The full captioner: grid encoder + attention decoder (TVmax paper, Sec. 3, Fig. 2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from captioner.model.decoder import AttentionDecoder, DecoderOutput
from captioner.model.encoder import GridEncoder, build_encoder


class CaptionModel(nn.Module):
    """Encoder and decoder; runs on images or on cached grid features.

    Args:
        encoder: a :class:`GridEncoder`, or ``None`` when the model only ever sees cached
            features (a frozen encoder whose output was stored by ``prepare-features``).
        decoder: the :class:`AttentionDecoder`; its ``feature_channels`` must equal the
            encoder's ``channels``.
    """

    def __init__(self, encoder: GridEncoder | None, decoder: AttentionDecoder):
        super().__init__()
        if encoder is not None and encoder.channels != decoder.feature_channels:
            raise ValueError(
                f"encoder {encoder.arch} gives {encoder.channels} channels but the decoder "
                f"expects feature_channels={decoder.feature_channels}"
            )
        self.encoder = encoder
        self.decoder = decoder

    def features(self, inputs: Tensor) -> Tensor:
        """Grid features ``(B, H, W, C)`` float32 from images or cached features.

        Args:
            inputs: images ``(B, 3, H, W)`` float, or cached features ``(B, h, w, C)``
                (float16 from the cache is promoted to float32).
        """
        channels = self.decoder.feature_channels
        if inputs.dim() != 4 or (inputs.shape[1] != 3 and inputs.shape[-1] != channels):
            raise ValueError(
                f"CaptionModel expects images (B, 3, H, W) or cached features "
                f"(B, h, w, {channels}), got shape {tuple(inputs.shape)}"
            )
        # (B, 3, X, channels) fits both layouts. ResNets downsample by 32, so a grid dimension
        # X >= 32 would need an image over 1000 pixels wide: such a tensor is an image batch.
        if inputs.shape[1] == 3 and (inputs.shape[-1] != channels or inputs.shape[2] >= 32):
            if self.encoder is None:
                raise ValueError(
                    "CaptionModel was built without an encoder and got images of shape "
                    f"{tuple(inputs.shape)}; pass cached features (B, h, w, {channels})"
                )
            return self.encoder(inputs)
        return inputs.float()

    def forward(self, inputs: Tensor, captions: Tensor) -> DecoderOutput:
        """Teacher-forced decoding of ``captions`` ``(B, L)`` long; see AttentionDecoder.forward."""
        return self.decoder(self.features(inputs), captions)


def build_caption_model(
    vocab_size: int, *, encoder_arch: str, encoder_weights: str | None, encoder_trainable: bool,
    encoder_layer: str, input_attention: str, input_attention_kwargs: dict[str, Any] | None,
    output_attention: str, output_attention_kwargs: dict[str, Any] | None, feature_dim: int,
    embed_dim: int, hidden_dim: int, attention_dim: int, dropout: float,
) -> CaptionModel:
    """The captioner of these settings (see
    :class:`captioner.training.module.CaptioningModule`): :func:`build_encoder`'s ResNet and an
    :class:`AttentionDecoder` over its channels.

    Raises:
        EncoderWeightsError: the encoder weights cannot be read. ValueError: a setting that
            builds no model (an unknown attention mapping, ...).
    """
    encoder = build_encoder(
        encoder_arch, weights=encoder_weights, trainable=encoder_trainable, layer=encoder_layer
    )
    decoder = AttentionDecoder(
        vocab_size,
        encoder.channels,
        feature_dim=feature_dim,
        embed_dim=embed_dim,
        hidden_dim=hidden_dim,
        attention_dim=attention_dim,
        input_attention=input_attention,
        input_attention_kwargs=input_attention_kwargs,
        output_attention=output_attention,
        output_attention_kwargs=output_attention_kwargs,
        dropout=dropout,
    )
    return CaptionModel(encoder, decoder)


def attention_grid(encoder: GridEncoder, image_size: int, device: torch.device | str
                   ) -> tuple[int, int]:
    """(h, w) of the attention maps of ``encoder`` for square images of ``image_size``."""
    probe = torch.zeros(1, 3, image_size, image_size, device=device)
    training = encoder.training
    # In eval mode: a trainable encoder in train mode would fold the probe into its
    # batch-norm statistics.
    encoder.eval()
    try:
        with torch.no_grad():
            return tuple(encoder(probe).shape[1:3])
    finally:
        encoder.train(training)
