"""Additive (Bahdanau) visual attention over a grid of image regions.

TVmax paper, Sec. 3: z_{t,i} = w^T tanh(W [v_i; h] + b), alpha_t = mapping(z_t). The affine
map on the concatenation splits into W_v v_i + W_h h + b; the region half W_v v_i + b ("keys")
does not depend on the step, so it is computed once per image by :meth:`keys` and reused at
every decoding step and for every beam.
"""

from __future__ import annotations

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
        batch, regions, _ = keys.shape
        lead = query.shape[:-1]
        projected = self.query_projection(query).view(batch, -1, 1, keys.shape[-1])
        scores = self.score(torch.tanh(projected + keys.unsqueeze(1))).squeeze(-1)
        scores = scores.view(*lead, *grid)
        if scores.dtype in (torch.float16, torch.bfloat16):
            # Under autocast: the mappings compute in float32, since thresholds and fused
            # groups found in half precision would be coarse.
            scores = scores.float()
        weights = self.mapping(scores)
        context = torch.bmm(weights.reshape(batch, -1, regions).to(values.dtype), values)
        return context.view(*lead, values.shape[-1]), weights
