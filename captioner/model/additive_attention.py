"""Additive (Bahdanau) visual attention over a grid of image regions.

TVmax paper, Sec. 3: z_{t,i} = w^T tanh(W [v_i; h] + b), alpha_t = mapping(z_t). The affine
map on the concatenation splits into W_v v_i + W_h h + b; the region half W_v v_i + b ("keys")
does not depend on the step, so it is computed once per image by :meth:`keys` and reused at
every decoding step and for every beam.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class AdditiveAttention(nn.Module):
    """Scores regions against a query and turns the scores into weights with ``mapping``.

    Args:
        value_dim: size g of a region vector v_i.
        query_dim: size d of the query (an LSTM hidden state).
        attention_dim: size of the hidden layer of the score network.
        mapping: a :mod:`captioner.attention` module taking scores ``(..., H, W)``.
    """

    def __init__(self, value_dim: int, query_dim: int, attention_dim: int, mapping: nn.Module):
        super().__init__()
        self.key_projection = nn.Linear(value_dim, attention_dim)
        self.query_projection = nn.Linear(query_dim, attention_dim, bias=False)
        self.score = nn.Linear(attention_dim, 1, bias=False)
        self.mapping = mapping

    def keys(self, values: Tensor) -> Tensor:
        """W_v v_i + b for every region: ``(B, k, g)`` -> ``(B, k, a)``."""
        return self.key_projection(values)

    def forward(
        self, keys: Tensor, values: Tensor, query: Tensor, grid: tuple[int, int]
    ) -> tuple[Tensor, Tensor]:
        """Attend with one or several queries per image.

        Args:
            keys: ``(B, k, a)`` from :meth:`keys`.
            values: ``(B, k, g)`` region vectors V, k = H * W in row-major order.
            query: ``(B, d)`` or ``(B, L, d)`` (all steps of a sequence at once).
            grid: (H, W), the layout the mapping sees.

        Returns:
            context ``(B, [L,] g)`` = V alpha and weights alpha ``(B, [L,] H, W)``.
        """
        return self.attend(keys, values, self.query_projection(query), grid)

    def attend(
        self, keys: Tensor, values: Tensor, projected: Tensor, grid: tuple[int, int]
    ) -> tuple[Tensor, Tensor]:
        """:meth:`forward` for a query already projected by W_h (``query_projection``):
        ``projected`` is ``(B, [L,] a)``. The decoder projects h_{t-1} for the input attention
        together with the LSTM's hidden gates, in one matrix product."""
        weights = self.mapping(self.projected_scores(keys, projected, grid))
        return self.context(weights, values), weights

    def scores(self, keys: Tensor, query: Tensor, grid: tuple[int, int]) -> Tensor:
        """z = w^T tanh(W_v v_i + b + W_h h) per region: ``(B, [L,] H, W)`` for a query
        ``(B, [L,] d)``, float32 (or float64) even under autocast."""
        return self.projected_scores(keys, self.query_projection(query), grid)

    def projected_scores(self, keys: Tensor, projected: Tensor, grid: tuple[int, int]) -> Tensor:
        """:meth:`scores` for a query already projected by W_h: ``(B, [L,] a)``."""
        batch = keys.shape[0]
        lead = projected.shape[:-1]
        projected = projected.view(batch, -1, 1, keys.shape[-1])
        scores = self.score(torch.tanh(projected + keys.unsqueeze(1))).squeeze(-1)
        scores = scores.view(*lead, *grid)
        if scores.dtype in (torch.float16, torch.bfloat16):
            # Under autocast: the mappings compute in float32, since thresholds and fused
            # groups found in half precision would be coarse.
            scores = scores.float()
        return scores

    def context(self, weights: Tensor, values: Tensor) -> Tensor:
        """V alpha: ``(B, [L,] g)`` for weights ``(B, [L,] H, W)`` and values ``(B, k, g)``."""
        batch, regions, _ = values.shape
        context = torch.bmm(weights.reshape(batch, -1, regions).to(values.dtype), values)
        return context.view(*weights.shape[:-2], values.shape[-1])

    def starts_in_background(self, device: torch.device) -> bool:
        """Whether the mapping solves in a background thread on ``device`` (:meth:`start`)."""
        starts = getattr(self.mapping, "starts_in_background", None)
        return starts is not None and starts(device)

    def start(self, keys: Tensor, query: Tensor, grid: tuple[int, int]) -> Callable[[], Tensor]:
        """Score the regions now and begin the mapping's background solve: the function
        returned gives the weights, as ``forward`` would. For mappings that have one
        (``mapping.start``, e.g. TVmax's host solver)."""
        return self.mapping.start(self.scores(keys, query, grid))
