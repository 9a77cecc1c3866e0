"""Captioning model: ResNet grid encoder and LSTM decoder with input/output visual attention."""

from captioner.model.additive_attention import AdditiveAttention
from captioner.model.caption_model import CaptionModel
from captioner.model.decoder import (
    AttentionDecoder,
    DecoderOutput,
    DecoderState,
    EncodedImages,
    StepOutput,
)
from captioner.model.encoder import (
    ARCHITECTURES,
    LAYERS,
    EncoderWeightsError,
    GridEncoder,
    build_encoder,
)

__all__ = [
    "ARCHITECTURES",
    "AdditiveAttention",
    "AttentionDecoder",
    "CaptionModel",
    "DecoderOutput",
    "DecoderState",
    "EncodedImages",
    "EncoderWeightsError",
    "GridEncoder",
    "LAYERS",
    "StepOutput",
    "build_encoder",
]
