"""TVmax on the CPU (numba): the exact prox of ``_tv2d_prox``, then sparsemax, per grid, in
one pass over the batch; and its backward pass (TVmax paper, Proposition 2, Algorithm 1).

Cells whose weight is surely zero are screened out before the prox (``_screen``), which
then solves only the rest of the grid: 3-4 of 64 or 196 cells for N(0, 1) scores at lam 0.01
to 0.1; 10% (lam 0.01) to 41% (lam 0.1) of the 16 x 16 cells for the demo's trained TVmax model.
Where more than 64 cells stay (a large lam on a large grid), min-cuts at levels below the
threshold pin more (``_screen_levels``): at lam 0.1 the trained grids keep 44 cells for a
support of 37, at lam 1 smooth 16 x 16 grids 22 of 253.

Grids are rows of flattened H x W cells; ``-inf`` marks an absent (masked) cell. Each kernel has
a serial driver and a prange-parallel one over slices of the batch (see ``_grouped.by_size``).
The forward drivers release the GIL, so that a background thread can solve while Python goes
on (``tvmax.tvmax_start``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ._grouped import BORROWING, capped_lam
from ._tv2d_maxflow import _min_cut, _neighbours, _push_relabel
from ._tv2d_prox import _REL_TOL, _gather_active, _prox_grid, _workspace

# Row-error kinds reported by the TVmax kernels (code = 3 * row + kind; -1 = all rows valid).
NAN, POS_INF, EMPTY = 0, 1, 2
# Cells left by _screen from which _screen_levels pays for its min-cuts, and its most steps.
LEVEL_SCREEN_MIN_CELLS = 65
LEVEL_STEPS = 4


class Scratch(NamedTuple):
    """Work arrays of the screening and the sparsemax of one grid of n cells."""

    low: np.ndarray  # (n,) float64: lower bound of each cell's prox value
    high: np.ndarray  # (n,) float64: upper bound of each cell's prox value
    insup: np.ndarray  # (n,) bool: sparsemax support
    cand: np.ndarray  # (n,) int32: cells still in the running for the support


@njit(cache=True)
def _scratch(n):
    """A Scratch for grids of n cells."""
    return Scratch(np.empty(n, np.float64), np.empty(n, np.float64), np.empty(n, np.bool_),
                   np.empty(n, np.int32))


@njit(**BORROWING)
def _sparsemax_threshold(sc, x, active, n):
    """(tau, xmax) with sparsemax(x) = max(x - xmax - tau, 0) over the active cells, exact, in
    float64; sc.insup marks the support.

    Michelot's algorithm (Condat 2016, Alg. 2; same fixed point as Martins & Astudillo's sort,
    Eq. 3-4): tau = (sum_S x - 1) / |S| over the current support S, then drop the cells at or
    below tau, until none drops. It may start from any superset of the support: here the cells
    within 1 of the maximum, as the maximum's weight xmax - tau is at most 1. The support only
    shrinks, so it ends within n passes. Values are shifted by their maximum first (which
    therefore stays in the support with weight > 0) so that huge scores keep an exact 1 / |S|
    scale; equal x give bitwise equal weights.
    """
    insup, cand = sc.insup, sc.cand
    xmax = -np.inf
    for i in range(n):
        if active[i] and x[i] > xmax:
            xmax = x[i]
    k = 0
    for i in range(n):
        insup[i] = False
        cand[k] = i
        k += active[i] & (x[i] - xmax > -1.0)
    while True:
        total = 0.0
        for t in range(k):
            total += x[cand[t]] - xmax
        tau = (total - 1.0) / k
        kept = 0
        for t in range(k):
            i = cand[t]
            cand[kept] = i
            kept += x[i] - xmax > tau
        if kept == k:
            break
        k = kept
    for t in range(k):
        insup[cand[t]] = True
    return tau, xmax


@njit(**BORROWING)
def _sparsemax_grid(sc, x, active, n, p, b):
    """p[b] = sparsemax of x over the active cells (0 elsewhere); see _sparsemax_threshold.
    Returns the threshold xmax + tau: weights are max(x - threshold, 0)."""
    tau, xmax = _sparsemax_threshold(sc, x, active, n)
    for i in range(n):
        p[b, i] = (x[i] - xmax) - tau if sc.insup[i] else 0.0
    return xmax + tau


@njit(**BORROWING)
def _screen(ws, sc, z, active, lam, H, W):
    """Take out of ``active`` the cells whose TVmax weight is surely 0; fill ws.outer.

    A safe screening rule (in the spirit of El Ghaoui et al., 2010, for the lasso) that leaves
    the result exact. By Proposition 1, TVmax(z) = sparsemax(x) with x = prox(z), and by Eq. 16
    (edge duals in [-1, 1]) each x_i lies within deg_i * lam of z_i, deg_i counting the cell's
    present neighbours. Sparsemax's threshold grows with its input, so it is at least tau_lo,
    the threshold of the lower bounds z_i - deg_i lam, and a cell whose upper bound
    z_i + deg_i lam is below tau_lo gets weight 0. With those cells pinned at 0, the others
    solve TVmax on their own subgraph at scores z_i - lam * (edges to pinned cells), since
    lam |p_i - 0| is linear in p_i >= 0: ws.outer holds minus that count, which the prox
    (``_tv2d_prox._prox_grid``) reads as lower neighbours in Eq. 8, so values, groups and
    d/dlam of the support are those of the whole grid. On the subgraph a cell's lower bound
    is unchanged and its upper bound drops by 2 lam per pinned neighbour (tau_lo is unchanged:
    the pinned cells lie below it), so pinning spreads until no upper bound falls below tau_lo.
    The cell with the largest lower bound is never pinned.

    z: (n,) float64 with the absent cells already out of ``active``. Leaves in ws.nbr the kept
    cells' kept neighbours, as ``_tv2d_prox._prox_grid`` reads them. Returns (level, margin,
    kept): level <= tau*, the threshold of TVmax's sparsemax, by more than the rounding margin;
    kept, the number of cells left in ``active``.
    """
    nbr, outer, kept, low, high = ws.nbr, ws.outer, ws.queue, sc.low, sc.high
    n = H * W
    _neighbours(active, H, W, nbr)
    amax = 0.0
    for i in range(n):
        deg = 0
        for d in range(4):
            deg += nbr[i, d] >= 0
        low[i] = z[i] - deg * lam
        high[i] = z[i] + deg * lam
        if active[i]:
            amax = max(amax, abs(z[i]))
    tau, xmax = _sparsemax_threshold(sc, low, active, n)
    # A margin well above the rounding of low, high and tau: near-ties stay in the problem.
    margin = _REL_TOL * n * (amax + 4 * lam * n)
    cut = xmax + tau - margin
    # Most cells go in the first pass; the few kept are then revisited until none goes.
    k = 0
    for i in range(n):
        outer[i] = 0
        kept[k] = i
        stays = active[i] & (high[i] >= cut)
        k += stays
        active[i] = stays
    dropped = True
    while dropped:
        dropped = False
        left = 0
        for t in range(k):
            i = kept[t]
            count = 0
            for d in range(4):
                j = nbr[i, d]
                if j >= 0 and not active[j]:
                    count += 1
                    nbr[i, d] = -1
            outer[i] -= count
            high[i] -= 2 * lam * count
            kept[left] = i
            stays = high[i] >= cut
            left += stays
            active[i] = stays
            dropped |= not stays
        k = left
    return cut, margin, k


@njit(**BORROWING)
def _pin_below(ws, z, active, lam, order, m, stamp):
    """Pin the cells of order[:m] not in A (visited == stamp) at 0, as _screen pins: fold each
    edge from A to a pinned cell into ws.outer (and its sub-eps residual into the excess, as
    the divide and conquer does), drop it from ws.nbr, and keep A's cells in order. Returns
    (|A|, sum over A of z + lam * outer after folding)."""
    nbr, exc, cap, visited, outer = ws.nbr, ws.exc, ws.cap, ws.visited, ws.outer
    kept = 0
    total = 0.0
    for k in range(m):
        i = order[k]
        if visited[i] != stamp:
            active[i] = False
            continue
        order[kept] = i
        kept += 1
        for d in range(4):
            j = nbr[i, d]
            if j >= 0 and visited[j] != stamp:
                outer[i] -= 1
                exc[i] -= cap[i, d]
                nbr[i, d] = -1
        total += z[i] + lam * outer[i]
    return kept, total


@njit(**BORROWING)
def _screen_levels(ws, z, active, lam, n, level, margin):
    """Pin the cells below a level t <= tau* found by Newton steps; returns the last level used
    to pin (-inf if none). A working set for the prox: its cost grows faster than the cells.

    For the prox x of the kept cells, f(t) = sum_i max(x_i - t, 0) is convex, piecewise linear
    and decreasing, and TVmax's threshold tau* solves f = 1. One min-cut at level t gives
    A = {x > t} (the smallest minimiser, as in the divide and conquer), and by Eq. 8 on the
    union A, sum_A x = sum_A z' - lam * cut(A), so f(t) = sum_A z' - lam cut(A) - t |A|. If
    f(t) >= 1, t <= tau*: the other cells have weight 0, and A alone solves the prox with its
    edges to them folded in as lower neighbours (ws.outer), as after _screen. Newton's step
    t + (f(t) - 1) / |A| stays <= tau* (f is convex) and is taken minus the margin. The caller
    certifies the result: the last level must lie below the threshold of the weights found.
    Starts from level (_screen's) with no flow; each step restarts from the flow found.
    """
    order, setid, exc, cap, visited = ws.order, ws.setid, ws.exc, ws.cap, ws.visited
    m, eps = _gather_active(ws, z, active, lam, n)
    # The prox keeps the sum of the scores z' = z + lam * outer of the kept cells, so f(t) >=
    # sum (x - t) = sum z' - t m, which is 1 at the level below: tau* is at least that too.
    total = 0.0
    for k in range(m):
        total += z[order[k]] + lam * ws.outer[order[k]]
    t = max(level, (total - 1.0) / m - margin)
    for k in range(m):
        i = order[k]
        setid[i] = 0
        visited[i] = 0
        exc[i] = z[i] + lam * ws.outer[i] - t
        for d in range(4):
            cap[i, d] = lam
    stamp = 0
    pinned = -np.inf
    for steps in range(LEVEL_STEPS):
        stamp = _push_relabel(ws, order, 0, m, 0, eps, stamp)
        stamp, na = _min_cut(ws, order, 0, m, 0, eps, stamp)
        if na == 0:  # only rounding leaves nothing above a level below tau*
            break
        before = m
        m, total = _pin_below(ws, z, active, lam, order, m, stamp)
        if m < before:
            pinned = t
        elif steps > 0:
            break  # f is linear since the last level: a new step would land where this one did
        f = total - t * m  # total is over A's folded scores: lam cut(A) is in it
        if f < 1.0 + margin:
            break  # t is within rounding of tau*
        step = (f - 1.0) / m - margin
        for k in range(m):
            exc[order[k]] -= step
        t += step
    return pinned


@njit(cache=True)
def _tvmax_rows_slice(z, lam_given, p, group, dlam, H, W, merge_rounds, start, stop):
    """Rows start..stop-1 of tvmax_rows; returns the first row-error code or -1."""
    n = H * W
    ws = _workspace(n)
    active = np.empty(n, np.bool_)
    zrow = np.empty(n, np.float64)
    xrow = np.empty(n, np.float64)
    sc = _scratch(n)
    for b in range(start, stop):
        m, low, high = 0, np.inf, -np.inf
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
                low, high = min(low, v), max(high, v)
        if m == 0:
            return 3 * b + EMPTY
        lam = capped_lam(lam_given, low, high, m)
        level, margin, kept = _screen(ws, sc, zrow, active, lam, H, W)
        pinned = -np.inf
        if kept >= LEVEL_SCREEN_MIN_CELLS and lam > 0.0:
            pinned = _screen_levels(ws, zrow, active, lam, n, level, margin)
        _prox_grid(ws, zrow, active, lam, n, xrow, group[b], dlam[b], merge_rounds)
        threshold = _sparsemax_grid(sc, xrow, active, n, p, b)
        if pinned > threshold - margin:
            # The certificate failed (rounding near tau*): solve the grid again without it.
            for i in range(n):
                active[i] = zrow[i] > -np.inf
            _screen(ws, sc, zrow, active, lam, H, W)
            _prox_grid(ws, zrow, active, lam, n, xrow, group[b], dlam[b], merge_rounds)
            _sparsemax_grid(sc, xrow, active, n, p, b)
        for i in range(n):
            if not active[i]:
                group[b, i] = -1
    return -1


@njit(cache=True, nogil=True)
def tvmax_rows_serial(z, lam, p, group, dlam, H, W, nchunks, merge_rounds):
    """TVmax = sparsemax(prox_{lam TV2D}) of a batch of flattened grids in one pass, exact.

    z: float32 or float64 (rows, H*W), read as float64, ``-inf`` = cell absent (no edges, zero
    weight); lam >= 0; nchunks and merge_rounds as in tv2d_prox_rows_serial. Fills p (rows,
    H*W, z's dtype), the weights; group (int32), each cell's fused group within its row (-1
    where absent, or screened out with weight 0 by _screen); dlam (float64), d prox / d lam
    (Eq. 8). Returns -1, or 3 * row + kind (NAN, POS_INF, EMPTY) for the first invalid row
    found, leaving the outputs incomplete.
    """
    return _tvmax_rows_slice(z, lam, p, group, dlam, H, W, merge_rounds, 0, z.shape[0])


@njit(cache=True, parallel=True, nogil=True)
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
