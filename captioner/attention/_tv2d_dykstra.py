"""TVmax on the GPU: proximal Dykstra over rows and columns, certified exact, in one Triton kernel.

One program per grid. prox_{lam TV2D} = prox of f + g with f = lam * (TV of every row) and
g = lam * (TV of every column), each an exact 1-D TV prox per line (Condat, 2013, one lane per
line). The Dykstra-like proximal algorithm (Combettes & Pesquet, 2011, "Proximal splitting
methods in signal processing", Alg. 10.18 with two functions) converges to it:

    y = prox_f(x + p),  p = x + p - y,  x = prox_g(y + q),  q = y + q - x,   x_0 = z, p = q = 0,

and keeps z = x + p + q, where p / lam and q / lam are the row and column prox's subgradients:
per line, the 1-D dual u of Condat's problem is minus their running sum, |u| <= 1.

Every ``CHECK_EVERY`` iterations the iterate is certified (TVmax paper, Eq. 8 and the optimality
conditions of the prox, Eq. 16-17):

1. fused groups: connected components of the edges inside a segment of the last row prox
   (horizontal) or of the last column prox (vertical), read as bitwise equal neighbours of
   its output (labels by propagation of the smallest cell index, with pointer jumps). The
   exact prox's groups are unions of such segments, and the 1-D proxes find them long before
   the iterate's values settle: fusing neighbours whose values differ by at most a tolerance
   instead both split true groups for many iterations (Dykstra's values approach each other
   linearly) and joined groups closer than the tolerance, which no number of iterations
   could certify;
2. each group's value from the closed form (Eq. 8), (sum z + lam * sum c) / |G|, c_i counting
   +1 per neighbour of another group above and -1 per one below, as the iterate orders them;
   every cell of a group reads the same number, so groups hold bitwise equal values;
3. every edge between two groups keeps its order, strictly, at those values;
4. the edges inside each group admit duals in [-1, 1]: Dykstra's duals u, clipped to [-1, 1],
   plus a correction routing the residual e_i = z_i + lam c_i - v_G - lam (div u)_i (which
   sums to 0 over G by Eq. 8) along a spanning tree of the group, which adds at most
   sum_G |e| / lam to an edge of the tree. So if the group stays connected through its inner
   edges with |u_e| + sum_G |e| / lam <= 1 (a tree of those carries the correction; the others
   keep their u), the exact prox has exactly these groups and values.

Rounding only ever makes the certificate stricter: the order of step 3 must hold by more than
ORDER_TOL (relative) and twice the rounding of the group values, and the bound of step 4 by the
most that rounding can move sum_G |e| / lam (the clipped u are exact: they are the floats the
residuals are computed with). A grid that rounding could decide goes to the exact CPU solver:
a slack of 1e-9 on the bound instead certified 1x2 grids whose gap exceeds 2 lam by less than
1e-9 lam as one group, with O(1) errors in their gradients.

A certified grid's weights are the sparsemax of the values (Michelot's algorithm: the support
only shrinks), written with each cell's group (its smallest cell index) and d prox / d lam
(Eq. 8: the group's sum of c over its size) for the backward pass. A grid that is not certified
within ``MAX_ROUNDS`` checks, or holds a non-finite score (masked cells, NaN), is flagged; the
caller solves those grids with the exact CPU solver.

Arithmetic is float64 inside; the per-group sums use atomic additions, so their rounding (not
the groups) may differ between runs in the last bits of float64.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Dykstra iterations between two certificate checks, and the most checks per grid. A kernel
# lasts as long as its slowest grid, but a grid left to the CPU costs a round trip to the host.
# The bound lets the trained models' smooth grids at lam up to 0.1 certify on the device, where
# they need more iterations than N(0, 1) grids.
CHECK_EVERY = 2
MAX_ROUNDS = 30
# The least relative gap between neighbouring groups that the certificate accepts as an order.
ORDER_TOL = 1e-9
# float64's machine epsilon, for the rounding bounds of the certificate.
EPS64 = 2.0**-52

# Status codes per grid.
CERTIFIED = tl.constexpr(0)
NOT_CERTIFIED = tl.constexpr(1)
NOT_FINITE = tl.constexpr(2)
# Scratch rows per grid: float64 (line input, line output, X, Y, U_h, U_v, group sums of z, of c,
# sizes, residuals) and int32 (segment starts, labels, fused right, fused down).
F_IN, F_OUT, F_X, F_Y, F_UH, F_UV, F_GZ, F_GC, F_GN, F_GE = (tl.constexpr(i) for i in range(10))
N_FSCRATCH = tl.constexpr(10)
I_START, I_LABEL, I_FR, I_FD = (tl.constexpr(i) for i in range(4))
N_ISCRATCH = tl.constexpr(4)


@triton.jit
def _tv1d_lines(src, dst, starts, lam, n_lines, length, line_stride, pos_stride,
                LANES: tl.constexpr, LEN: tl.constexpr):
    """Exact 1-D TV prox of n_lines lines of src into dst, one lane per line (Condat, 2013).

    Line l holds src[l * line_stride + j * pos_stride], j < length. The lanes run Condat's
    state machine in step, each branch a masked update; a closed segment writes its value at
    its first cell and marks it in ``starts``; a last pass spreads the values to the right.
    """
    lane = tl.arange(0, LANES)
    live = lane < n_lines
    base = lane * line_stride
    for j in range(0, LEN):
        tl.store(starts + base + j * pos_stride, 0, mask=live & (lane * 0 + j < length))
    # Each lane is held by several threads, in several warps; the reductions below may run
    # within each warp, so no warp may mark a segment start before every warp has cleared.
    tl.debug_barrier()
    k = tl.zeros([LANES], tl.int32)
    start = k
    k_lo = k
    k_hi = k
    first = tl.load(src + base, mask=live, other=0.0)
    v_lo = first - lam
    v_hi = first + lam
    u_lo = tl.zeros([LANES], tl.float64) + lam
    u_hi = -u_lo
    running = live
    last = length - 1
    while tl.max(running.to(tl.int32), axis=0) > 0:
        at_end = k == last
        nxt = tl.load(src + base + (k + 1) * pos_stride, mask=running & (k < last), other=0.0)
        u_lo_next = u_lo + nxt - v_lo
        u_hi_next = u_hi + nxt - v_hi
        low_break = u_lo_next < -lam
        high_break = (~low_break) & (u_hi_next > lam)
        down = running & (~at_end) & low_break
        up = running & (~at_end) & high_break
        advance = running & (~at_end) & (~low_break) & (~high_break)
        end_down = running & at_end & (u_lo < 0.0)
        end_up = running & at_end & (u_lo >= 0.0) & (u_hi > 0.0)
        finish = running & at_end & (u_lo >= 0.0) & (u_hi <= 0.0)
        close_lo = down | end_down
        close_hi = up | end_up
        restart = close_lo | close_hi

        size = (k - start + 1).to(tl.float64)
        value = tl.where(close_lo, v_lo, tl.where(close_hi, v_hi, v_lo + u_lo / size))
        closing = restart | finish
        tl.store(dst + base + start * pos_stride, value, mask=closing)
        tl.store(starts + base + start * pos_stride, 1, mask=closing)

        new_start = tl.where(close_lo, k_lo + 1, k_hi + 1)
        y_new = tl.load(src + base + new_start * pos_stride, mask=restart, other=0.0)
        size_next = (k + 2 - start).to(tl.float64)
        lo_hit = advance & (u_lo_next >= lam)
        hi_hit = advance & (u_hi_next <= -lam)

        # Advancing lanes: extend the segment by one cell, clamping the duals at the bounds.
        nv_lo = tl.where(lo_hit, v_lo + (u_lo_next - lam) / size_next, v_lo)
        nv_hi = tl.where(hi_hit, v_hi + (u_hi_next + lam) / size_next, v_hi)
        nu_lo = tl.where(lo_hit, lam, u_lo_next)
        nu_hi = tl.where(hi_hit, -lam, u_hi_next)
        nk_lo = tl.where(lo_hit, k + 1, k_lo)
        nk_hi = tl.where(hi_hit, k + 1, k_hi)
        # Lanes that closed a segment inside the line restart with a fresh one.
        inner = down | up
        nv_lo = tl.where(down, y_new, tl.where(up, y_new - 2.0 * lam, nv_lo))
        nv_hi = tl.where(down, y_new + 2.0 * lam, tl.where(up, y_new, nv_hi))
        nu_lo = tl.where(inner, lam, nu_lo)
        nu_hi = tl.where(inner, -lam, nu_hi)
        nk_lo = tl.where(inner, new_start, nk_lo)
        nk_hi = tl.where(inner, new_start, nk_hi)
        # Lanes at the right end close one side and keep the other's bound.
        nv_lo = tl.where(end_down, y_new, nv_lo)
        nu_lo = tl.where(end_down, lam, tl.where(end_up, y_new - lam - v_lo, nu_lo))
        nk_lo = tl.where(end_down, new_start, nk_lo)
        nv_hi = tl.where(end_up, y_new, nv_hi)
        nu_hi = tl.where(end_up, -lam, tl.where(end_down, y_new + lam - v_hi, nu_hi))
        nk_hi = tl.where(end_up, new_start, nk_hi)

        k = tl.where(advance, k + 1, tl.where(restart, new_start, k))
        start = tl.where(restart, new_start, start)
        v_lo = nv_lo
        v_hi = nv_hi
        u_lo = nu_lo
        u_hi = nu_hi
        k_lo = nk_lo
        k_hi = nk_hi
        running = running & (~finish)

    tl.debug_barrier()
    value = tl.zeros([LANES], tl.float64)
    for j in range(0, LEN):
        inside = live & (lane * 0 + j < length)
        offset = base + j * pos_stride
        is_start = tl.load(starts + offset, mask=inside, other=0)
        value = tl.where(is_start != 0, tl.load(dst + offset, mask=inside, other=0.0), value)
        tl.store(dst + offset, value, mask=inside)


@triton.jit
def _shifted(ptr, offs, step, valid, other):
    """ptr[offs + step] where ``valid``, else ``other`` (a neighbour's entry)."""
    return tl.load(ptr + offs + step, mask=valid, other=other)


@triton.jit
def _labels(lab, fused_r, fused_d, offs, r, c, inside, H, W):
    """Connected components of the fused edges: each cell's smallest cell index."""
    has_r = inside & (c < W - 1)
    has_d = inside & (r < H - 1)
    has_l = inside & (c > 0)
    has_u = inside & (r > 0)
    fr = _shifted(fused_r, offs, 0, has_r, 0) != 0
    fd = _shifted(fused_d, offs, 0, has_d, 0) != 0
    fl = _shifted(fused_r, offs, -1, has_l, 0) != 0
    fu = _shifted(fused_d, offs, -W, has_u, 0) != 0
    label = offs
    changed = tl.full([], 1, tl.int32)
    while changed > 0:
        tl.store(lab + offs, label, mask=inside)
        tl.debug_barrier()
        best = label
        best = tl.minimum(best, tl.where(fr, _shifted(lab, offs, 1, fr, 0), best))
        best = tl.minimum(best, tl.where(fd, _shifted(lab, offs, W, fd, 0), best))
        best = tl.minimum(best, tl.where(fl, _shifted(lab, offs, -1, fl, 0), best))
        best = tl.minimum(best, tl.where(fu, _shifted(lab, offs, -W, fu, 0), best))
        # Pointer jump: a label's own label is at most as large, and in the same component.
        best = tl.minimum(best, tl.load(lab + best, mask=inside, other=0))
        changed = tl.sum(((best != label) & inside).to(tl.int32))
        label = best
        tl.debug_barrier()
    return label


@triton.jit
def _tvmax_dykstra_kernel(z_ptr, lam_ptr, p_ptr, label_ptr, dlam_ptr, status_ptr, rounds_ptr,
                          fs_ptr, is_ptr, H, W, check_every, max_rounds, order_tol, eps,
                          BH: tl.constexpr, BW: tl.constexpr):
    grid = tl.program_id(0)
    lam = tl.load(lam_ptr)  # a float64 scalar (a Python float argument would be float32)
    n = H * W
    r = tl.arange(0, BH)[:, None]
    c = tl.arange(0, BW)[None, :]
    inside = (r < H) & (c < W)
    offs = r * W + c
    z = tl.load(z_ptr + grid * n + offs, mask=inside, other=0.0).to(tl.float64)
    fs = fs_ptr + grid * (N_FSCRATCH * n)
    ints = is_ptr + grid * (N_ISCRATCH * n)
    line_in = fs + F_IN * n
    line_out = fs + F_OUT * n
    starts = ints + I_START * n
    finite = tl.sum(((z == z) & (tl.abs(z) < float("inf")) | ~inside).to(tl.int32)) == BH * BW
    scale = 1.0 + tl.max(tl.where(inside, tl.abs(z), 0.0))
    # Rounding bounds (float64, at most n cells a group, |c| <= 4 a cell): of a group's value
    # (atomic sums of n terms, then one product and one division), and of sum_G |e| / lam
    # (each residual's 6 operations on terms below scale + 8 lam, the value's rounding, and the
    # sum of at most n of them, whose total the bound keeps below 1).
    value_err = (n + 3) * eps * (scale + 4.0 * lam)
    reach_err = n * ((value_err + 10.0 * eps * (scale + 8.0 * lam)) / lam + eps)
    order_slack = tl.maximum(order_tol * scale, 2.0 * value_err)

    has_r = inside & (c < W - 1)
    has_d = inside & (r < H - 1)
    has_l = inside & (c > 0)
    has_u = inside & (r > 0)
    x = z
    y = z
    p = tl.zeros([BH, BW], tl.float64)
    q = tl.zeros([BH, BW], tl.float64)
    status = tl.where(finite, NOT_CERTIFIED, NOT_FINITE).to(tl.int32)
    rounds = tl.full([], 0, tl.int32)
    while (status == NOT_CERTIFIED) & (rounds < max_rounds):
        for _ in range(check_every):
            tl.store(line_in + offs, x + p, mask=inside)
            tl.debug_barrier()
            _tv1d_lines(line_in, line_out, starts, lam, H, W, W, 1, BH, BW)
            tl.debug_barrier()
            y = tl.load(line_out + offs, mask=inside, other=0.0)
            p = x + p - y
            tl.store(line_in + offs, y + q, mask=inside)
            tl.debug_barrier()
            _tv1d_lines(line_in, line_out, starts, lam, W, H, 1, W, BW, BH)
            tl.debug_barrier()
            x = tl.load(line_out + offs, mask=inside, other=0.0)
            q = y + q - x
            tl.debug_barrier()
        rounds += 1

        # 1. Groups: the segments of the last row prox (y) and of the last column prox (x).
        xs = fs + F_X * n
        ys = fs + F_Y * n
        tl.store(xs + offs, x, mask=inside)
        tl.store(ys + offs, y, mask=inside)
        tl.debug_barrier()
        x_r = _shifted(xs, offs, 1, has_r, 0.0)
        x_d = _shifted(xs, offs, W, has_d, 0.0)
        fused_r = has_r & (_shifted(ys, offs, 1, has_r, 0.0) == y)
        fused_d = has_d & (x_d == x)
        tl.store(ints + I_FR * n + offs, fused_r.to(tl.int32), mask=inside)
        tl.store(ints + I_FD * n + offs, fused_d.to(tl.int32), mask=inside)
        tl.debug_barrier()
        labs = ints + I_LABEL * n
        label = _labels(labs, ints + I_FR * n, ints + I_FD * n, offs, r, c, inside, H, W)
        x_l = _shifted(xs, offs, -1, has_l, 0.0)
        x_u = _shifted(xs, offs, -W, has_u, 0.0)
        same_r = has_r & (_shifted(labs, offs, 1, has_r, -1) == label)
        same_d = has_d & (_shifted(labs, offs, W, has_d, -1) == label)
        same_l = has_l & (_shifted(labs, offs, -1, has_l, -1) == label)
        same_u = has_u & (_shifted(labs, offs, -W, has_u, -1) == label)
        # 2. Eq. 8 per group, with the signs of the iterate on the edges between groups.
        sgn_r = tl.where(has_r & ~same_r, tl.where(x_r > x, 1.0, -1.0), 0.0)
        sgn_d = tl.where(has_d & ~same_d, tl.where(x_d > x, 1.0, -1.0), 0.0)
        sgn_l = tl.where(has_l & ~same_l, tl.where(x_l > x, 1.0, -1.0), 0.0)
        sgn_u = tl.where(has_u & ~same_u, tl.where(x_u > x, 1.0, -1.0), 0.0)
        count = sgn_r + sgn_d + sgn_l + sgn_u
        gz = fs + F_GZ * n
        gc = fs + F_GC * n
        gn = fs + F_GN * n
        ge = fs + F_GE * n
        zero = tl.zeros([BH, BW], tl.float64)
        tl.store(gz + offs, zero, mask=inside)
        tl.store(gc + offs, zero, mask=inside)
        tl.store(gn + offs, zero, mask=inside)
        tl.store(ge + offs, zero, mask=inside)
        tl.debug_barrier()
        tl.atomic_add(gz + label, z, mask=inside)
        tl.atomic_add(gc + label, count, mask=inside)
        tl.atomic_add(gn + label, zero + 1.0, mask=inside)
        tl.debug_barrier()
        group_c = tl.load(gc + label, cache_modifier=".cg", mask=inside, other=0.0)
        group_n = tl.load(gn + label, cache_modifier=".cg", mask=inside, other=1.0)
        group_z = tl.load(gz + label, cache_modifier=".cg", mask=inside, other=0.0)
        value = (group_z + lam * group_c) / group_n
        # 3. The order between groups holds at these values.
        tl.store(xs + offs, value, mask=inside)
        tl.debug_barrier()
        order_ok = ((sgn_r == 0.0)
                    | ((_shifted(xs, offs, 1, has_r, 0.0) - value) * sgn_r > order_slack))
        order_ok &= ((sgn_d == 0.0)
                     | ((_shifted(xs, offs, W, has_d, 0.0) - value) * sgn_d > order_slack))
        # 4. Inner duals: Dykstra's, from the row and column subgradients p / lam and q / lam.
        uh = fs + F_UH * n
        uv = fs + F_UV * n
        # Clipped to [-1, 1]: what the clip takes off an edge joins the residuals of its cells.
        u_r = tl.minimum(tl.maximum(-tl.cumsum(p, axis=1) / lam, -1.0), 1.0)
        u_d = tl.minimum(tl.maximum(-tl.cumsum(q, axis=0) / lam, -1.0), 1.0)
        tl.store(uh + offs, u_r, mask=inside)
        tl.store(uv + offs, u_d, mask=inside)
        tl.debug_barrier()
        u_l = _shifted(uh, offs, -1, has_l, 0.0)
        u_u = _shifted(uv, offs, -W, has_u, 0.0)
        inner_div = (tl.where(same_l, u_l, 0.0) + tl.where(same_u, u_u, 0.0)
                     - tl.where(same_r, u_r, 0.0) - tl.where(same_d, u_d, 0.0))
        residual = tl.abs(z + lam * count - value - lam * inner_div)
        tl.atomic_add(ge + label, tl.where(inside, residual, 0.0), mask=inside)
        tl.debug_barrier()
        reach = tl.load(ge + label, cache_modifier=".cg", mask=inside, other=0.0) / lam
        # The correction runs along a spanning tree of the inner edges with room for it: the
        # group must stay connected through those "safe" edges alone.
        safe_r = same_r & (tl.abs(u_r) + reach + reach_err <= 1.0)
        safe_d = same_d & (tl.abs(u_d) + reach + reach_err <= 1.0)
        tl.store(ints + I_FR * n + offs, safe_r.to(tl.int32), mask=inside)
        tl.store(ints + I_FD * n + offs, safe_d.to(tl.int32), mask=inside)
        tl.debug_barrier()
        safe_label = _labels(labs, ints + I_FR * n, ints + I_FD * n, offs, r, c, inside, H, W)
        ok = tl.sum((~(order_ok & (safe_label == label)) & inside).to(tl.int32)) == 0
        if ok:
            status = CERTIFIED
            # Sparsemax of the values (Michelot): tau over the support until none drops.
            top = tl.max(tl.where(inside, value, -float("inf")))
            shifted = value - top
            support = inside
            tau = (tl.sum(tl.where(support, shifted, 0.0)) - 1.0) / tl.sum(support.to(tl.float64))
            dropped = tl.sum((support & (shifted <= tau)).to(tl.int32))
            while dropped > 0:
                support = support & (shifted > tau)
                tau = (tl.sum(tl.where(support, shifted, 0.0)) - 1.0) / tl.sum(
                    support.to(tl.float64))
                dropped = tl.sum((support & (shifted <= tau)).to(tl.int32))
            weights = tl.where(support, shifted - tau, 0.0)
            tl.store(p_ptr + grid * n + offs, weights.to(p_ptr.dtype.element_ty), mask=inside)
            tl.store(label_ptr + grid * n + offs, label, mask=inside)
            tl.store(dlam_ptr + grid * n + offs, group_c / group_n, mask=inside)
        tl.debug_barrier()
    tl.store(status_ptr + grid, status)
    tl.store(rounds_ptr + grid, rounds)


def tvmax_rows_dykstra(rows, lam, height: int, width: int):
    """Launch the kernel on ``rows`` (B, H*W), float32 or float64, on a GPU (or on the CPU
    under ``TRITON_INTERPRET=1``).

    ``lam`` is a float or a 0-dim tensor on the rows' device (read on the device: no sync).
    Returns (weights (B, H*W) of the rows' dtype, group int32 (B, H*W): the smallest cell
    index of each cell's fused group, dlam float64 (B, H*W), status int32 (B,), rounds int32
    (B,): certificate checks made); rows whose status is not CERTIFIED hold no result.
    """
    import torch

    batch, cells = rows.shape
    device = rows.device
    rows = rows.contiguous()
    if isinstance(lam, torch.Tensor):
        lam_value = lam.detach().to(device=device, dtype=torch.float64).reshape(1)
    else:
        lam_value = torch.full((1,), float(lam), dtype=torch.float64, device=device)
    weights = torch.empty_like(rows)
    group = torch.empty((batch, cells), dtype=torch.int32, device=device)
    dlam = torch.empty((batch, cells), dtype=torch.float64, device=device)
    status = torch.empty(batch, dtype=torch.int32, device=device)
    rounds = torch.empty(batch, dtype=torch.int32, device=device)
    float_scratch = torch.empty((batch, N_FSCRATCH * cells), dtype=torch.float64, device=device)
    int_scratch = torch.empty((batch, N_ISCRATCH * cells), dtype=torch.int32, device=device)
    block_h, block_w = triton.next_power_of_2(height), triton.next_power_of_2(width)
    _tvmax_dykstra_kernel[(batch,)](
        rows, lam_value, weights, group, dlam, status, rounds, float_scratch, int_scratch,
        height, width, CHECK_EVERY, MAX_ROUNDS, ORDER_TOL, EPS64,
        BH=block_h, BW=block_w, num_warps=4,
    )
    return weights, group, dlam, status, rounds
