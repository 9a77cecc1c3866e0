"""Sparsemax: Euclidean projection onto the probability simplex (Martins & Astudillo, 2016)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import apply_mask, check_scores, checked_max, half_in_float32
from ._flat import FlatGridMapping
from ._triton import triton_installed

# Rows on a GPU up to this long run the fused Triton kernels, one program per row held in
# registers (a 10k-word vocabulary fits); longer rows take the sort-based path.
FUSED_MAX_LENGTH = 16384


def ranks_along(z: Tensor, dim: int) -> Tensor:
    """1, 2, ..., z.shape[dim] in ``z``'s dtype, shaped to broadcast against ``z`` along dim."""
    shape = [1] * z.dim()
    shape[dim] = z.shape[dim]
    return torch.arange(1, z.shape[dim] + 1, dtype=z.dtype, device=z.device).view(shape)


def sparsemax_threshold(z: Tensor, dim: int) -> Tensor:
    """The threshold tau with sparsemax(z) = [z - tau]_+ (Martins & Astudillo, Alg. 1).

    Sort z decreasingly; the support size is k(z) = max{k : 1 + k z_(k) > sum_{j<=k} z_(j)}
    (Eq. 3) and tau = (sum_{j<=k(z)} z_(j) - 1) / k(z) (Eq. 4). ``z`` must hold at least one
    finite value per row; ``-inf`` entries never enter the support. Returns tau with
    keepdim along ``dim``.
    """
    z_sorted = torch.sort(z, dim=dim, descending=True).values
    cumsum_minus_one = z_sorted.cumsum(dim) - 1
    support_size = (ranks_along(z, dim) * z_sorted > cumsum_minus_one).sum(dim, keepdim=True)
    return cumsum_minus_one.gather(dim, support_size - 1) / support_size.to(z.dtype)


def sparsemax_jvp(grad: Tensor, support: Tensor, dim: int) -> Tensor:
    """J_sparsemax(z) grad along ``dim`` (Martins & Astudillo, Eq. 14), with ``support`` the
    bool mask p > 0: grad minus its mean over the support, exactly 0 off it (whatever grad
    holds there: the Jacobian's rows and columns off the support are zero)."""
    kept = torch.where(support, grad, 0.0)
    mean = kept.sum(dim, keepdim=True) / support.sum(dim, keepdim=True)
    return torch.where(support, kept - mean, 0.0)


class SparsemaxFunction(torch.autograd.Function):
    """sparsemax with the closed-form Jacobian-vector product of Martins & Astudillo (Eq. 14).

    With support S = {i : p_i > 0}: dz_i = [i in S] (g_i - mean_{j in S} g_j).
    """

    @staticmethod
    def forward(ctx, z: Tensor, z_max: Tensor, dim: int) -> Tensor:
        # Shifting by the row maximum keeps the cumulative sums small for huge scores.
        z = z - z_max
        p = torch.clamp(z - sparsemax_threshold(z, dim), min=0)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (p,) = ctx.saved_tensors
        return sparsemax_jvp(grad, p > 0, ctx.dim), None, None


@half_in_float32
def sparsemax(z: Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """sparsemax(z) = argmin_{p in simplex} ||p - z||^2 along ``dim`` (exact, sort-based).

    Martins & Astudillo (2016), Eq. 2 (forward, Alg. 1) and Eq. 14 (backward). Vectorized
    over all other dimensions: O(n log n) per row for n = z.shape[dim]. On a GPU with Triton,
    rows up to FUSED_MAX_LENGTH long run one fused kernel each way (``_sparsemax_triton``:
    Michelot's algorithm, same result up to the order of the sums).

    Args:
        z: scores, any shape, float32 or float64 (float16 and bfloat16 in float32), any
            device (runs natively on CUDA); ``-inf`` = masked.
        dim: dimension to normalize over.
        mask: optional bool tensor broadcastable to ``z``; False cells get exactly 0 weight
            and 0 gradient (equivalent to ``-inf`` scores).

    Returns:
        Probabilities of ``z``'s shape and dtype, with exact zeros outside the support.

    Raises:
        ValueError: NaN or ``+inf`` scores, or a row with every entry masked.
    """
    return sparsemax_as(z, dim, mask, "sparsemax")


def sparsemax_as(z: Tensor, dim: int, mask: Tensor | None, func: str) -> Tensor:
    """:func:`sparsemax`, its errors naming the mapping ``func`` that reduces to it (fusedmax,
    oscarmax and TVmax at lam = 0), whose scores the caller gave."""
    dim = check_scores(z, dim, func)
    z = apply_mask(z, mask, func)
    z_max = checked_max(z, dim, func)
    if not _use_fused_kernels(z, dim):
        return SparsemaxFunction.apply(z, z_max, dim)
    from ._sparsemax_triton import SparsemaxRowsFunction

    rows = z.movedim(dim, -1)
    p = SparsemaxRowsFunction.apply(rows.reshape(-1, rows.shape[-1]).contiguous())
    return p.view(rows.shape).movedim(-1, dim)


def _use_fused_kernels(z: Tensor, dim: int) -> bool:
    """Whether ``z`` takes the fused Triton kernels: CUDA scores with rows of at most
    FUSED_MAX_LENGTH entries, when Triton is installed (the sort-based path otherwise)."""
    return (z.is_cuda and z.numel() > 0 and z.shape[dim] <= FUSED_MAX_LENGTH
            and triton_installed())


class Sparsemax(FlatGridMapping):
    """Sparsemax over the H*W cells of each grid (sparse attention)."""

    is_sparse = True

    def map_flat(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        return sparsemax(scores, dim=-1, mask=mask)
