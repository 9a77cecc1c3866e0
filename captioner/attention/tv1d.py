"""Exact prox of 1-D total variation (fused lasso), by Condat's direct algorithm.

prox_{lam TV1D}(z) = argmin_x 1/2 ||x - z||^2 + lam sum_i |x_{i+1} - x_i|

L. Condat, "A direct algorithm for 1-D total variation denoising", IEEE Signal Processing
Letters 20(11), 2013: one left-to-right pass that keeps the range [v_lo, v_hi] of values the
current segment may still take and the dual variable at its two ends; when the range can no
longer absorb the next sample, the segment is closed at the last position where the violated
bound was attained and the pass restarts right after it. Worst case O(n^2), O(n) in practice.

The output is constant on segments of adjacent cells; the Jacobian averages over each segment
and d(value)/d(lam) = -(number of lower neighbouring segments - number of higher ones) / |G|
(Niculae & Blondel, 2017, proof of Prop. 3), both read from the segments the algorithm closes
rather than from comparing output values.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from torch import Tensor

from ._grouped import by_size, capped_lam, grouped_prox


@njit(cache=True)
def _close_segment(x, segment, step, start, stop, value, index, direction):
    """Write ``value`` to x[start:stop + 1] as segment ``index``; step[index] = direction."""
    for i in range(start, stop + 1):
        x[i] = value
        segment[i] = index
    step[index] = direction
    return index + 1


@njit(cache=True)
def condat_tv1d(y, lam, x, segment, step):
    """Solve the 1-D TV prox of y (m >= 1 float64) into x; return the number of segments.

    segment[i] is the index of i's segment; step[s] is +1 (-1) when segment s + 1 is higher
    (lower) than segment s, 0 for the last segment.
    """
    m = y.shape[0]
    count = 0
    start = 0
    k = 0
    k_lo = 0
    k_hi = 0
    v_lo = y[0] - lam
    v_hi = y[0] + lam
    u_lo = lam
    u_hi = -lam
    # The loop ends through a flag rather than a return inside it: numba 0.68 mis-assigns
    # variables across the loop's branches (a stale v_lo) when the return sits in the loop.
    done = False
    while not done:
        if k == m - 1:
            # Right end: close segments until the remaining one satisfies the boundary.
            if u_lo < 0.0:
                count = _close_segment(x, segment, step, start, k_lo, v_lo, count, -1)
                start = k_lo + 1
                k = start
                k_lo = start
                v_lo = y[k]
                u_lo = lam
                u_hi = v_lo + lam - v_hi
            elif u_hi > 0.0:
                count = _close_segment(x, segment, step, start, k_hi, v_hi, count, 1)
                start = k_hi + 1
                k = start
                k_hi = start
                v_hi = y[k]
                u_hi = -lam
                u_lo = v_hi - lam - v_lo
            else:
                done = True
        else:
            u_lo += y[k + 1] - v_lo
            if u_lo < -lam:
                # The segment cannot go as low as the next sample needs: it ends stepping down.
                count = _close_segment(x, segment, step, start, k_lo, v_lo, count, -1)
                start = k_lo + 1
                k = start
                k_lo = start
                k_hi = start
                v_lo = y[k]
                v_hi = v_lo + 2.0 * lam
                u_lo = lam
                u_hi = -lam
            else:
                u_hi += y[k + 1] - v_hi
                if u_hi > lam:
                    count = _close_segment(x, segment, step, start, k_hi, v_hi, count, 1)
                    start = k_hi + 1
                    k = start
                    k_lo = start
                    k_hi = start
                    v_hi = y[k]
                    v_lo = v_hi - 2.0 * lam
                    u_lo = lam
                    u_hi = -lam
                else:
                    k += 1
                    if u_lo >= lam:
                        k_lo = k
                        v_lo += (u_lo - lam) / (k - start + 1)
                        u_lo = lam
                    if u_hi <= -lam:
                        k_hi = k
                        v_hi += (u_hi + lam) / (k - start + 1)
                        u_hi = -lam
    v_lo += u_lo / (k - start + 1)
    return _close_segment(x, segment, step, start, k, v_lo, count, 0)


@njit(cache=True)
def _tv1d_row(z, lam, x, group, sign, dlam, r):
    n = z.shape[1]
    cells = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        x[r, i] = -np.inf
        group[r, i] = -1
        sign[r, i] = 0.0
        dlam[r, i] = 0.0
        if z[r, i] > -np.inf:
            cells[m] = i
            m += 1
    if m == 0:
        return
    y = np.empty(m)
    for j in range(m):
        y[j] = z[r, cells[j]]
    xs = np.empty(m)
    segment = np.empty(m, dtype=np.int64)
    step = np.empty(m, dtype=np.int64)
    count = condat_tv1d(y, capped_lam(lam, y.min(), y.max(), m), xs, segment, step)
    size = np.zeros(count)
    for j in range(m):
        size[segment[j]] += 1.0
    for j in range(m):
        s = segment[j]
        i = cells[j]
        lower_minus_higher = (step[s - 1] if s > 0 else 0) - step[s]
        x[r, i] = xs[j]
        group[r, i] = s
        sign[r, i] = 1.0
        dlam[r, i] = -lower_minus_higher / size[s]


@njit(cache=True)
def _tv1d_serial(z, lam, x, group, sign, dlam):
    """Row-wise TV1D prox over the finite entries of z (rows, n); see GroupedProxFunction."""
    for r in range(z.shape[0]):
        _tv1d_row(z, lam, x, group, sign, dlam, r)


@njit(parallel=True, cache=True)
def _tv1d_parallel(z, lam, x, group, sign, dlam):
    for r in prange(z.shape[0]):
        _tv1d_row(z, lam, x, group, sign, dlam, r)


tv1d_rows = by_size(_tv1d_serial, _tv1d_parallel)


def tv1d_prox(
    z: Tensor, lam: float | Tensor, dim: int = -1, mask: Tensor | None = None
) -> Tensor:
    """Exact prox of lam * TV1D along ``dim`` (Condat, 2013), differentiable in z and lam.

    Backward: the group-average Jacobian of Niculae & Blondel (2017), Prop. 3, and
    d/d(lam) from the segments' closed form, never by unrolling the solver.

    Args:
        z: scores, any shape, float32 or float64. The kernel runs on the CPU in float64
            (numba; rows in parallel when numba has several threads); CUDA tensors make a
            round trip to the host.
        lam: strength >= 0, a float or a 0-dim tensor (gradient flows when it requires grad).
        dim: the dimension along which cells form a chain.
        mask: optional bool tensor broadcastable to ``z``. False cells and ``-inf`` scores
            leave the chain (their neighbours on either side become adjacent) and come out
            as ``-inf`` with zero gradient.

    Returns:
        The prox, ``z``'s shape and dtype; cells of one segment hold bitwise equal values.

    Raises:
        ValueError: lam < 0, NaN or ``+inf`` scores, or a row with every cell masked.
    """
    return grouped_prox(z, lam, dim, mask, "tv1d_prox", tv1d_rows)
