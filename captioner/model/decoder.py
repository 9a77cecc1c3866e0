"""LSTM caption decoder with input and output visual attention (TVmax paper, Sec. 3, Fig. 2).

Per step t, with V = [v_1..v_k] the projected grid features (k = H * W, g = feature_dim):

* input attention from h_{t-1}: alpha_t = mapping_in(w^T tanh(W [v_i; h_{t-1}] + b)),
  s_t = V alpha_t;
* LSTM: (h_t, c_t) = LSTMCell([s_t; E y_{t-1}], (h_{t-1}, c_{t-1}));
* output attention from h_t, with its own parameters and mapping: alpha~_t,
  r_t = tanh(affine(V alpha~_t));
* word scores (Eq. 10, before the output mapping): affine(dropout([r_t; h_t])).

The initial state is h_0, c_0 = tanh(affine(mean_i v_i)), as in Show, Attend and Tell (the paper
does not say how it initializes the LSTM). A step is bound by launching GPU kernels, not by
arithmetic, so the recurrence launches few: h_{t-1} meets the LSTM's W_hh and the input
attention's W_h in one matrix product, the words' share of the LSTM's gates (W_ih E y_{t-1} plus
both biases) is computed for every step at once, and the LSTM's pointwise part is torch's fused
cell on a GPU. The output attention and the word scores depend only
on h_t, so with teacher forcing they are computed for all steps at once after the recurrence,
which lets a grid mapping such as TVmax process every (image, step) map in one batched call;
or, where the output mapping solves on the host in a background thread (TVmax with
overlap=True), for every few steps during the recurrence, so that the solves
overlap with the launches of the next steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner import attention
from captioner.model.additive_attention import AdditiveAttention

# Words per background solve of the output attention, where its mapping has one (TVmax's
# host solver with overlap=True): the last group's solve is not overlapped,
# and each group scores its words with its own few kernels.
OVERLAP_WORDS = 4


class DecoderOutput(NamedTuple):
    """Teacher-forced decoder outputs.

    scores: ``(B, L, V)`` word scores; output_attention and input_attention: ``(B, L, H, W)``.
    """

    scores: Tensor
    output_attention: Tensor
    input_attention: Tensor


class RecurrenceWeights(NamedTuple):
    """The weights of the recurrence as it multiplies them, gathered once per pass.

    hidden: ``(4d + a, d)``, the LSTM's W_hh above the input attention's W_h, which both
    multiply h_{t-1}; context: ``(4d, g)`` and words: ``(4d, e)``, the halves of the LSTM's W_ih
    that multiply s_t and E y_{t-1}; bias: ``(4d,)``, b_ih + b_hh. Gates in nn.LSTMCell's order
    (input, forget, cell, output).
    """

    hidden: Tensor
    context: Tensor
    words: Tensor
    bias: Tensor


@dataclass
class EncodedImages:
    """Per-image tensors computed once and reused at every step, and the recurrence's weights.

    values: ``(N, k, g)`` region vectors V; input_keys, output_keys: ``(N, k, a)`` the region
    halves of the two attention score networks; grid: (H, W) with H * W = k.
    """

    values: Tensor
    input_keys: Tensor
    output_keys: Tensor
    grid: tuple[int, int]
    recurrence: RecurrenceWeights

    def index_select(self, index: Tensor) -> EncodedImages:
        """Rows ``index`` (e.g. each image repeated once per beam)."""
        return EncodedImages(
            self.values.index_select(0, index),
            self.input_keys.index_select(0, index),
            self.output_keys.index_select(0, index),
            self.grid,
            self.recurrence,
        )


@dataclass
class DecoderState:
    """LSTM state: hidden and cell, ``(N, hidden_dim)`` each."""

    hidden: Tensor
    cell: Tensor

    def index_select(self, index: Tensor) -> DecoderState:
        """Rows ``index`` (beam search follows its back-pointers with this)."""
        return DecoderState(self.hidden.index_select(0, index), self.cell.index_select(0, index))


class StepOutput(NamedTuple):
    """One decoding step: scores ``(N, V)``, the new state, attention maps ``(N, H, W)``."""

    scores: Tensor
    state: DecoderState
    output_attention: Tensor
    input_attention: Tensor


class AttentionDecoder(nn.Module):
    """Caption decoder of the TVmax paper (Sec. 3).

    Args:
        vocab_size: number of words V (special tokens included).
        feature_channels: channels C of the encoder's grid features.
        feature_dim: g, size of the trained projection of the features (paper: 512).
        embed_dim: word embedding size (paper: 256).
        hidden_dim: LSTM hidden size d (paper: 512).
        input_attention, output_attention: names for :func:`captioner.attention.build`
            (paper: softmax input attention; softmax, sparsemax or tvmax output attention).
        input_attention_kwargs, output_attention_kwargs: their parameters, e.g. ``{"lam": 0.01}``.
        dropout: dropout on [r_t; h_t] before the word scores.
        attention_dim: hidden size of the additive score networks.
    """

    def __init__(
        self,
        vocab_size: int,
        feature_channels: int,
        *,
        feature_dim: int = 512,
        embed_dim: int = 256,
        hidden_dim: int = 512,
        input_attention: str = "softmax",
        input_attention_kwargs: dict | None = None,
        output_attention: str = "softmax",
        output_attention_kwargs: dict | None = None,
        dropout: float = 0.5,
        attention_dim: int = 512,
    ):
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("feature_channels", feature_channels),
            ("feature_dim", feature_dim),
            ("embed_dim", embed_dim),
            ("hidden_dim", hidden_dim),
            ("attention_dim", attention_dim),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AttentionDecoder: {name} must be a positive int, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"AttentionDecoder: dropout must lie in [0, 1), got {dropout!r}")
        self.vocab_size = vocab_size
        self.feature_channels = feature_channels
        self.input_attention_name = input_attention
        self.output_attention_name = output_attention

        self.feature_projection = nn.Linear(feature_channels, feature_dim)
        self.init_hidden = nn.Linear(feature_dim, hidden_dim)
        self.init_cell = nn.Linear(feature_dim, hidden_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.input_attention = AdditiveAttention(
            feature_dim,
            hidden_dim,
            attention_dim,
            _build_attention("input", input_attention, input_attention_kwargs),
        )
        # The LSTM's parameters (and their names in checkpoints); the recurrence multiplies
        # them itself (RecurrenceWeights) and runs the cell by _lstm_cell.
        self.lstm = nn.LSTMCell(feature_dim + embed_dim, hidden_dim)
        self.output_attention = AdditiveAttention(
            feature_dim,
            hidden_dim,
            attention_dim,
            _build_attention("output", output_attention, output_attention_kwargs),
        )
        self.context_projection = nn.Linear(feature_dim, feature_dim)
        self.dropout = nn.Dropout(dropout)
        self.word_scores = nn.Linear(feature_dim + hidden_dim, vocab_size)

    def encode(self, features: Tensor) -> EncodedImages:
        """Project grid features ``(B, H, W, C)`` to V and precompute attention keys.

        Features of another floating dtype (float16 from a feature cache) are cast to the
        parameters' dtype.
        """
        if features.dim() != 4 or features.shape[-1] != self.feature_channels:
            raise ValueError(
                f"decoder expects grid features (B, H, W, {self.feature_channels}), got "
                f"{tuple(features.shape)}"
            )
        if not features.is_floating_point():
            raise ValueError(f"decoder expects floating-point features, got {features.dtype}")
        grid = (features.shape[1], features.shape[2])
        weight = self.feature_projection.weight
        values = self.feature_projection(features.flatten(1, 2).to(weight.dtype))
        return EncodedImages(
            values,
            self.input_attention.keys(values),
            self.output_attention.keys(values),
            grid,
            self._recurrence_weights(),
        )

    def _recurrence_weights(self) -> RecurrenceWeights:
        """The weights of this pass's recurrence; under autocast already in its dtype, since
        autocast caches its casts of parameters only, and would cast these at every step."""
        lstm, context_size = self.lstm, self.feature_projection.out_features
        weights = (
            torch.cat([lstm.weight_hh, self.input_attention.query_projection.weight]),
            lstm.weight_ih[:, :context_size],
            lstm.weight_ih[:, context_size:],
            lstm.bias_ih + lstm.bias_hh,
        )
        device = lstm.weight_ih.device.type
        if torch.is_autocast_enabled(device):
            weights = [weight.to(torch.get_autocast_dtype(device)) for weight in weights]
        return RecurrenceWeights(*weights)

    def initial_state(self, encoded: EncodedImages) -> DecoderState:
        """h_0, c_0 = tanh(affine(mean of V)), ``(N, hidden_dim)`` each."""
        mean = encoded.values.mean(dim=1)
        return DecoderState(torch.tanh(self.init_hidden(mean)), torch.tanh(self.init_cell(mean)))

    @staticmethod
    def _word_gates(encoded: EncodedImages, embedded: Tensor) -> Tensor:
        """The words' share of the LSTM's gates, W_ih E y + b_ih + b_hh: ``(..., 4d)`` for
        embedded words ``(..., embed_dim)``."""
        return F.linear(embedded, encoded.recurrence.words, encoded.recurrence.bias)

    def _recur(
        self, encoded: EncodedImages, state: DecoderState, word_gates: Tensor
    ) -> tuple[DecoderState, Tensor]:
        """Input attention from h_{t-1} and one LSTM step; word_gates ``(N, 4d)`` are
        :meth:`_word_gates` of E y_{t-1}."""
        weights = encoded.recurrence
        gate_size = weights.context.shape[0]
        hidden_gates, query = F.linear(state.hidden, weights.hidden).split(
            [gate_size, weights.hidden.shape[0] - gate_size], dim=-1
        )
        context, attention = self.input_attention.attend(
            encoded.input_keys, encoded.values, query, encoded.grid
        )
        input_gates = torch.addmm(word_gates, context, weights.context.t())
        hidden, cell = _lstm_cell(input_gates, hidden_gates, state.cell)
        return DecoderState(hidden, cell), attention

    def _readout(
        self, encoded: EncodedImages, hidden: Tensor, weights: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Output attention from h_t and word scores; hidden ``(N, d)`` or ``(N, L, d)``.
        ``weights``: the output attention of these h_t, when already computed."""
        if weights is None:
            context, weights = self.output_attention(
                encoded.output_keys, encoded.values, hidden, encoded.grid
            )
        else:
            context = self.output_attention.context(weights, encoded.values)
        visual = torch.tanh(self.context_projection(context))
        scores = self.word_scores(self.dropout(torch.cat([visual, hidden], dim=-1)))
        return scores, weights

    def step(self, encoded: EncodedImages, state: DecoderState, tokens: Tensor) -> StepOutput:
        """One decoding step: consume y_{t-1} (``(N,)`` long) and score y_t."""
        word_gates = self._word_gates(encoded, self.embedding(tokens))
        state, input_weights = self._recur(encoded, state, word_gates)
        scores, output_weights = self._readout(encoded, state.hidden)
        return StepOutput(scores, state, output_weights, input_weights)

    def forward(self, features: Tensor, captions: Tensor) -> DecoderOutput:
        """Teacher forcing: step t consumes ``captions[:, t]`` and predicts ``captions[:, t+1]``.

        Args:
            features: ``(B, H, W, C)`` float grid features.
            captions: ``(B, L)`` long word ids, starting with the start token.
        """
        if captions.dim() != 2 or captions.shape[0] != features.shape[0]:
            raise ValueError(
                f"decoder expects captions (B, L) with B = {features.shape[0]}, got "
                f"{tuple(captions.shape)}"
            )
        if captions.dtype != torch.long:
            raise ValueError(f"decoder expects torch.long captions, got {captions.dtype}")
        encoded = self.encode(features)
        state = self.initial_state(encoded)
        # An output mapping solved on the host in a background thread (TVmax's, when set to
        # overlap) starts on every OVERLAP_WORDS words as soon as the loop has passed them,
        # and solves while the loop goes on launching the next words' kernels.
        overlap = self.output_attention.starts_in_background(features.device)
        # Every word embedded and multiplied into the gates at once: one lookup, one product
        # and, in the backward pass, one scatter into the embedding's gradient and one
        # product for W_ih's word half, instead of one per step (each is several GPU kernels);
        # unbind's backward stacks the steps' gradients in one kernel.
        words = self._word_gates(encoded, self.embedding(captions)).unbind(1)
        hiddens, input_weights, started = [], [], []
        for t, word_gates in enumerate(words):
            state, weights = self._recur(encoded, state, word_gates)
            hiddens.append(state.hidden)
            input_weights.append(weights)
            if overlap and ((t + 1) % OVERLAP_WORDS == 0 or t + 1 == len(words)):
                first = len(started) * OVERLAP_WORDS
                started.append(self.output_attention.start(
                    encoded.output_keys, torch.stack(hiddens[first:], dim=1), encoded.grid
                ))
        output_weights = torch.cat([finish() for finish in started], dim=1) if overlap else None
        scores, output_weights = self._readout(
            encoded, torch.stack(hiddens, dim=1), output_weights
        )
        return DecoderOutput(scores, output_weights, torch.stack(input_weights, dim=1))


def _lstm_cell(input_gates: Tensor, hidden_gates: Tensor, cell: Tensor) -> tuple[Tensor, Tensor]:
    """(h_t, c_t) from the gates' two shares ``(N, 4d)`` (their sum is the pre-activation,
    biases included; nn.LSTMCell's order) and c_{t-1} ``(N, d)``: c_t = f * c_{t-1} + i * g,
    h_t = o * tanh(c_t). On a GPU, torch's fused cell (one kernel each way: the one that
    nn.LSTMCell runs there after its two products), elsewhere the same formula."""
    if input_gates.is_cuda:
        hidden, cell, _ = torch.ops.aten._thnn_fused_lstm_cell(input_gates, hidden_gates, cell)
        return hidden, cell
    in_gate, forget_gate, cell_gate, out_gate = (input_gates + hidden_gates).chunk(4, dim=-1)
    cell = torch.sigmoid(forget_gate) * cell + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
    return torch.sigmoid(out_gate) * torch.tanh(cell), cell


def _build_attention(which: str, name: str, kwargs: dict | None) -> nn.Module:
    """The attention mapping of the decoder's ``which`` ("input" or "output") attention, from
    settings a user gave: any refusal is a ValueError that names the setting."""
    try:
        return attention.build(name, **(kwargs or {}))
    except (TypeError, ValueError) as exc:
        given = f" with {which}_attention_kwargs {kwargs}" if kwargs else ""
        raise ValueError(f"{which}_attention {name!r}{given}: {exc}") from exc
