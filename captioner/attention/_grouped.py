"""Shared machinery of the 1-D proximal operators whose Jacobian averages over groups.

The prox of 1-D TV (fused lasso) and of OSCAR are piecewise linear: near a point, their output
is constant on groups of cells, and the generalized Jacobian is (Niculae & Blondel, 2017,
Prop. 3) J_ij = s_i s_j / |G| for i, j in the same group G, 0 otherwise, with s_i = 1 for TV
and s_i = sign(z_i) for OSCAR; cells of OSCAR's zero group have zero rows. A kernel that solves
the prox also reports each cell's group, its sign and d(output)/d(lam), so the backward pass is
a single O(n) pass per row instead of an unrolled solver.

Masked cells (and ``-inf`` scores) leave the problem: the prox is solved on the remaining cells
in their order along ``dim`` and masked cells come out as ``-inf``, with zero gradient, so that
a following sparsemax gives them zero weight.

The kernels run on the CPU in float64: CUDA tensors are copied to the host and back. Each
kernel has a serial and a prange-parallel driver over rows. The parallel one runs when numba
has more than one thread and the batch is not tiny (below that, starting the threads costs
more than they save). On a machine whose cores are busy with other work the parallel driver's
spinning threads can cost more than the serial loop: run
with one numba thread there (``numba.set_num_threads(1)``, as ``captioner demo`` and the tests
do).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange
from numba.core.options import DefaultOptions
from torch import Tensor

from ._autograd import first_order_only
from ._checks import apply_mask, check_lam, check_scores, checked_max
from .sparsemax import sparsemax, sparsemax_as

# With more than one numba thread, batches of at least this many cells go through the
# parallel drivers.
PARALLEL_MIN_CELLS = 1 << 10

# njit options of the helpers below a row driver that allocate nothing and keep no array past
# the call. numba's developer flag ``_nrt=False`` compiles them without reference counting
# (allocating in one is then a compile error): their arrays are borrowed from the driver, which
# holds them for the call. Counted, every array a helper takes from a workspace tuple costs an
# atomic increment and decrement per call, 40% of TVmax's forward on N(0, 1) grids of 8 x 8
# (2.8 against 1.7 us a grid on one core). A numba without the flag counts them as usual.
BORROWING = {"cache": True, **({"_nrt": False} if hasattr(DefaultOptions, "_nrt") else {})}


@njit(cache=True)
def capped_lam(lam, low, high, m):
    """lam, or a smaller strength whose prox of TV (1-D or 2-D) equals lam's, for m cells whose
    scores span [low, high] (float64).

    On connected cells the prox is their mean, one group with d/dlam 0, once lam reaches the
    largest edge flow that carries the scores to their mean (the duals of Eq. 16 times lam):
    at most the sum of the positive deviations from the mean, m (high - low) / 2; beyond it
    nothing changes. So a lam of 1e308 need not overflow the solvers' arithmetic, nor one of
    1e16 drown the scores in rounding: the cap 2 m (high - low) (1 for equal scores) lies
    strictly above that bound for every connected part, so the groups, and the Jacobian, stay
    those of lam."""
    reach = 2.0 * m * (high - low)
    return min(lam, reach if reach > 0.0 else 1.0)


def by_size(serial, parallel):
    """A row kernel that runs ``parallel`` when numba has several threads and the batch holds
    at least :data:`PARALLEL_MIN_CELLS` cells, ``serial`` otherwise.

    Both take the (rows, n) input array first and the same further arguments; ``run`` returns
    what the kernel returns.
    """

    def run(z, *args):
        use_parallel = z.size >= PARALLEL_MIN_CELLS and numba.get_num_threads() > 1
        return (parallel if use_parallel else serial)(z, *args)

    run.__doc__ = serial.__doc__
    return run


@njit(cache=True)
def _group_average_row(grad, group, sign, out, r):
    n = grad.shape[1]
    sums = np.zeros(n)
    counts = np.zeros(n)
    for i in range(n):
        g = group[r, i]
        if g >= 0:
            sums[g] += sign[r, i] * grad[r, i]
            counts[g] += 1.0
    for i in range(n):
        g = group[r, i]
        out[r, i] = sign[r, i] * sums[g] / counts[g] if g >= 0 else 0.0


@njit(cache=True)
def _group_average_serial(grad, group, sign, out):
    """out_i = s_i * mean_{j in G(i)} s_j grad_j per row; 0 where group == -1 (all (rows, n))."""
    for r in range(grad.shape[0]):
        _group_average_row(grad, group, sign, out, r)


@njit(parallel=True, cache=True)
def _group_average_parallel(grad, group, sign, out):
    for r in prange(grad.shape[0]):
        _group_average_row(grad, group, sign, out, r)


group_average_rows = by_size(_group_average_serial, _group_average_parallel)


class GroupedProxFunction(torch.autograd.Function):
    """Row-wise grouped prox of ``z`` (rows, n) with the group-average backward.

    ``solver(z, lam, x, group, sign, dlam)`` is a numba kernel over float64 (rows, n) arrays
    that treats ``-inf`` entries as absent and fills: x, the prox (-inf where absent); group,
    the group index of each cell within its row (-1: absent or zero Jacobian row); sign, s_i;
    dlam, d x_i / d lam.
    """

    @staticmethod
    def forward(ctx, z: Tensor, lam: float | Tensor, solver, func: str) -> Tensor:
        z_host = z.detach().to(device="cpu", dtype=torch.float64).contiguous().numpy()
        x = np.empty_like(z_host)
        group = np.empty(z_host.shape, dtype=np.int64)
        sign = np.empty_like(z_host)
        dlam = np.empty_like(z_host)
        solver(z_host, float(lam), x, group, sign, dlam)
        if not np.all(np.isfinite(x) | np.isneginf(z_host)):
            # Finite scores near float64's limit overflow the prox's sums of them (a fused
            # group's mean): said here, not as +inf scores of the sparsemax that follows.
            top = np.abs(z_host[np.isfinite(z_host)]).max()
            raise ValueError(f"{func}: scores of magnitude up to {top:.3g} overflow the sums of "
                             "its prox in float64; scale them down")
        ctx.save_for_backward(torch.from_numpy(group), torch.from_numpy(sign),
                              torch.from_numpy(dlam))
        ctx.lam_like = lam if isinstance(lam, Tensor) else None
        return torch.from_numpy(x).to(device=z.device, dtype=z.dtype)

    @staticmethod
    @first_order_only
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        group, sign, dlam = ctx.saved_tensors
        grad_host = grad.detach().to(device="cpu", dtype=torch.float64).contiguous()
        grad_z = grad_lam = None
        if ctx.needs_input_grad[0]:
            out = np.empty(grad_host.shape)
            group_average_rows(grad_host.numpy(), group.numpy(), sign.numpy(), out)
            grad_z = torch.from_numpy(out).to(device=grad.device, dtype=grad.dtype)
        if ctx.needs_input_grad[1]:
            lam = ctx.lam_like
            grad_lam = (grad_host * dlam).sum().to(device=lam.device, dtype=lam.dtype)
        return grad_z, grad_lam, None, None


def grouped_prox(
    z: Tensor, lam: float | Tensor, dim: int, mask: Tensor | None, func: str, solver
) -> Tensor:
    """Validate, mask, and apply a grouped prox kernel along ``dim`` of ``z`` (any shape)."""
    dim = check_scores(z, dim, func)
    lam = check_lam(lam, func)
    z = apply_mask(z, mask, func)
    checked_max(z, dim, func)
    moved = z.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    out = GroupedProxFunction.apply(rows, lam, solver, func)
    return out.reshape(moved.shape).movedim(-1, dim)


def is_zero(lam: float | Tensor) -> bool:
    """lam == 0 with no gradient wanted: the prox is the identity and can be skipped."""
    if isinstance(lam, Tensor):
        return not lam.requires_grad and float(lam.detach()) == 0.0
    return lam == 0


def sparsemax_of_prox(solver, z: Tensor, lam, dim: int, mask: Tensor | None, func: str) -> Tensor:
    """sparsemax(prox(z, lam)) along ``dim``, the prox given by its row ``solver`` (see
    :class:`GroupedProxFunction`): fusedmax and oscarmax (Niculae & Blondel, 2017, Prop. 2),
    validated under the name ``func``; lam = 0 is exactly sparsemax."""
    dim = check_scores(z, dim, func)
    lam = check_lam(lam, func)
    if is_zero(lam):
        return sparsemax_as(z, dim, mask, func)
    return sparsemax(grouped_prox(z, lam, dim, mask, func, solver), dim=dim)
