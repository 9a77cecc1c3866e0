"""Fusedmax: sparse attention fused over contiguous segments (Niculae & Blondel, 2017)."""

from __future__ import annotations

from torch import Tensor

from ._checks import half_in_float32
from ._flat import LamFlatGridMapping
from ._grouped import sparsemax_of_prox
from .tv1d import tv1d_rows


@half_in_float32
def fusedmax(
    z: Tensor, lam: float | Tensor, dim: int = -1, mask: Tensor | None = None
) -> Tensor:
    """fusedmax(z) = sparsemax(prox_{lam TV1D}(z)) along ``dim`` (Niculae & Blondel, Prop. 2).

    Exact: the composition equals the TV-regularized projection onto the simplex. Backward
    (Prop. 3 and the chain rule): the sparsemax Jacobian-vector product, then the average
    over each fused segment of the prox, in closed form; differentiable in ``lam`` too.

    Args:
        z: scores, any shape, float32 or float64 (float16 and bfloat16 in float32). The TV
            prox runs on the CPU (numba) in float64, so CUDA tensors make a host round trip
            for it.
        lam: TV strength >= 0 (float or 0-dim tensor); lam = 0 is exactly sparsemax.
        dim: the dimension along which cells form a chain.
        mask: optional bool tensor broadcastable to ``z``. False cells (and ``-inf``
            scores) get exactly 0 weight and 0 gradient and leave the chain: their
            unmasked neighbours on either side become adjacent.

    Returns:
        Sparse probabilities, ``z``'s shape and dtype, constant on fused segments.

    Raises:
        ValueError: lam < 0, NaN or ``+inf`` scores, or a row with every cell masked.
    """
    return sparsemax_of_prox(tv1d_rows, z, lam, dim, mask, "fusedmax")


class Fusedmax(LamFlatGridMapping):
    """Fusedmax over the H*W cells of each grid, flattened row-major into one chain.

    Args:
        lam: TV strength >= 0 (the paper's default 0.1).
    """

    function = staticmethod(fusedmax)
