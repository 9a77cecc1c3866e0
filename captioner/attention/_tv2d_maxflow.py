"""Max-flow pieces of the exact 2-D TV prox (``_tv2d_prox``) on a 4-neighbour grid.

Cells are flattened row-major, n = H * W; neighbour tables have one row per cell and the four
directions left, right, up, down (the opposite of direction d is d ^ 1), -1 for "no edge".
Grid edges carry capacity lam both ways. The work arrays come in one
:class:`~captioner.attention._tv2d_prox.Workspace` ``ws``. All arithmetic is in float64.
"""

from __future__ import annotations

from numba import njit

from ._grouped import BORROWING


@njit(**BORROWING)
def _neighbours(active, H, W, nbr):
    """Fill nbr (n, 4) with the active 4-neighbours of each active cell (-1 where none)."""
    for r in range(H):
        for c in range(W):
            i = r * W + c
            nbr[i, 0] = i - 1 if c > 0 and active[i - 1] else -1
            nbr[i, 1] = i + 1 if c < W - 1 and active[i + 1] else -1
            nbr[i, 2] = i - W if r > 0 and active[i - W] else -1
            nbr[i, 3] = i + W if r < H - 1 and active[i + W] else -1
            if not active[i]:
                for d in range(4):
                    nbr[i, d] = -1


@njit(inline="always", **BORROWING)
def _sign(x):
    return (x > 0.0) - (x < 0.0)


@njit(**BORROWING)
def _heights(ws, order, lo, hi, sid, eps, stamp):
    """Global relabelling: height = the residual distance from each cell of the set to the
    nearest cell with a deficit, or m = hi - lo where none is reachable; then queue (a FIFO in
    ws.queue) the cells with excess that can still reach one. Returns (stamp, number queued)."""
    nbr, setid, exc, cap, visited = ws.nbr, ws.setid, ws.exc, ws.cap, ws.visited
    height, queued, queue = ws.height, ws.queued, ws.queue
    m = hi - lo
    stamp += 1
    qt = 0
    for k in range(lo, hi):
        i = order[k]
        height[i] = m
        if exc[i] < -eps:
            visited[i] = stamp
            height[i] = 0
            queue[qt] = i
            qt += 1
    qh = 0
    while qh < qt:  # breadth first, backwards along residual edges
        u = queue[qh]
        qh += 1
        for d in range(4):
            v = nbr[u, d]
            if v < 0 or visited[v] == stamp or cap[v, d ^ 1] <= eps or setid[v] != sid:
                continue
            visited[v] = stamp
            height[v] = height[u] + 1
            queue[qt] = v
            qt += 1
    qt = 0
    for k in range(lo, hi):
        i = order[k]
        active = (exc[i] > eps) & (height[i] < m)
        queued[i] = active
        queue[qt] = i
        qt += active
    return stamp, qt


@njit(**BORROWING)
def _push_relabel(ws, order, lo, hi, sid, eps, stamp):
    """Route the excess of the set setid == sid (cells order[lo:hi]) towards its deficits by
    push-relabel (Goldberg & Tarjan 1988), from the current preflow: FIFO selection, global
    relabelling at the start and every m / 2 relabels (Cherkassky & Goldberg 1997). Ends when
    all excess is routed or stuck at height m (no deficit reachable); _min_cut then finds the
    cut with one search. Returns stamp.

    The divide and conquer's sets at a large lam are large, their sources and sinks interleave
    and each edge carries only lam, so a max-flow takes hundreds of augmenting paths, each a
    search from all sources; push-relabel needs no search per path (with it, the divide and
    conquer ran 3-4x faster on 14 x 14 and 16 x 16 grids at lam 1).
    """
    nbr, setid, exc, cap = ws.nbr, ws.setid, ws.exc, ws.cap
    height, queued, queue = ws.height, ws.queued, ws.queue
    m = hi - lo
    n = queue.shape[0]
    stamp, count = _heights(ws, order, lo, hi, sid, eps, stamp)
    head = 0
    relabels = 0
    while count > 0:
        u = queue[head]
        head = head + 1 if head + 1 < n else 0
        count -= 1
        queued[u] = False
        while exc[u] > eps and height[u] < m:
            for d in range(4):
                v = nbr[u, d]
                if v < 0 or cap[u, d] <= eps or height[v] != height[u] - 1 or setid[v] != sid:
                    continue
                f = min(exc[u], cap[u, d])
                exc[u] -= f
                exc[v] += f
                cap[u, d] -= f
                cap[v, d ^ 1] += f
                if (exc[v] > eps) & (not queued[v]):
                    queued[v] = True
                    tail = head + count
                    queue[tail if tail < n else tail - n] = v
                    count += 1
                if exc[u] <= eps:
                    break
            if exc[u] <= eps:
                break
            # No admissible edge left: lift u just above its lowest residual neighbour.
            low = m
            for d in range(4):
                v = nbr[u, d]
                if v >= 0 and cap[u, d] > eps and setid[v] == sid:
                    low = min(low, height[v])
            height[u] = min(low + 1, m)
            relabels += 1
            if 2 * relabels >= m:
                relabels = 0
                stamp, count = _heights(ws, order, lo, hi, sid, eps, stamp)
                head = 0
                break
    return stamp


@njit(**BORROWING)
def _min_cut(ws, order, lo, hi, sid, eps, stamp):
    """Complete the max-flow on the set setid == sid (cells order[lo:hi]) from its current preflow.

    exc holds each cell's excess (z'_i - t plus net inflow), cap the residual capacities. Returns
    (stamp, |A|) where A, the cells with visited == stamp, are those still reachable from excess,
    the smallest minimiser of the level problem (the same set for every maximum flow).

    Direct pushes into neighbouring deficits first, then shortest augmenting paths, each found
    by one search from all cells with excess at once: quick when a few paths settle the set, as
    in the fast path's certificates. The divide and conquer runs _push_relabel first.
    """
    # Cheap first pass: push along single edges straight from a source into a neighbouring sink.
    nbr, setid, exc, cap, visited, parent = ws.nbr, ws.setid, ws.exc, ws.cap, ws.visited, ws.parent
    pdir, queue = ws.height, ws.queue  # height holds the search's directions here
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


@njit(**BORROWING)
def _tree_feasible(ws, r, lam, eps, stamp):
    """Route the residuals exc of group r (setid == r) to r along a BFS spanning tree.

    The flow on each tree edge is then the residual sum of the subtree below it; if none
    exceeds lam, this is a feasible flow (zero on the other edges) and the group is certified
    without a max-flow. Returns (stamp, feasible).
    """
    nbr, setid, exc, acc = ws.nbr, ws.setid, ws.exc, ws.acc
    visited, parent, queue = ws.visited, ws.parent, ws.queue
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
