"""TVmax: sparse attention fused over 2-D regions of the image grid (Martins et al., TVmax paper).

TVmax(z) = argmin_{p in simplex} 1/2 ||p - z||^2 + lam * TV2D(p) over the H x W grid, with
TV2D(p) = sum_ij |p_ij - p_i,j+1| + |p_ij - p_i+1,j| (anisotropic, 4-neighbour). By Proposition 1
it is sparsemax(prox_{lam TV2D}(z)). The prox is solved exactly (see ``_tv2d_kernels``); its
Jacobian averages over the fused groups (Proposition 2, Eq. 9; Algorithm 1) and its derivative in
lam is each group's signed boundary count over its size (Eq. 8), so lam can be learned.
"""

from __future__ import annotations

import math
from functools import partial

import numba
import numpy as np
import torch
from torch import Tensor, nn

from ._checks import apply_mask, check_lam, check_mask, check_scores, checked_max
from ._grouped import by_size, grouped_prox, is_zero
from ._tv2d_kernels import (
    MAX_MERGE_ROUNDS,
    tv2d_prox_rows_parallel,
    tv2d_prox_rows_serial,
    tvmax_backward_rows_parallel,
    tvmax_backward_rows_serial,
    tvmax_rows_parallel,
    tvmax_rows_serial,
)
from .sparsemax import sparsemax

# Serial with one numba thread or a tiny batch, else parallel over grids (_grouped.by_size).
_tv2d_prox_rows = by_size(tv2d_prox_rows_serial, tv2d_prox_rows_parallel)
_tvmax_rows = by_size(tvmax_rows_serial, tvmax_rows_parallel)
_tvmax_backward_rows = by_size(tvmax_backward_rows_serial, tvmax_backward_rows_parallel)
# The kernels read and write these dtypes directly; others go through float64.
_KERNEL_DTYPES = (torch.float32, torch.float64)


def _solve_rows(z, lam, x, group, sign, dlam, *, height: int, width: int) -> None:
    _tv2d_prox_rows(
        z, lam, x, group, sign, dlam, height, width, numba.get_num_threads(), MAX_MERGE_ROUNDS
    )


def _check_grid(z: Tensor, func: str) -> None:
    check_scores(z, -1, func, min_dim=2)
    if z.shape[-2] == 0:
        raise ValueError(f"{func}: scores have an empty grid dimension (shape {tuple(z.shape)})")


def tv2d_prox(z: Tensor, lam: float | Tensor, mask: Tensor | None = None) -> Tensor:
    """prox_{lam TV2D}(z) = argmin_w 1/2 ||w - z||^2 + lam * TV2D(w), per H x W grid, exact.

    Exact: fused groups come from a guess certified by the optimality conditions or, failing
    that, from parametric min-cuts (divide and conquer), never from comparing floats; each
    group's value is the closed form of Eq. 8, so all cells of a group hold bitwise identical
    values and 4-neighbours are equal iff they are fused (ties closer than ~1e-12 fuse).
    Backward: the mean of the incoming gradient over each fused group (Eq. 9); d/dlam from
    Eq. 8 when ``lam`` is a tensor that requires grad.

    Args:
        z: scores (..., H, W), float32 or float64, any number of leading dimensions. The solver
            runs on the CPU (numba, float64, parallel over the grids); CUDA tensors make a host
            round trip and come back on their device.
        lam: TV strength >= 0, a float or a 0-dim tensor; lam = 0 is the identity.
        mask: optional bool tensor broadcastable to ``z``, True = cell takes part. Masked cells
            and ``-inf`` scores leave the grid graph (no edges to them) and come out as
            ``-inf`` with zero gradient.

    Returns:
        The prox, same shape, dtype and device as ``z``.

    Raises:
        ValueError: rank < 2, NaN or ``+inf`` scores, lam < 0, a grid with every cell masked.
    """
    return _prox_flat(z, lam, mask, "tv2d_prox").unflatten(-1, z.shape[-2:])


def _prox_flat(z: Tensor, lam: float | Tensor, mask: Tensor | None, func: str) -> Tensor:
    """The prox of each grid of z (..., H, W), flattened to (..., H*W) (validated here)."""
    _check_grid(z, func)
    height, width = z.shape[-2:]
    flat_mask = None if mask is None else check_mask(mask, z.shape, func).flatten(-2)
    solver = partial(_solve_rows, height=height, width=width)
    return grouped_prox(z.flatten(-2), lam, -1, flat_mask, func, solver)


class TVmaxFunction(torch.autograd.Function):
    """sparsemax(prox_{lam TV2D}(z)) of rows of flattened grids in one kernel, and its backward.

    Forward: the exact prox and the sparsemax of each grid (``tvmax_rows``), which also checks
    the scores. Backward: the sparsemax Jacobian-vector product, its mean over each fused group
    and the lam gradient (Eq. 8), also in one kernel. ``z`` is (rows, H*W), the caller's scores
    of shape ``grid_shape`` (..., H, W) flattened.
    """

    @staticmethod
    def forward(ctx, z: Tensor, lam: float | Tensor, grid_shape: torch.Size) -> Tensor:
        dtype = z.dtype if z.dtype in _KERNEL_DTYPES else torch.float64
        z_host = z.detach().to(device="cpu", dtype=dtype).contiguous().numpy()
        # Plain numpy work arrays: far cheaper to allocate than tensors at these sizes.
        p = np.empty_like(z_host)
        group = np.empty(z_host.shape, dtype=np.int32)
        dlam = np.empty(z_host.shape)
        code = _tvmax_rows(z_host, float(lam), p, group, dlam, *grid_shape[-2:],
                           numba.get_num_threads(), MAX_MERGE_ROUNDS)
        if code >= 0:
            # Raises the ValueError describing the scores, rows indexed as the caller's.
            checked_max(torch.from_numpy(z_host).view(grid_shape).flatten(-2), -1, "tvmax")
            raise RuntimeError(f"tvmax: the kernel rejected row {code // 3} of valid scores")
        weights = torch.from_numpy(p)
        ctx.save_for_backward(weights)
        ctx.group, ctx.dlam = group, dlam
        ctx.lam_like = lam if isinstance(lam, Tensor) else None
        return weights.to(device=z.device, dtype=z.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        (weights,) = ctx.saved_tensors
        grad_host = grad.detach().to(device="cpu", dtype=weights.dtype).contiguous().numpy()
        grad_z = np.empty_like(grad_host)
        grad_rows = np.empty(grad_host.shape[0])
        _tvmax_backward_rows(grad_host, weights.numpy(), ctx.group, ctx.dlam, grad_z, grad_rows)
        grad_lam = None
        if ctx.needs_input_grad[1]:
            lam = ctx.lam_like
            grad_lam = torch.tensor(grad_rows.sum(), dtype=lam.dtype, device=lam.device)
        grad_z = torch.from_numpy(grad_z).to(device=grad.device, dtype=grad.dtype)
        return grad_z, grad_lam, None


def tvmax(z: Tensor, lam: float | Tensor, mask: Tensor | None = None) -> Tensor:
    """TVmax(z) = sparsemax over the H*W cells of prox_{lam TV2D}(z) (Proposition 1).

    Sparse attention weights that are constant on connected regions of the grid. Backward:
    the sparsemax Jacobian-vector product at the prox output, then its mean over each fused
    group (Proposition 2, Algorithm 1); differentiable in ``lam`` (Eq. 8).

    Args:
        z: scores (..., H, W), float32 or float64. The prox and the sparsemax run in one
            numba kernel on the CPU (float64 inside); CUDA tensors give correct results through
            a host round trip.
        lam: TV strength >= 0 (float or 0-dim tensor); lam = 0 is exactly sparsemax.
        mask: optional bool tensor broadcastable to ``z``, True = cell may receive attention.
            Masked cells (and ``-inf`` scores) take no part in the grid graph and get exactly
            0 weight and 0 gradient.

    Returns:
        Weights (..., H, W) summing to 1 over each grid, same dtype and device as ``z``; cells
        of one fused group hold bitwise identical weights.

    Raises:
        ValueError: rank < 2, NaN or ``+inf`` scores, lam < 0, a grid with every cell masked.
    """
    _check_grid(z, "tvmax")
    lam = check_lam(lam, "tvmax")
    if is_zero(lam):
        flat_mask = None if mask is None else check_mask(mask, z.shape, "tvmax").flatten(-2)
        return sparsemax(z.flatten(-2), dim=-1, mask=flat_mask).unflatten(-1, z.shape[-2:])
    height, width = z.shape[-2:]
    rows = apply_mask(z, mask, "tvmax").reshape(-1, height * width)
    return TVmaxFunction.apply(rows, lam, z.shape).view(z.shape)


class TVMax(nn.Module):
    """TVmax attention over the grid: ``forward(scores (..., H, W), mask=None)``.

    Args:
        lam: TV strength >= 0 (the paper uses 0.01).
        learn_lam: learn lam by gradient descent. lam is then softplus(raw) with an
            unconstrained parameter ``raw``, so it stays > 0 whatever the optimizer does
            (lam must then start > 0).
    """

    is_sparse = True

    def __init__(self, lam: float = 0.01, learn_lam: bool = False) -> None:
        super().__init__()
        lam = check_lam(lam, "TVMax")
        if isinstance(lam, Tensor):
            lam = float(lam.detach())
        self.learn_lam = bool(learn_lam)
        if self.learn_lam:
            if lam <= 0:
                raise ValueError(f"TVMax: a learnable lam must start > 0, got lam={lam}")
            # Inverse softplus, written to stay accurate for large lam.
            raw = lam + math.log(-math.expm1(-lam))
            self.raw_lam = nn.Parameter(torch.tensor(raw, dtype=torch.get_default_dtype()))
        else:
            self.fixed_lam = lam

    @property
    def lam(self) -> float | Tensor:
        """The current lam: a float, or a 0-dim tensor carrying the gradient when learned."""
        if self.learn_lam:
            return nn.functional.softplus(self.raw_lam)
        return self.fixed_lam

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return tvmax(scores, self.lam, mask)

    def extra_repr(self) -> str:
        lam = self.lam.detach() if isinstance(self.lam, Tensor) else self.lam
        return f"lam={float(lam):.4g}, learn_lam={self.learn_lam}"
