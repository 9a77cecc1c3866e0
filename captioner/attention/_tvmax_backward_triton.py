"""TVmax's backward pass on the GPU in one Triton kernel: one program per grid.

Given the forward pass's weights p, each cell's fused group and d prox / d lam of each cell, the
Jacobian-vector product of TVmax = sparsemax o prox_{lam TV2D} (TVmax paper, Proposition 2 and
Algorithm 1) is, per grid:

* v = J_sparsemax g: v_i = [p_i > 0] (g_i - mean_{j : p_j > 0} g_j) (Martins & Astudillo, 2016,
  Eq. 14);
* dz_i = mean_{j in G(i)} v_j over the fused group G(i) of cell i, 0 for a cell outside every
  group (masked, or screened out with weight 0: group -1);
* d/dlam = sum_i v_i * d prox_i / d lam (Eq. 8), one partial sum per grid.

The group means need no atomics and no scratch memory: group labels lie in [0, n), so the
kernel takes them CHUNK labels at a time, sums v over each label of the chunk with an n x CHUNK
comparison, and hands each cell its label's mean the same way: O(n^2) comparisons per grid
(n <= MAX_CELLS), in a fixed order, so the result is deterministic. Arithmetic is float64
inside, as in the PyTorch path (``tvmax._backward_rows``, about 15 small kernels), which serves
larger grids and machines without Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Grids of up to this many cells (a 32 x 32 grid) take the kernel; larger ones the PyTorch path.
MAX_CELLS = 1024
# Group labels handled per step: a BLOCK x chunk tile of comparisons of at most _TILE cells,
# and at most _CHUNK labels (more would only mask more of the tile on small grids).
_CHUNK, _TILE = 32, 8192


@triton.jit
def _backward_kernel(grad_ptr, weights_ptr, group_ptr, dlam_ptr, grad_z_ptr, grad_lam_ptr, n,
                     BLOCK: tl.constexpr, CHUNK: tl.constexpr, WANT_LAM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cells = tl.arange(0, BLOCK)
    inside = cells < n
    at = row * n + cells
    support = tl.load(weights_ptr + at, mask=inside, other=0.0) > 0
    g = tl.where(support, tl.load(grad_ptr + at, mask=inside, other=0.0).to(tl.float64), 0.0)
    v = tl.where(support, g - tl.sum(g, 0) / tl.sum(support.to(tl.float64), 0), 0.0)
    group = tl.load(group_ptr + at, mask=inside, other=-1)
    if WANT_LAM:
        dlam = tl.load(dlam_ptr + at, mask=inside, other=0.0)
        tl.store(grad_lam_ptr + row, tl.sum(v * dlam, 0))
    grad_z = tl.zeros([BLOCK], tl.float64)
    for first in range(0, BLOCK, CHUNK):
        hit = group[:, None] == (first + tl.arange(0, CHUNK))[None, :]  # cell x label
        sums = tl.sum(tl.where(hit, v[:, None], 0.0), 0)
        sizes = tl.sum(hit.to(tl.float64), 0)
        means = sums / tl.maximum(sizes, 1.0)
        grad_z += tl.sum(tl.where(hit, means[None, :], 0.0), 1)
    tl.store(grad_z_ptr + at, grad_z.to(grad_z_ptr.dtype.element_ty), mask=inside)


def tvmax_backward_rows(grad: Tensor, weights: Tensor, group: Tensor, dlam: Tensor,
                        want_lam: bool) -> tuple[Tensor, Tensor | None]:
    """(dz, d/dlam) of TVmax for rows of flattened grids, one kernel (module docstring).

    Args:
        grad: incoming gradient (rows, n), any float dtype; dz comes back in it.
        weights: TVmax weights (rows, n), float32 or float64, contiguous.
        group: each cell's group label in [0, n), -1 for none (rows, n), int32, contiguous.
        dlam: d prox / d lam per cell (rows, n), float64, contiguous.
        want_lam: whether to return d/dlam (a 0-dim float64 tensor), else None.
    """
    grad = grad.contiguous()
    rows, n = grad.shape
    grad_z = torch.empty_like(grad)
    grad_lam = torch.empty(rows, dtype=torch.float64, device=grad.device) if want_lam else None
    if rows == 0:
        return grad_z, None if grad_lam is None else grad_lam.sum()
    block = triton.next_power_of_2(n)
    _backward_kernel[(rows,)](grad, weights, group, dlam, grad_z,
                              grad_lam if want_lam else grad_z, n, BLOCK=block,
                              CHUNK=min(_CHUNK, block, _TILE // block), WANT_LAM=want_lam,
                              num_warps=4 if block <= 256 else 8)
    return grad_z, None if grad_lam is None else grad_lam.sum()
