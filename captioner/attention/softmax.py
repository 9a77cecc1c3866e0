"""Softmax with the shared validation and mask semantics of :mod:`captioner.attention`."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import apply_mask, check_distributions, check_scores, half_in_float32
from ._flat import FlatGridMapping


@half_in_float32
def softmax(z: Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """softmax(z)_i = exp(z_i) / sum_j exp(z_j) along ``dim`` (dense: no exact zeros).

    Args:
        z: scores, any shape, float32 or float64 (float16 and bfloat16 in float32), any
            device; ``-inf`` = masked.
        dim: dimension to normalize over.
        mask: optional bool tensor broadcastable to ``z``; False cells get exactly 0 weight
            and 0 gradient (same as ``-inf`` scores).

    Returns:
        Probabilities of ``z``'s shape and dtype.

    Raises:
        ValueError: NaN or ``+inf`` scores, or a row with every entry masked.
    """
    dim = check_scores(z, dim, "softmax")
    z = apply_mask(z, mask, "softmax")
    # Checked on the output, where a NaN or +inf score, or a row with every entry masked,
    # comes out NaN: one reduction instead of a maximum and its test on every call.
    p = torch.softmax(z, dim=dim)
    check_distributions(p, z, dim, "softmax")
    return p


class Softmax(FlatGridMapping):
    """Softmax over the H*W cells of each grid (dense attention)."""

    is_sparse = False

    def map_flat(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        return softmax(scores, dim=-1, mask=mask)
