"""Numba kernels for the exact 2-D total-variation prox on a 4-neighbour grid.

Both paths below return the exact solution with exact groups: groups come from cuts or from a
certificate of the optimality conditions, never from comparing floats, and each group's value is
the closed form of Eq. 8 in the TVmax paper (Martins et al.), (sum z + lam * sum c) / |G| with c
the signed count of the group's boundary edges (+1 per neighbour above, -1 per neighbour below),
computed once per group: cells of one group hold bitwise identical values.

Fast path (``_guess_and_verify``): guess groups by merging neighbours whose order flips, compute
Eq. 8, and accept only if the optimality conditions (Eq. 16-17) hold: every edge between groups
keeps the sign it was computed with, and every group admits edge duals in [-1, 1] (a feasible
flow, checked on a spanning tree or by max-flow). Groups that fail are split along their
min-cut and the rounds go on; after a round limit the grid goes to the divide and conquer.

Divide and conquer by parametric min-cut (Hochbaum 2001; Chambolle & Darbon 2009). For a set S
of cells with modified scores z'_i = z_i + lam * c_i (c_i counting the edges to cells already
split off), the solution restricted to S is the prox of the grid restricted to S at z'. Its mean
over S is t = mean(z' over S) (edge terms inside S cancel), and {w > t} is the smallest minimiser
of sum_{i in A} (t - z'_i) + lam * cut(A, S \\ A), a min-cut. An empty minimiser means w is
constant on S; otherwise every edge across the cut goes strictly downwards, so both sides are
independent problems again, with the cut edges folded into c. The min-cut is a max-flow: cells
with excess z'_i - t > 0 are sources, cells with negative excess sinks, grid edges carry
capacity lam both ways; each side restarts from the flow already found.

Residuals at or below a rounding tolerance count as saturated (and values that close as tied),
so near-ties (values within ~1e-12 relative) are fused rather than split by rounding noise.

Layout: cells are flattened row-major, n = H * W; neighbour tables have one row per cell and the
four directions left, right, up, down (the opposite of direction d is d ^ 1), -1 for "no edge".
All arithmetic is in float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# Relative rounding tolerance of the flow (per cell of the set, times the scores' magnitude).
_REL_TOL = 1e-13
# Merge rounds the fast path may take before it leaves the grid to the divide and conquer.
MAX_MERGE_ROUNDS = 40


@njit(cache=True)
def _neighbours(active, H, W, nbr):
    """Fill nbr (n, 4) with the active 4-neighbours of each active cell (-1 where none)."""
    for i in range(H * W):
        r = i // W
        c = i - r * W
        nbr[i, 0] = i - 1 if c > 0 else -1
        nbr[i, 1] = i + 1 if c < W - 1 else -1
        nbr[i, 2] = i - W if r > 0 else -1
        nbr[i, 3] = i + W if r < H - 1 else -1
        for d in range(4):
            j = nbr[i, d]
            if not active[i] or (j >= 0 and not active[j]):
                nbr[i, d] = -1


@njit(cache=True)
def _min_cut(lo, hi, sid, order, nbr, setid, exc, cap, eps, stamp, visited, parent, pdir, queue):
    """Complete the max-flow on the set setid == sid (cells order[lo:hi]) from its current preflow.

    exc holds each cell's excess (z'_i - t plus net inflow), cap the residual capacities. Returns
    (stamp, |A|) where A, the cells with visited == stamp, are those still reachable from excess,
    the smallest minimiser of the level problem.
    """
    # Cheap first pass: push along single edges straight from a source into a neighbouring sink.
    for k in range(lo, hi):
        u = order[k]
        if exc[u] <= eps:
            continue
        for d in range(4):
            v = nbr[u, d]
            if v < 0 or exc[v] >= -eps or cap[u, d] <= eps or setid[v] != sid:
                continue
            f = min(exc[u], -exc[v], cap[u, d])
            exc[u] -= f
            exc[v] += f
            cap[u, d] -= f
            cap[v, d ^ 1] += f
            if exc[u] <= eps:
                break

    # Shortest augmenting paths from all remaining sources at once.
    while True:
        stamp += 1
        qt = 0
        for k in range(lo, hi):
            i = order[k]
            if exc[i] > eps:
                visited[i] = stamp
                parent[i] = -1
                queue[qt] = i
                qt += 1
        qh = 0
        found = -1
        while qh < qt and found < 0:
            u = queue[qh]
            qh += 1
            for d in range(4):
                v = nbr[u, d]
                if v < 0 or visited[v] == stamp or cap[u, d] <= eps or setid[v] != sid:
                    continue
                visited[v] = stamp
                parent[v] = u
                pdir[v] = d
                if exc[v] < -eps:
                    found = v
                    break
                queue[qt] = v
                qt += 1
        if found < 0:
            return stamp, qt
        f = -exc[found]
        v = found
        while parent[v] >= 0:
            f = min(f, cap[parent[v], pdir[v]])
            v = parent[v]
        f = min(f, exc[v])
        exc[v] -= f
        v = found
        exc[v] += f
        while parent[v] >= 0:
            d = pdir[v]
            cap[parent[v], d] -= f
            cap[v, d ^ 1] += f
            v = parent[v]


@njit(cache=True)
def _emit_groups(z, cnt, lam, nbr, order, lo, hi, sid, setid, queue, w, label, dlam, ngroups):
    """Close the set setid == sid: one group per connected component, value by Eq. 8."""
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


@njit(cache=True, inline="always")
def _sign(x):
    return (x > 0.0) - (x < 0.0)


@njit(cache=True)
def _merge_groups(a, b, lab, head, nxt, size, zsum, gfixed, nv):
    """Merge groups a and b (roots); the merged value estimate is their size-weighted mean."""
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


@njit(cache=True)
def _tree_feasible(r, nbr, setid, exc, lam, eps, stamp, visited, parent, queue, acc):
    """Route the residuals exc of group r (setid == r) to r along a BFS spanning tree.

    The flow on each tree edge is then the residual sum of the subtree below it; if none
    exceeds lam, this is a feasible flow (zero on the other edges) and the group is certified
    without a max-flow. Returns (stamp, feasible).
    """
    stamp += 1
    visited[r] = stamp
    queue[0] = r
    qt = 1
    qh = 0
    while qh < qt:
        u = queue[qh]
        qh += 1
        acc[u] = exc[u]
        for d in range(4):
            v = nbr[u, d]
            if v >= 0 and setid[v] == r and visited[v] != stamp:
                visited[v] = stamp
                parent[v] = u
                queue[qt] = v
                qt += 1
    for t in range(qt - 1, 0, -1):
        u = queue[t]
        if abs(acc[u]) > lam + eps:
            return stamp, False
        acc[parent[u]] += acc[u]
    return stamp, True


@njit(cache=True)
def _split_group(r, q, side_stamp, z, fixed, nbr, members, setid, visited, val, eps, lab, head,
                 nxt, size, zsum, gfixed, queue):
    """Split group r (cells members[:q]) into the connected parts of A (visited == side_stamp)
    and of the rest, with value estimates just above / below the group's for the next signs."""
    value = val[r]
    for t in range(q):
        lab[members[t]] = -1
    for t in range(q):
        root = members[t]
        if lab[root] != -1:
            continue
        upper = visited[root] == side_stamp
        lab[root] = root
        head[root] = root
        nxt[root] = -1
        size[root] = 1
        zsum[root] = z[root]
        gfixed[root] = fixed[root]
        val[root] = value + eps if upper else value - eps
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


@njit(cache=True)
def _guess_and_verify(z, lam, nbr, order, m, fixed, edge_a, edge_b, n_edges, eps, max_rounds, w,
                      label, dlam, lab, head, nxt, size, zsum, gfixed, bsum, val, nv, cnt,
                      members, roots, setid, exc, cap, visited, parent, pdir, queue, acc):
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
    for k in range(m):
        i = order[k]
        lab[i] = i
        head[i] = i
        nxt[i] = -1
        size[i] = 1
        zsum[i] = z[i]
        gfixed[i] = fixed[i]
        val[i] = z[i]
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
            _merge_groups(a, b, lab, head, nxt, size, zsum, gfixed, nv)
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
            cnt[i] = 0
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
                stamp, feasible = _tree_feasible(r, nbr, setid, exc, lam, eps, stamp, visited,
                                                 parent, queue, acc)
                if feasible:
                    continue
                for t2 in range(q):
                    for d in range(4):
                        cap[members[t2], d] = lam
                stamp, na = _min_cut(0, q, r, members, nbr, setid, exc, cap, eps, stamp,
                                     visited, parent, pdir, queue)
                if na == 0:
                    continue
            _split_group(r, q, stamp, z, fixed, nbr, members, setid, visited, val, eps, lab,
                         head, nxt, size, zsum, gfixed, queue)
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


@njit(cache=True)
def _prox_one(z, active, lam, H, W, w, label, dlam, nbr, cnt, setid, order, seg, exc, cap,
              visited, parent, pdir, queue, lab, head, nxt, size, zsum, bsum, val, nv, members,
              roots, acc, edge_a, edge_b, fixed, gfixed, merge_rounds):
    n = H * W
    _neighbours(active, H, W, nbr)
    ngroups = 0
    m = 0
    amax = 0.0
    for i in range(n):
        if active[i]:
            order[m] = i
            m += 1
            amax = max(amax, abs(z[i]))
        else:
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
            dlam[i] = g
        return
    # Residuals at or below eps count as saturated (and values closer than eps as tied), so
    # rounding noise never splits a group.
    eps = _REL_TOL * m * (amax + lam * 4 * m)
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
        fixed[i] = 0
    n_edges = 0
    for k in range(m):
        i = order[k]
        for d in range(1, 4, 2):  # right and down: each edge once
            j = nbr[i, d]
            if j < 0:
                continue
            diff = z[i] - z[j]
            # Branch-free: the outcome is unpredictable from edge to edge.
            is_fixed = abs(diff) > (cnt[i] + cnt[j]) * (lam + eps) + eps
            sg = _sign(diff) * is_fixed
            fixed[i] -= sg
            fixed[j] += sg
            edge_a[n_edges] = i
            edge_b[n_edges] = j
            n_edges += 1 - is_fixed
    if _guess_and_verify(z, lam, nbr, order, m, fixed, edge_a, edge_b, n_edges, eps,
                         merge_rounds, w, label, dlam, lab, head, nxt, size, zsum, gfixed, bsum,
                         val, nv, cnt, members, roots, setid, exc, cap, visited, parent, pdir,
                         queue, acc):
        return
    # Divide and conquer, from the whole active grid at its mean level with no flow yet.
    s = 0.0
    for k in range(m):
        i = order[k]
        s += z[i]
        cnt[i] = 0
        visited[i] = 0
        setid[i] = 0
    t = s / m
    for k in range(m):
        i = order[k]
        exc[i] = z[i] - t
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
            stamp, na = _min_cut(lo, hi, sid, order, nbr, setid, exc, cap, eps, stamp, visited,
                                 parent, pdir, queue)
        else:
            na = 0
        if na == 0 or na == hi - lo:
            ngroups = _emit_groups(z, cnt, lam, nbr, order, lo, hi, sid, setid, queue, w, label,
                                   dlam, ngroups)
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
def _workspace(n):
    """Work arrays of _prox_one for grids of n cells, reused from one grid to the next."""
    return (
        np.empty((n, 4), np.int32),  # nbr
        np.empty(n, np.int64),  # cnt
        np.empty(n, np.int32),  # setid
        np.empty(n, np.int32),  # order
        np.empty((n + 1, 2), np.int32),  # seg
        np.empty(n, np.float64),  # exc
        np.empty((n, 4), np.float64),  # cap
        np.empty(n, np.int64),  # visited
        np.empty(n, np.int32),  # parent
        np.empty(n, np.int8),  # pdir
        np.empty(n, np.int32),  # queue
        np.empty(n, np.int32),  # lab
        np.empty(n, np.int32),  # head
        np.empty(n, np.int32),  # nxt
        np.empty(n, np.int64),  # size
        np.empty(n, np.float64),  # zsum
        np.empty(n, np.int64),  # bsum
        np.empty(n, np.float64),  # val
        np.empty(n, np.float64),  # nv
        np.empty(n, np.int32),  # members
        np.empty(n, np.int32),  # roots
        np.empty(n, np.float64),  # acc
        np.empty(2 * n, np.int32),  # edge_a
        np.empty(2 * n, np.int32),  # edge_b
        np.empty(n, np.int64),  # fixed
        np.empty(n, np.int64),  # gfixed
    )


@njit(cache=True)
def _prox_grid(z, active, lam, H, W, w, label, dlam, ws, merge_rounds):
    """_prox_one with its work arrays taken from ws (see _workspace)."""
    (nbr, cnt, setid, order, seg, exc, cap, visited, parent, pdir, queue, lab, head, nxt, size,
     zsum, bsum, val, nv, members, roots, acc, edge_a, edge_b, fixed, gfixed) = ws
    _prox_one(z, active, lam, H, W, w, label, dlam, nbr, cnt, setid, order, seg, exc, cap,
              visited, parent, pdir, queue, lab, head, nxt, size, zsum, bsum, val, nv, members,
              roots, acc, edge_a, edge_b, fixed, gfixed, merge_rounds)


@njit(cache=True)
def _prox_rows_slice(z, lam, x, group, sign, dlam, H, W, merge_rounds, start, stop):
    """Rows start..stop-1 of tv2d_prox_rows, with one set of work arrays for all of them."""
    n = H * W
    ws = _workspace(n)
    active = np.empty(n, np.bool_)
    label = np.empty(n, np.int32)
    for b in range(start, stop):
        for i in range(n):
            active[i] = z[b, i] > -np.inf
        _prox_grid(z[b], active, lam, H, W, x[b], label, dlam[b], ws, merge_rounds)
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
        _prox_grid(zrow, active, lam, H, W, xrow, group[b], dlam[b], ws, merge_rounds)
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
