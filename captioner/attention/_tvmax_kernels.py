"""TVmax on the CPU (numba): the exact prox of ``_tv2d_prox``, then sparsemax, per grid, in
one pass over the batch; and its backward pass (TVmax paper, Proposition 2, Algorithm 1).

Grids are rows of flattened H x W cells; ``-inf`` marks an absent (masked) cell. Each kernel has
a serial driver and a prange-parallel one over slices of the batch (see ``_grouped.by_size``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._tv2d_prox import _prox_grid, _workspace

# Row-error kinds reported by the TVmax kernels (code = 3 * row + kind; -1 = all rows valid).
NAN, POS_INF, EMPTY = 0, 1, 2


@njit(cache=True)
def _sparsemax_grid(x, active, n, p, b, insup):
    """p[b] = sparsemax of x over the active cells (0 elsewhere), exact, in float64.

    Michelot's algorithm (Condat 2016, Alg. 2; same fixed point as Martins & Astudillo's sort,
    Eq. 3-4): tau = (sum_S x - 1) / |S| over the current support S, then drop the cells at or
    below tau, until none drops. The support only shrinks, so it ends within n passes. Values
    are shifted by their maximum first (which therefore stays in the support with weight > 0)
    so that huge scores keep an exact 1 / |S| scale; equal x give bitwise equal p.
    """
    xmax = -np.inf
    for i in range(n):
        insup[i] = active[i]
        if active[i] and x[i] > xmax:
            xmax = x[i]
    tau = 0.0
    dropped = True
    # Branch-free passes: which cells stay is unpredictable from cell to cell.
    while dropped:
        total = 0.0
        k = 0
        for i in range(n):
            total += x[i] - xmax if insup[i] else 0.0
            k += insup[i]
        tau = (total - 1.0) / k
        dropped = False
        for i in range(n):
            drop = insup[i] & (x[i] - xmax <= tau)
            insup[i] = insup[i] & (not drop)
            dropped |= drop
    for i in range(n):
        p[b, i] = (x[i] - xmax) - tau if insup[i] else 0.0


@njit(cache=True)
def _tvmax_rows_slice(z, lam, p, group, dlam, H, W, merge_rounds, start, stop):
    """Rows start..stop-1 of tvmax_rows; returns the first row-error code or -1."""
    n = H * W
    ws = _workspace(n)
    active = np.empty(n, np.bool_)
    insup = np.empty(n, np.bool_)
    zrow = np.empty(n, np.float64)
    xrow = np.empty(n, np.float64)
    for b in range(start, stop):
        m = 0
        for i in range(n):
            v = np.float64(z[b, i])
            if np.isnan(v):
                return 3 * b + NAN
            if v == np.inf:
                return 3 * b + POS_INF
            zrow[i] = v
            active[i] = v > -np.inf
            if active[i]:
                m += 1
        if m == 0:
            return 3 * b + EMPTY
        _prox_grid(ws, zrow, active, lam, H, W, xrow, group[b], dlam[b], merge_rounds)
        _sparsemax_grid(xrow, active, n, p, b, insup)
        for i in range(n):
            if not active[i]:
                group[b, i] = -1
    return -1


@njit(cache=True)
def tvmax_rows_serial(z, lam, p, group, dlam, H, W, nchunks, merge_rounds):
    """TVmax = sparsemax(prox_{lam TV2D}) of a batch of flattened grids in one pass, exact.

    z: float32 or float64 (rows, H*W), read as float64, ``-inf`` = cell absent (no edges, zero
    weight); lam >= 0; nchunks and merge_rounds as in tv2d_prox_rows_serial. Fills p (rows,
    H*W, z's dtype), the weights; group (int32), each cell's fused group within its row (-1
    where absent); dlam (float64), d prox / d lam (Eq. 8). Returns -1, or 3 * row + kind
    (NAN, POS_INF, EMPTY) for the first invalid row found, leaving the outputs incomplete.
    """
    return _tvmax_rows_slice(z, lam, p, group, dlam, H, W, merge_rounds, 0, z.shape[0])


@njit(cache=True, parallel=True)
def tvmax_rows_parallel(z, lam, p, group, dlam, H, W, nchunks, merge_rounds):
    """tvmax_rows_serial with the batch cut into nchunks slices run in parallel."""
    rows = z.shape[0]
    nchunks = max(1, min(rows, nchunks))
    codes = np.empty(nchunks, np.int64)
    for ch in prange(nchunks):
        codes[ch] = _tvmax_rows_slice(z, lam, p, group, dlam, H, W, merge_rounds,
                                      ch * rows // nchunks, (ch + 1) * rows // nchunks)
    for ch in range(nchunks):
        if codes[ch] >= 0:
            return codes[ch]
    return -1


@njit(cache=True)
def _tvmax_backward_slice(grad, p, group, dlam, grad_z, grad_lam, start, stop):
    n = grad.shape[1]
    sums = np.empty(n)
    counts = np.empty(n)
    for b in range(start, stop):
        total = 0.0
        k = 0
        for i in range(n):
            if p[b, i] > 0:
                total += grad[b, i]
                k += 1
        mean = total / k
        for i in range(n):
            sums[i] = 0.0
            counts[i] = 0.0
        slope = 0.0
        for i in range(n):
            g = group[b, i]
            if g >= 0:
                v = grad[b, i] - mean if p[b, i] > 0 else 0.0
                sums[g] += v
                counts[g] += 1.0
                slope += v * dlam[b, i]
        for i in range(n):
            g = group[b, i]
            grad_z[b, i] = sums[g] / counts[g] if g >= 0 else 0.0
        grad_lam[b] = slope


@njit(cache=True)
def tvmax_backward_rows_serial(grad, p, group, dlam, grad_z, grad_lam):
    """Backward of tvmax_rows (Proposition 2, Algorithm 1), all (rows, H*W) but grad_lam (rows,).

    v = J_sparsemax g at the weights p (Martins & Astudillo, Eq. 14: g minus its mean over the
    support, 0 off it); grad_z = the mean of v over each fused group (0 where group == -1);
    grad_lam[row] = sum_i v_i dlam_i, the row's share of the lam gradient (Eq. 8). Arithmetic
    in float64; grad_z takes grad's dtype.
    """
    _tvmax_backward_slice(grad, p, group, dlam, grad_z, grad_lam, 0, grad.shape[0])


@njit(cache=True, parallel=True)
def tvmax_backward_rows_parallel(grad, p, group, dlam, grad_z, grad_lam):
    rows = grad.shape[0]
    for r in prange(rows):
        _tvmax_backward_slice(grad, p, group, dlam, grad_z, grad_lam, r, r + 1)
