"""Sparsemax on the GPU: one Triton program per row, forward and backward, each one kernel.

The sort-based PyTorch path (``sparsemax.sparsemax_threshold``) launches a chain of small
kernels per call (max, sort, cumsum, compare, sum, gather, clamp); in a decoder that attends
at every word those launches, not arithmetic, set its time. Here a row lives in registers:

* forward: tau by Michelot's algorithm (Michelot, 1986; Condat, 2016, "Fast projection onto
  the simplex and the l1 ball", Alg. 2): start from the whole row, tau = (sum_S z - 1) / |S|,
  drop every z_i <= tau, repeat until nothing is dropped. The support only shrinks and the
  final tau is Martins & Astudillo's (2016) Eq. 4 on the same support; p = [z - tau]_+.
* backward: Eq. 14, dz_i = [p_i > 0] (g_i - mean_{j : p_j > 0} g_j).

Rows are shifted by their maximum first, as in the PyTorch path. ``-inf`` entries (masked)
never enter the support. float32 and float64 rows are computed in their own dtype, half
precision rows in float32. Results equal the sort-based path's up to the order of the sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._autograd import first_order_only


@triton.jit
def _forward_kernel(z_ptr, p_ptr, n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    inside = offsets < n
    z = tl.load(z_ptr + row * n + offsets, mask=inside, other=-float("inf"))
    z = z.to(tl.float64) if WIDE else z.to(tl.float32)
    z = z - tl.max(z, 0)
    support = z > -float("inf")
    size = tl.sum(support.to(tl.int32), 0)
    tau = (tl.sum(tl.where(support, z, 0.0), 0) - 1.0) / size
    before = size + 1
    while size < before:
        before = size
        support = z > tau
        size = tl.sum(support.to(tl.int32), 0)
        tau = (tl.sum(tl.where(support, z, 0.0), 0) - 1.0) / size
    p = tl.maximum(z - tau, 0.0)
    tl.store(p_ptr + row * n + offsets, p.to(p_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _backward_kernel(p_ptr, g_ptr, dz_ptr, n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    inside = offsets < n
    support = tl.load(p_ptr + row * n + offsets, mask=inside, other=0.0) > 0
    g = tl.load(g_ptr + row * n + offsets, mask=inside, other=0.0)
    g = g.to(tl.float64) if WIDE else g.to(tl.float32)
    g = tl.where(support, g, 0.0)
    mean = tl.sum(g, 0) / tl.sum(support.to(tl.int32), 0)
    dz = tl.where(support, g - mean, 0.0)
    tl.store(dz_ptr + row * n + offsets, dz.to(dz_ptr.dtype.element_ty), mask=inside)


def _launch(kernel, rows: Tensor, *tensors: Tensor) -> Tensor:
    """Run ``kernel`` on contiguous (R, n) ``rows`` (and ``tensors`` of the same shape), one
    program per row; returns the output of ``rows``' shape and dtype."""
    out = torch.empty_like(rows)
    n = rows.shape[-1]
    block = triton.next_power_of_2(n)
    kernel[(rows.shape[0],)](rows, *tensors, out, n, BLOCK=block,
                             WIDE=rows.dtype == torch.float64,
                             num_warps=max(1, min(16, block // 256)))
    return out


class SparsemaxRowsFunction(torch.autograd.Function):
    """sparsemax of each row of a contiguous (R, n) tensor, n <= FUSED_MAX_LENGTH of
    ``sparsemax``; one kernel each way. Rows must hold at least one finite entry and no NaN
    or +inf (the caller checks)."""

    @staticmethod
    def forward(ctx, z: Tensor) -> Tensor:
        p = _launch(_forward_kernel, z)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @first_order_only
    def backward(ctx, grad: Tensor) -> Tensor:
        (p,) = ctx.saved_tensors
        return _launch(_backward_kernel, p, grad.contiguous())

