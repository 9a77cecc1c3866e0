"""The exact 2-D total-variation prox on a 4-neighbour grid (numba, CPU).

Both paths below return the exact solution with exact groups: groups come from cuts or from a
certificate of the optimality conditions, never from comparing floats, and each group's value is
the closed form of Eq. 8 in the TVmax paper (Martins et al.), (sum z + lam * sum c) / |G| with c
the signed count of the group's boundary edges (+1 per neighbour above, -1 per neighbour below),
computed once per group: cells of one group hold bitwise identical values.

Fast path (``_guess_and_verify``): guess groups by merging neighbours whose order flips, compute
Eq. 8, and accept only if the optimality conditions (Eq. 16-17) hold: every edge between groups
keeps the sign it was computed with, and every group admits edge duals in [-1, 1] (a feasible
flow, checked on a spanning tree or by max-flow). Groups that fail are split along their
min-cut and the rounds go on; after a round limit the grid goes to the divide and conquer, and
grids with mostly free edges (FAST_PATH_MAX_FREE_EDGES) go straight to it.

Divide and conquer by parametric min-cut (Hochbaum 2001; Chambolle & Darbon 2009). For a set S
of cells with modified scores z'_i = z_i + lam * c_i (c_i counting the edges to cells already
split off), the solution restricted to S is the prox of the grid restricted to S at z'. Its mean
over S is t = mean(z' over S) (edge terms inside S cancel), and {w > t} is the smallest minimiser
of sum_{i in A} (t - z'_i) + lam * cut(A, S \\ A), a min-cut. An empty minimiser means w is
constant on S; otherwise every edge across the cut goes strictly downwards, so both sides are
independent problems again, with the cut edges folded into c. The min-cut is a max-flow: cells
with excess z'_i - t > 0 are sources, cells with negative excess sinks, grid edges carry
capacity lam both ways (push-relabel on large sets, then augmenting paths, ``_tv2d_maxflow``);
each side restarts from the flow already found.

Residuals at or below a rounding tolerance count as saturated (and values that close as tied),
so near-ties (values within ~1e-12 relative) are fused rather than split by rounding noise.

Layout: cells are flattened row-major, n = H * W (see ``_tv2d_maxflow`` for the neighbour
tables and the flows). A grid's work arrays live in one :class:`Workspace`, reused from grid to
grid. All arithmetic is in float64. TVmax itself (prox, then sparsemax, and its backward pass)
is in ``_tvmax_kernels``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ._grouped import BORROWING, capped_lam
from ._tv2d_maxflow import _min_cut, _neighbours, _push_relabel, _sign, _tree_feasible

# Relative rounding tolerance of the flow (per cell of the set, times the scores' magnitude).
_REL_TOL = 1e-13
# Merge rounds the fast path may take before it leaves the grid to the divide and conquer.
MAX_MERGE_ROUNDS = 40
# Free edges (sign not fixed by Eq. 16) per active cell above which the fast path is skipped: a
# grid has at most 2 edges per cell, and when most are free (lam large against the scores'
# spread) groups grow large, merging takes many rounds and certifying them takes min-cuts, so
# the divide and conquer is faster.
FAST_PATH_MAX_FREE_EDGES = 1.5
# Sets of the divide and conquer from this size on route their flow by push-relabel before the
# min-cut's augmenting paths (``_tv2d_maxflow._push_relabel``); smaller ones take a few paths.
PUSH_RELABEL_MIN_CELLS = 33


class Workspace(NamedTuple):
    """Work arrays of the prox of one grid of n cells (numba passes it as one tuple)."""

    nbr: np.ndarray  # (n, 4) int32: neighbour cell per direction, -1 for none
    cnt: np.ndarray  # (n,) int64: signed count of edges to cells of other groups or sets
    setid: np.ndarray  # (n,) int32: the set (divide and conquer) or group (certificate)
    order: np.ndarray  # (n,) int32: active cells, grouped by set
    seg: np.ndarray  # (n + 1, 2) int32: stack of [lo, hi) ranges of order still to cut
    exc: np.ndarray  # (n,) float64: excess of the flow at each cell
    cap: np.ndarray  # (n, 4) float64: residual capacity per direction
    visited: np.ndarray  # (n,) int64: search stamps
    parent: np.ndarray  # (n,) int32: search tree
    height: np.ndarray  # (n,) int32: push-relabel heights
    queued: np.ndarray  # (n,) bool: in push-relabel's queue of cells with excess
    queue: np.ndarray  # (n,) int32
    lab: np.ndarray  # (n,) int32: group root of each cell (fast path)
    head: np.ndarray  # (n,) int32: first member of each group (linked list)
    nxt: np.ndarray  # (n,) int32: next member
    size: np.ndarray  # (n,) int64: group sizes
    zsum: np.ndarray  # (n,) float64: group sums of the scores
    bsum: np.ndarray  # (n,) int64: group sums of the edge signs
    val: np.ndarray  # (n,) float64: group values
    nv: np.ndarray  # (n,) float64: next group values
    members: np.ndarray  # (n,) int32: the cells of one group
    roots: np.ndarray  # (n,) int32: the groups to certify
    acc: np.ndarray  # (n,) float64: subtree sums of the residuals
    edge_a: np.ndarray  # (2 n,) int32: first cell of each edge examined
    edge_b: np.ndarray  # (2 n,) int32: second cell
    fixed: np.ndarray  # (n,) int64: signed count of each cell's edges of fixed sign
    gfixed: np.ndarray  # (n,) int64: group sums of fixed
    outer: np.ndarray  # (n,) int64: minus the count of each cell's edges to screened cells


@njit(cache=True)
def _workspace(n):
    """A Workspace for grids of n cells."""
    return Workspace(
        np.empty((n, 4), np.int32), np.empty(n, np.int64), np.empty(n, np.int32),
        np.empty(n, np.int32), np.empty((n + 1, 2), np.int32), np.empty(n, np.float64),
        np.empty((n, 4), np.float64), np.empty(n, np.int64), np.empty(n, np.int32),
        np.empty(n, np.int32), np.empty(n, np.bool_), np.empty(n, np.int32), np.empty(n, np.int32),
        np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int64),
        np.empty(n, np.float64), np.empty(n, np.int64), np.empty(n, np.float64),
        np.empty(n, np.float64), np.empty(n, np.int32), np.empty(n, np.int32),
        np.empty(n, np.float64), np.empty(2 * n, np.int32), np.empty(2 * n, np.int32),
        np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64),
    )


@njit(**BORROWING)
def _emit_groups(ws, z, lam, lo, hi, sid, w, label, dlam, ngroups):
    """Close the set setid == sid: one group per connected component, value by Eq. 8."""
    nbr, cnt, setid, order, queue = ws.nbr, ws.cnt, ws.setid, ws.order, ws.queue
    for k in range(lo, hi):
        root = order[k]
        if setid[root] != sid:
            continue
        setid[root] = -1
        queue[0] = root
        qt = 1
        qh = 0
        s = 0.0
        c = 0
        while qh < qt:
            u = queue[qh]
            qh += 1
            s += z[u]
            c += cnt[u]
            for d in range(4):
                v = nbr[u, d]
                if v >= 0 and setid[v] == sid:
                    setid[v] = -1
                    queue[qt] = v
                    qt += 1
        value = (s + lam * c) / qt
        slope = c / qt
        for q in range(qt):
            u = queue[q]
            w[u] = value
            label[u] = ngroups
            dlam[u] = slope
        ngroups += 1
    return ngroups


@njit(**BORROWING)
def _merge_groups(ws, a, b):
    """Merge groups a and b (roots); the merged value estimate is their size-weighted mean."""
    lab, head, nxt, size, zsum, nv = ws.lab, ws.head, ws.nxt, ws.size, ws.zsum, ws.nv
    gfixed = ws.gfixed
    if size[a] < size[b]:
        a, b = b, a
    nv[a] = (nv[a] * size[a] + nv[b] * size[b]) / (size[a] + size[b])
    u = head[b]
    last = u
    while u >= 0:
        lab[u] = a
        last = u
        u = nxt[u]
    nxt[last] = head[a]
    head[a] = head[b]
    size[a] += size[b]
    zsum[a] += zsum[b]
    gfixed[a] += gfixed[b]


@njit(inline="always", **BORROWING)
def _singleton(ws, z, i, value):
    """Make cell i a group of its own (root i) with value estimate ``value``."""
    ws.lab[i] = i
    ws.head[i] = i
    ws.nxt[i] = -1
    ws.size[i] = 1
    ws.zsum[i] = z[i]
    ws.gfixed[i] = ws.fixed[i]
    ws.val[i] = value


@njit(**BORROWING)
def _split_group(ws, z, r, q, side_stamp, eps):
    """Split group r (cells members[:q]) into the connected parts of A (visited == side_stamp)
    and of the rest, with value estimates just above / below the group's for the next signs."""
    nbr, setid, visited, queue, lab, head = ws.nbr, ws.setid, ws.visited, ws.queue, ws.lab, ws.head
    nxt, size, zsum, val, members, fixed = ws.nxt, ws.size, ws.zsum, ws.val, ws.members, ws.fixed
    gfixed = ws.gfixed
    value = val[r]
    for t in range(q):
        lab[members[t]] = -1
    for t in range(q):
        root = members[t]
        if lab[root] != -1:
            continue
        upper = visited[root] == side_stamp
        _singleton(ws, z, root, value + eps if upper else value - eps)
        queue[0] = root
        qh = 0
        qt = 1
        while qh < qt:
            u = queue[qh]
            qh += 1
            for d in range(4):
                v = nbr[u, d]
                if v < 0 or setid[v] != r or lab[v] != -1 or (visited[v] == side_stamp) != upper:
                    continue
                lab[v] = root
                nxt[v] = head[root]
                head[root] = v
                size[root] += 1
                zsum[root] += z[v]
                gfixed[root] += fixed[v]
                queue[qt] = v
                qt += 1


@njit(**BORROWING)
def _guess_and_verify(ws, z, lam, m, n_edges, eps, max_rounds, w, label, dlam):
    """Fast path: guess the groups by merging and splitting, certify them by the optimality
    conditions, and write the result; False when no certified guess came within max_rounds.

    Start from singletons. Each round computes every group's Eq. 8 value with the signs of the
    current estimates and merges neighbouring groups whose order flips (or nearly ties). At a
    fixed point the values agree with the signs they were computed from; they are then the
    exact prox iff every group also admits edge duals in [-1, 1] (Eq. 16-17 of the paper): a
    feasible flow of the residuals z_i + lam c_i - value over the group's inner edges, capacity
    lam each, i.e. a trivial min-cut. A group whose min-cut is not trivial is split along it
    and the rounds go on.
    """
    nbr, cnt, setid, order, exc, cap = ws.nbr, ws.cnt, ws.setid, ws.order, ws.exc, ws.cap
    visited, lab, head, nxt, size, zsum = ws.visited, ws.lab, ws.head, ws.nxt, ws.size, ws.zsum
    bsum, val, nv, members, roots, acc = ws.bsum, ws.val, ws.nv, ws.members, ws.roots, ws.acc
    edge_a, edge_b, gfixed, outer = ws.edge_a, ws.edge_b, ws.gfixed, ws.outer
    for k in range(m):
        i = order[k]
        _singleton(ws, z, i, z[i] + lam * outer[i])
        visited[i] = 0
    stamp = 0
    for _ in range(max_rounds):
        for k in range(m):
            bsum[order[k]] = gfixed[order[k]]
        for e in range(n_edges):
            a = lab[edge_a[e]]
            b = lab[edge_b[e]]
            sg = _sign(val[a] - val[b])  # 0 inside a group
            bsum[a] -= sg
            bsum[b] += sg
        # Every cell rather than only the roots: non-roots' entries are never read, and the
        # test lab[i] == i would cost a mispredicted branch per cell once groups form.
        for k in range(m):
            i = order[k]
            nv[i] = (zsum[i] + lam * bsum[i]) / size[i]
        merged = False
        for e in range(n_edges):
            a = lab[edge_a[e]]
            b = lab[edge_b[e]]
            if a == b:
                continue
            new = nv[a] - nv[b]
            if ((val[a] - val[b]) * new > 0.0) & (abs(new) > eps):
                continue
            _merge_groups(ws, a, b)
            merged = True
        for k in range(m):
            i = order[k]
            val[i] = nv[i]
        if merged:
            continue

        # Certify every group of two or more cells: its residuals must route inside it.
        nroots = 0
        for k in range(m):
            i = order[k]
            cnt[i] = outer[i]
            setid[i] = lab[i]
            roots[nroots] = i
            nroots += (lab[i] == i) & (size[i] > 1)
        # All edges here, fixed ones too: one inside a group is a free dual, not a sign.
        for k in range(m):
            i = order[k]
            for d in range(1, 4, 2):
                j = nbr[i, d]
                if j >= 0:
                    sg = _sign(val[lab[i]] - val[lab[j]])
                    cnt[i] -= sg
                    cnt[j] += sg
        # The values must come from the signs they now have on every edge (fixed ones too).
        for k in range(m):
            acc[order[k]] = 0.0
        for k in range(m):
            i = order[k]
            acc[lab[i]] += cnt[i]
        for k in range(m):
            i = order[k]
            if (lab[i] == i) & (acc[i] != bsum[i]):
                return False
        split = False
        for t in range(nroots):
            r = roots[t]
            u = head[r]
            q = 0
            while u >= 0:
                members[q] = u
                exc[u] = z[u] + lam * cnt[u] - val[r]
                q += 1
                u = nxt[u]
            if q == 2:
                if abs(exc[members[0]]) <= lam + eps:
                    continue
                stamp += 1
                visited[members[0] if exc[members[0]] > 0 else members[1]] = stamp
            else:
                stamp, feasible = _tree_feasible(ws, r, lam, eps, stamp)
                if feasible:
                    continue
                for t2 in range(q):
                    for d in range(4):
                        cap[members[t2], d] = lam
                stamp, na = _min_cut(ws, members, 0, q, r, eps, stamp)
                if na == 0:
                    continue
            _split_group(ws, z, r, q, stamp, eps)
            split = True
        if split:
            continue

        ngroups = 0
        for k in range(m):
            i = order[k]
            head[i] = ngroups  # read back for roots only
            ngroups += lab[i] == i
        for k in range(m):
            i = order[k]
            r = lab[i]
            w[i] = val[r]
            label[i] = head[r]
            dlam[i] = bsum[r] / size[r]
        return True
    return False


@njit(inline="always", **BORROWING)
def _gather_active(ws, z, active, lam, n):
    """Put the active cells in ws.order; returns their count m and the flow's rounding
    tolerance eps: residuals at or below it count as saturated (and values closer as tied), so
    rounding noise never splits a group."""
    m = 0
    amax = 0.0
    for i in range(n):
        if active[i]:
            ws.order[m] = i
            m += 1
            amax = max(amax, abs(z[i]))
    return m, _REL_TOL * m * (amax + lam * 4 * m)


@njit(**BORROWING)
def _prox_grid(ws, z, active, lam, n, w, label, dlam, merge_rounds):
    """Exact prox of one grid z (float64, n cells; ``active`` False = absent cell) into w,
    with each cell's group index in label and d w / d lam in dlam: the fast path
    (``_guess_and_verify``, up to merge_rounds rounds, unless most edges are free), else divide
    and conquer by min-cuts.

    ws.nbr holds the active cells' active neighbours (``_neighbours``); rows of absent cells
    are not read. ws.outer[i] is minus the count of cell i's edges to absent cells pinned
    below it (TVmax's screening, ``_tvmax_kernels._screen``): they enter Eq. 8 as lower
    neighbours, so this is the prox of the active cells at scores z + lam * outer. Zero for
    the plain prox."""
    nbr, cnt, setid, order, seg, exc = ws.nbr, ws.cnt, ws.setid, ws.order, ws.seg, ws.exc
    cap, visited, edge_a, edge_b, fixed = ws.cap, ws.visited, ws.edge_a, ws.edge_b, ws.fixed
    outer = ws.outer
    ngroups = 0
    m, eps = _gather_active(ws, z, active, lam, n)
    for i in range(n):
        if not active[i]:
            w[i] = z[i]
            dlam[i] = 0.0
    if m == 0:
        return
    if lam == 0.0:
        # Identity, each cell its own group; d/dlam is the right derivative at lam = 0+ for
        # distinct neighbours: +1 per higher neighbour, -1 per lower one.
        for k in range(m):
            i = order[k]
            w[i] = z[i]
            label[i] = ngroups
            ngroups += 1
            g = 0.0
            for d in range(4):
                j = nbr[i, d]
                if j >= 0:
                    if z[j] > z[i]:
                        g += 1.0
                    elif z[j] < z[i]:
                        g -= 1.0
            dlam[i] = g + outer[i]
        return
    # A cell's prox value stays within deg * lam of its score (Eq. 16, duals in [-1, 1]), so an
    # edge whose scores differ by more than both cells' reach keeps its order: its sign is
    # fixed (folded into the cells' counts) and only the other edges are examined.
    for k in range(m):
        i = order[k]
        deg = 0
        for d in range(4):
            if nbr[i, d] >= 0:
                deg += 1
        cnt[i] = deg
        fixed[i] = outer[i]
    n_edges = 0
    for k in range(m):
        i = order[k]
        for d in range(1, 4, 2):  # right and down: each edge once
            j = nbr[i, d]
            if j < 0:
                continue
            diff = (z[i] + lam * outer[i]) - (z[j] + lam * outer[j])
            # Branch-free: the outcome is unpredictable from edge to edge.
            is_fixed = abs(diff) > (cnt[i] + cnt[j]) * (lam + eps) + eps
            sg = _sign(diff) * is_fixed
            fixed[i] -= sg
            fixed[j] += sg
            edge_a[n_edges] = i
            edge_b[n_edges] = j
            n_edges += 1 - is_fixed
    if n_edges <= FAST_PATH_MAX_FREE_EDGES * m and _guess_and_verify(
            ws, z, lam, m, n_edges, eps, merge_rounds, w, label, dlam):
        return
    # Divide and conquer, from the whole active grid at its mean level with no flow yet.
    s = 0.0
    for k in range(m):
        i = order[k]
        s += z[i] + lam * outer[i]
        cnt[i] = outer[i]
        visited[i] = 0
        setid[i] = 0
    t = s / m
    for k in range(m):
        i = order[k]
        exc[i] = z[i] + lam * cnt[i] - t
        for d in range(4):
            cap[i, d] = lam
    nseg = 1
    seg[0, 0] = 0
    seg[0, 1] = m
    next_id = 1
    stamp = 0
    while nseg > 0:
        nseg -= 1
        lo = seg[nseg, 0]
        hi = seg[nseg, 1]
        sid = setid[order[lo]]
        if hi - lo > 1:
            if hi - lo >= PUSH_RELABEL_MIN_CELLS:
                stamp = _push_relabel(ws, order, lo, hi, sid, eps, stamp)
            stamp, na = _min_cut(ws, order, lo, hi, sid, eps, stamp)
        else:
            na = 0
        if na == 0 or na == hi - lo:
            ngroups = _emit_groups(ws, z, lam, lo, hi, sid, w, label, dlam, ngroups)
            continue
        # Every edge across the cut is saturated downwards from A: fold it into the counts (and
        # its sub-eps residual into the excesses), so the flow inside each side stays valid.
        for k in range(lo, hi):
            u = order[k]
            if visited[u] != stamp:
                continue
            for d in range(4):
                v = nbr[u, d]
                if v >= 0 and setid[v] == sid and visited[v] != stamp:
                    cnt[u] -= 1
                    cnt[v] += 1
                    exc[u] -= cap[u, d]
                    exc[v] += cap[u, d]
        a = lo
        b = hi - 1
        sa = 0.0
        sb = 0.0
        while a <= b:
            i = order[a]
            if visited[i] == stamp:
                sa += z[i] + lam * cnt[i]
                a += 1
            else:
                sb += z[i] + lam * cnt[i]
                order[a] = order[b]
                order[b] = i
                b -= 1
        # Each side restarts from the flow found so far, its excesses moved to its own mean level.
        shift = (sa + sb) / (hi - lo) - sa / (a - lo)
        for k in range(lo, a):
            setid[order[k]] = next_id
            exc[order[k]] += shift
        shift = (sa + sb) / (hi - lo) - sb / (hi - a)
        for k in range(a, hi):
            setid[order[k]] = next_id + 1
            exc[order[k]] += shift
        next_id += 2
        seg[nseg, 0] = lo
        seg[nseg, 1] = a
        seg[nseg + 1, 0] = a
        seg[nseg + 1, 1] = hi
        nseg += 2


@njit(cache=True)
def _prox_rows_slice(z, lam, x, group, sign, dlam, H, W, merge_rounds, start, stop):
    """Rows start..stop-1 of tv2d_prox_rows, with one set of work arrays for all of them."""
    n = H * W
    ws = _workspace(n)
    active = np.empty(n, np.bool_)
    label = np.empty(n, np.int32)
    for b in range(start, stop):
        m, low, high = 0, np.inf, -np.inf
        for i in range(n):
            active[i] = z[b, i] > -np.inf
            if active[i]:
                m += 1
                low, high = min(low, z[b, i]), max(high, z[b, i])
        _neighbours(active, H, W, ws.nbr)
        _prox_grid(ws, z[b], active, capped_lam(lam, low, high, m), n, x[b], label, dlam[b],
                   merge_rounds)
        for i in range(n):
            group[b, i] = label[i] if active[i] else -1
            sign[b, i] = 1.0


@njit(cache=True)
def tv2d_prox_rows_serial(z, lam, x, group, sign, dlam, H, W, nchunks, merge_rounds):
    """Exact prox of lam * TV2D for a batch of grids flattened row-major, in place.

    z: float64 (rows, H*W), ``-inf`` = cell absent (no edges); lam >= 0; nchunks: how many
    slices of the batch run in parallel (the parallel driver only); merge_rounds: round limit
    of the fast path (MAX_MERGE_ROUNDS; 0 = divide and conquer only). Fills, all (rows, H*W):
    x, the prox (-inf where absent); group (int64), the index of each cell's fused group within
    its row, groups connected and maximal (-1 where absent); sign, 1 (the Jacobian is a plain
    group average); dlam, d x / d lam, the group's signed boundary count over its size (Eq. 8).
    """
    _prox_rows_slice(z, lam, x, group, sign, dlam, H, W, merge_rounds, 0, z.shape[0])


@njit(cache=True, parallel=True)
def tv2d_prox_rows_parallel(z, lam, x, group, sign, dlam, H, W, nchunks, merge_rounds):
    """tv2d_prox_rows_serial with the batch cut into nchunks slices run in parallel."""
    rows = z.shape[0]
    nchunks = max(1, min(rows, nchunks))
    for ch in prange(nchunks):
        _prox_rows_slice(z, lam, x, group, sign, dlam, H, W, merge_rounds,
                         ch * rows // nchunks, (ch + 1) * rows // nchunks)
