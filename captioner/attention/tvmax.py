"""TVmax: sparse attention fused over 2-D regions of the image grid (Martins et al., TVmax paper).

TVmax(z) = argmin_{p in simplex} 1/2 ||p - z||^2 + lam * TV2D(p) over the H x W grid, with
TV2D(p) = sum_ij |p_ij - p_i,j+1| + |p_ij - p_i+1,j| (anisotropic, 4-neighbour). By Proposition 1
it is sparsemax(prox_{lam TV2D}(z)). The prox is solved exactly on the CPU by certified merges
or parametric min-cuts (``_tv2d_prox``, ``_tvmax_kernels``); CUDA scores go there too, unless
``solver="device"`` picks certified proximal Dykstra on the GPU (``_tv2d_dykstra``, Triton),
whose uncertified grids go to the CPU solver. With ``overlap=True``, :func:`tvmax_start` runs
the CPU solver in a background thread while the caller goes on. Both are settings of
:class:`TVMax`, so a model's config and checkpoint record them. Its
Jacobian averages over the fused groups (Proposition 2, Eq. 9; Algorithm 1) and its derivative
in lam is each group's signed boundary count over its size (Eq. 8), so lam can be learned.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache, partial

import numba
import numpy as np
import torch
from torch import Tensor, nn

from ._autograd import first_order_only
from ._checks import (
    apply_mask,
    check_lam,
    check_mask,
    check_scores,
    checked_max,
    half_in_float32,
    rows_are_grids,
)
from ._grouped import by_size, grouped_prox, is_zero
from ._softplus import inverse_softplus
from ._triton import triton_installed
from ._tv2d_prox import MAX_MERGE_ROUNDS, tv2d_prox_rows_parallel, tv2d_prox_rows_serial
from ._tvmax_kernels import (
    tvmax_backward_rows_parallel,
    tvmax_backward_rows_serial,
    tvmax_rows_parallel,
    tvmax_rows_serial,
)
from .sparsemax import sparsemax_as, sparsemax_jvp

# Serial with one numba thread or a tiny batch, else parallel over grids (_grouped.by_size).
_tv2d_prox_rows = by_size(tv2d_prox_rows_serial, tv2d_prox_rows_parallel)
_tvmax_rows = by_size(tvmax_rows_serial, tvmax_rows_parallel)
_tvmax_backward_rows = by_size(tvmax_backward_rows_serial, tvmax_backward_rows_parallel)
# The kernels read and write these dtypes directly; others go through float64.
_KERNEL_DTYPES = (torch.float32, torch.float64)
# The forward pass of CUDA scores: "host", the exact CPU solver (a round trip per call), or
# "device", certified Dykstra on the GPU (Triton), whose uncertified grids go to the host. The
# backward pass runs on the device either way; CPU scores always take the CPU solver. "host" is
# the default: the device kernel lasts as long as its slowest grid, and on smooth (trained)
# scores many grids fail its certificate and cross to the host anyway (docs/attention.md,
# "TVmax solvers on a GPU"; `captioner bench attention --device cuda` times both).
SOLVERS = ("host", "device")
# Grids solved by the device solver, and how many of them its certificate left to the CPU.
DEVICE_STATS = {"grids": 0, "fallback": 0}


def _environment_override(name: str, choices: dict[str, object], told: str) -> object | None:
    """The setting environment variable ``name`` gives (one of ``choices``, ``told`` so), or
    None when it is unset."""
    value = os.environ.get(name)
    if value is not None and value not in choices:
        raise ValueError(f"{name} must be {told}, got {value!r}")
    return None if value is None else choices[value]


# For benchmarks that time one model with each setting: when set, these environment variables
# override every TVMax's own solver and overlap settings (the benchmarks print which held).
SOLVER_OVERRIDE = _environment_override("CAPTIONER_TVMAX_SOLVER", {s: s for s in SOLVERS},
                                        f"one of {SOLVERS}")
OVERLAP_OVERRIDE = _environment_override("CAPTIONER_TVMAX_OVERLAP", {"0": False, "1": True},
                                         "0 or 1")


def solver_in_force(solver: str) -> str:
    """``solver`` ("host" or "device"), unless CAPTIONER_TVMAX_SOLVER overrides it."""
    if solver not in SOLVERS:
        raise ValueError(f"tvmax: solver must be one of {SOLVERS}, got {solver!r}")
    return SOLVER_OVERRIDE or solver
# One host kernel at a time: a background solve and a call from the caller's thread would
# otherwise share numba's thread pool, which its workqueue threading layer does not allow.
_HOST_KERNEL = threading.Lock()


def _solve_on_host(z: np.ndarray, lam: float, height: int, width: int, p: np.ndarray,
                   group: np.ndarray, dlam: np.ndarray) -> int:
    """The exact CPU kernel on rows z (B, H*W): fills the weights p (z's dtype), each cell's
    group (int32) and d prox / d lam (float64); returns the kernel's code (>= 0: a bad row)."""
    with _HOST_KERNEL:
        return _tvmax_rows(z, lam, p, group, dlam, height, width, numba.get_num_threads(),
                           MAX_MERGE_ROUNDS)


def _solve_host_rows(rows: Tensor, lam: float, grid_shape: torch.Size, *, pinned: bool):
    """((weights, group int32, dlam float64), code) of the CPU rows (B, H*W) of a kernel
    dtype, by the exact CPU kernel; the results in page-locked memory if ``pinned``."""
    results = tuple(torch.empty(rows.shape, dtype=dtype, pin_memory=pinned)
                    for dtype in (rows.dtype, torch.int32, torch.float64))
    code = _solve_on_host(rows.numpy(), lam, *grid_shape[-2:],
                          *(result.numpy() for result in results))
    return results, code


def _kernel_dtype(z: Tensor) -> torch.dtype:
    """The dtype the kernels read z in: its own, or float64."""
    return z.dtype if z.dtype in _KERNEL_DTYPES else torch.float64


def _raise_invalid(z: Tensor, grid_shape: torch.Size, code: int) -> None:
    """Raise the ValueError describing the scores, rows indexed as the caller's."""
    with rows_are_grids():
        checked_max(z.detach().cpu().view(grid_shape).flatten(-2), -1, "tvmax")
    raise RuntimeError(f"tvmax: the kernel rejected row {code // 3} of valid scores")


def _solve_rows(z, lam, x, group, sign, dlam, *, height: int, width: int) -> None:
    _tv2d_prox_rows(
        z, lam, x, group, sign, dlam, height, width, numba.get_num_threads(), MAX_MERGE_ROUNDS
    )


def _check_grid(z: Tensor, func: str) -> None:
    check_scores(z, -1, func, min_dim=2)
    if z.shape[-2] == 0:
        raise ValueError(f"{func}: scores have an empty grid dimension (shape {tuple(z.shape)})")


def tv2d_prox(z: Tensor, lam: float | Tensor, mask: Tensor | None = None) -> Tensor:
    """prox_{lam TV2D}(z) = argmin_w 1/2 ||w - z||^2 + lam * TV2D(w), per H x W grid, exact.

    Exact: fused groups come from a guess certified by the optimality conditions or, failing
    that, from parametric min-cuts (divide and conquer), never from comparing floats; each
    group's value is the closed form of Eq. 8, so all cells of a group hold bitwise identical
    values and 4-neighbours are equal iff they are fused (ties closer than ~1e-12 fuse).
    Backward: the mean of the incoming gradient over each fused group (Eq. 9); d/dlam from
    Eq. 8 when ``lam`` is a tensor that requires grad.

    Args:
        z: scores (..., H, W), float32 or float64, any number of leading dimensions. The solver
            runs on the CPU (numba, float64, parallel over the grids); CUDA tensors make a host
            round trip and come back on their device.
        lam: TV strength >= 0, a float or a 0-dim tensor; lam = 0 is the identity.
        mask: optional bool tensor broadcastable to ``z``, True = cell takes part. Masked cells
            and ``-inf`` scores leave the grid graph (no edges to them) and come out as
            ``-inf`` with zero gradient.

    Returns:
        The prox, same shape, dtype and device as ``z``.

    Raises:
        ValueError: rank < 2, NaN or ``+inf`` scores, lam < 0, a grid with every cell masked.
    """
    return _prox_flat(z, lam, mask, "tv2d_prox").unflatten(-1, z.shape[-2:])


def _prox_flat(z: Tensor, lam: float | Tensor, mask: Tensor | None, func: str) -> Tensor:
    """The prox of each grid of z (..., H, W), flattened to (..., H*W) (validated here)."""
    _check_grid(z, func)
    height, width = z.shape[-2:]
    flat_mask = None if mask is None else check_mask(mask, z.shape, func).flatten(-2)
    solver = partial(_solve_rows, height=height, width=width)
    with rows_are_grids():  # its checks name a grid of z, not a row of the flattened scores
        return grouped_prox(z.flatten(-2), lam, -1, flat_mask, func, solver)


class TVmaxFunction(torch.autograd.Function):
    """sparsemax(prox_{lam TV2D}(z)) of rows of flattened grids in one kernel, and its backward.

    Forward: the exact prox and the sparsemax of each grid (``tvmax_rows``), which also checks
    the scores. Backward: the sparsemax Jacobian-vector product, its mean over each fused group
    and the lam gradient (Eq. 8), also in one kernel. ``z`` is (rows, H*W), the caller's scores
    of shape ``grid_shape`` (..., H, W) flattened; ``solved``, when given, the kernel's
    (weights, group, dlam) of those rows, already computed (:func:`tvmax_start`). For CPU
    tensors (see :class:`TVmaxDeviceFunction` for CUDA tensors).
    """

    @staticmethod
    def forward(ctx, z: Tensor, lam: float | Tensor, grid_shape: torch.Size,
                solved: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        if solved is None:
            rows = z.detach().to(device="cpu", dtype=_kernel_dtype(z)).contiguous()
            solved, code = _solve_host_rows(rows, float(lam), grid_shape, pinned=False)
            if code >= 0:
                _raise_invalid(rows, grid_shape, code)
        weights, group, dlam = solved
        ctx.save_for_backward(weights)
        ctx.group, ctx.dlam = group.numpy(), dlam.numpy()
        ctx.lam_like = lam if isinstance(lam, Tensor) else None
        return weights.to(device=z.device, dtype=z.dtype)

    @staticmethod
    @first_order_only
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        (weights,) = ctx.saved_tensors
        grad_host = grad.detach().to(device="cpu", dtype=weights.dtype).contiguous().numpy()
        grad_z = np.empty_like(grad_host)
        grad_rows = np.empty(grad_host.shape[0])
        _tvmax_backward_rows(grad_host, weights.numpy(), ctx.group, ctx.dlam, grad_z, grad_rows)
        grad_lam = None
        if ctx.needs_input_grad[1]:
            lam = ctx.lam_like
            grad_lam = torch.tensor(grad_rows.sum(), dtype=lam.dtype, device=lam.device)
        grad_z = torch.from_numpy(grad_z).to(device=grad.device, dtype=grad.dtype)
        return grad_z, grad_lam, None, None


class TVmaxDeviceFunction(torch.autograd.Function):
    """TVmaxFunction for CUDA tensors: the backward pass runs on the device.

    Forward: with ``solver="device"`` (and Triton), ``tvmax_rows_dykstra`` solves every grid
    on the device, and only the grids its certificate leaves (or that hold masked or invalid
    scores) cross to the exact CPU kernel; reading which ones is the one sync. Without it,
    every grid makes the host round trip (:func:`_round_trip`), whose copy to the host is the
    one sync; under no_grad only the weights are copied back. ``solved``, when given, holds
    the results already on the device (:func:`tvmax_start`): no solve, no sync. Backward, on
    the device either way, with no sync: the sparsemax Jacobian-vector
    product, its mean over each fused group (Algorithm 1) and the lam gradient (Eq. 8), in one
    Triton kernel (``_tvmax_backward_triton``) or, without Triton or for grids of more than
    its ``MAX_CELLS`` cells, in PyTorch operations.
    """

    @staticmethod
    def forward(ctx, z: Tensor, lam: float | Tensor, grid_shape: torch.Size,
                solved: tuple[Tensor, Tensor, Tensor] | None = None,
                solver: str = "host") -> Tensor:
        dtype = z.dtype
        if solved is None:
            # Under no_grad (beam search) only the weights come back from the host.
            backward = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
            solved = _solve_on_device(z.detach().to(_kernel_dtype(z)), lam, grid_shape, backward,
                                      solver)
        ctx.save_for_backward(*solved)
        ctx.lam_like = lam if isinstance(lam, Tensor) else None
        return solved[0].to(dtype)

    @staticmethod
    @first_order_only
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        weights, group, dlam = ctx.saved_tensors
        want_lam = ctx.needs_input_grad[1]
        if _use_backward_kernel(grad):
            from ._tvmax_backward_triton import tvmax_backward_rows

            grad_z, grad_lam = tvmax_backward_rows(grad, weights, group, dlam, want_lam)
        else:
            grad_z, grad_lam = _backward_rows(grad, weights, group, dlam, want_lam)
        if grad_lam is not None:
            lam = ctx.lam_like
            grad_lam = grad_lam.to(dtype=lam.dtype, device=lam.device)
        return grad_z, grad_lam, None, None, None


def _use_backward_kernel(grad: Tensor) -> bool:
    """Whether the backward pass takes the Triton kernel: CUDA rows of at most its MAX_CELLS
    cells, when Triton is installed."""
    from ._tvmax_backward_triton import MAX_CELLS

    return grad.is_cuda and grad.shape[-1] <= MAX_CELLS and triton_installed()


def _backward_rows(grad: Tensor, weights: Tensor, group: Tensor, dlam: Tensor,
                   want_lam: bool) -> tuple[Tensor, Tensor | None]:
    """The backward pass of ``_tvmax_backward_triton`` in PyTorch operations (its docstring)."""
    v = sparsemax_jvp(grad.to(torch.float64), weights > 0, -1)
    present = group >= 0  # -1: a masked cell, or one screened out with weight 0
    index = group.clamp_min(0).long()
    sums = torch.zeros_like(v).scatter_add_(1, index, v)
    sizes = torch.zeros_like(v).scatter_add_(1, index, present.to(v.dtype))
    grad_z = torch.where(present, sums.gather(1, index) / sizes.gather(1, index), 0.0)
    return grad_z.to(grad.dtype), (v * dlam).sum() if want_lam else None


def _solve_on_device(z: Tensor, lam: float | Tensor, grid_shape: torch.Size, backward: bool,
                     solver: str):
    """(weights, group int32, dlam float64) of the rows of z (B, H*W), all on z's device, by
    ``solver`` (see :data:`SOLVERS`); without ``backward`` (no gradient wanted), the host
    solver returns the weights alone."""
    if solver_in_force(solver) == "host":
        return _round_trip(z, lam, z, grid_shape, backward)
    if not triton_installed():
        raise RuntimeError(
            "tvmax: the device solver needs Triton (it ships with torch's CUDA wheels; "
            "pip install triton), or use solver host"
        )
    from ._tv2d_dykstra import tvmax_rows_dykstra

    weights, group, dlam, status, _ = tvmax_rows_dykstra(z, lam, *grid_shape[-2:])
    left = torch.nonzero(status).flatten()  # the one sync
    DEVICE_STATS["grids"] += z.shape[0]
    DEVICE_STATS["fallback"] += left.numel()
    if left.numel():
        weights[left], group[left], dlam[left] = _round_trip(z[left], lam, z, grid_shape, True)
    return weights, group, dlam


def _round_trip(rows: Tensor, lam: float | Tensor, z: Tensor, grid_shape: torch.Size,
                backward: bool):
    """(weights, group int32, dlam float64) of ``rows`` (B, H*W), some or all rows of the
    caller's ``z`` (named if a row is invalid), by the exact CPU kernel, back on their device;
    the weights alone without ``backward``. The copy to the host is the sync; the kernel
    writes into page-locked buffers, whose copies back do not wait for the device."""
    results, code = _solve_host_rows(rows.cpu(), float(lam), grid_shape, pinned=rows.is_cuda)
    if code >= 0:
        _raise_invalid(z, grid_shape, code)
    return tuple(result.to(rows.device, non_blocking=True)
                 for result in (results if backward else results[:1]))


@half_in_float32
def tvmax(z: Tensor, lam: float | Tensor, mask: Tensor | None = None, *,
          solver: str = "host") -> Tensor:
    """TVmax(z) = sparsemax over the H*W cells of prox_{lam TV2D}(z) (Proposition 1).

    Sparse attention weights that are constant on connected regions of the grid. Backward:
    the sparsemax Jacobian-vector product at the prox output, then its mean over each fused
    group (Proposition 2, Algorithm 1); differentiable in ``lam`` (Eq. 8).

    Args:
        z: scores (..., H, W), float32 or float64 (float16 and bfloat16 in float32). On the
            CPU the prox and the sparsemax run in one numba kernel (float64 inside). CUDA
            tensors make a host round trip for the forward pass, or with ``solver="device"``
            run one Triton kernel (certified Dykstra, float64 inside) and cross to the host
            only for grids it leaves uncertified or that hold masked cells; their backward
            pass runs on the GPU either way.
        lam: TV strength >= 0 (float or 0-dim tensor); lam = 0 is exactly sparsemax.
        mask: optional bool tensor broadcastable to ``z``, True = cell may receive attention.
            Masked cells (and ``-inf`` scores) take no part in the grid graph and get exactly
            0 weight and 0 gradient.
        solver: the forward solver of CUDA scores, "host" or "device" (:data:`SOLVERS`);
            CAPTIONER_TVMAX_SOLVER overrides it.

    Returns:
        Weights (..., H, W) summing to 1 over each grid, same dtype and device as ``z``; cells
        of one fused group hold bitwise identical weights.

    Raises:
        ValueError: rank < 2, NaN or ``+inf`` scores, lam < 0, a grid with every cell masked.
    """
    _check_grid(z, "tvmax")
    lam = check_lam(lam, "tvmax")
    solver = solver_in_force(solver)
    if is_zero(lam):
        flat_mask = None if mask is None else check_mask(mask, z.shape, "tvmax").flatten(-2)
        with rows_are_grids():  # its checks name a grid of z, not a row of the flattened scores
            weights = sparsemax_as(z.flatten(-2), -1, flat_mask, "tvmax")
        return weights.unflatten(-1, z.shape[-2:])
    height, width = z.shape[-2:]
    rows = apply_mask(z, mask, "tvmax").reshape(-1, height * width)
    if rows.is_cuda:
        return TVmaxDeviceFunction.apply(rows, lam, z.shape, None, solver).view(z.shape)
    return TVmaxFunction.apply(rows, lam, z.shape).view(z.shape)


@contextmanager
def overlap_set_to(on: bool | None) -> Iterator[None]:
    """Inside, every TVmax overlaps (True), or not (False), whatever its own setting, as
    CAPTIONER_TVMAX_OVERLAP=1 (or 0) has it; None: each its own. For a benchmark of both in one
    process."""
    global OVERLAP_OVERRIDE
    before, OVERLAP_OVERRIDE = OVERLAP_OVERRIDE, on
    try:
        yield
    finally:
        OVERLAP_OVERRIDE = before


def overlaps(device: torch.device, overlap: bool = False, solver: str = "host") -> bool:
    """Whether :func:`tvmax_start` of scores on ``device`` with these settings solves in a
    background thread: with ``overlap`` (or CAPTIONER_TVMAX_OVERLAP=1), unless the device
    solver takes CUDA scores."""
    overlap = overlap if OVERLAP_OVERRIDE is None else OVERLAP_OVERRIDE
    return overlap and not (solver_in_force(solver) == "device" and device.type == "cuda")


def tvmax_start(z: Tensor, lam: float | Tensor, *, overlap: bool = False,
                solver: str = "host") -> Callable[[], Tensor]:
    """Begin :func:`tvmax` of z (..., H, W) (no mask) and return the function that ends it.

    Where :func:`overlaps` (``overlap`` and ``solver`` as there), the exact CPU kernel (which
    releases the GIL) runs in a background thread while the caller goes on, e.g. launching the
    next GPU kernels: the scores (and a tensor lam) are copied to page-locked memory without
    waiting for the device, and the thread waits for that copy alone. Solves run one at a time,
    in the order started. The function returned waits for the solve, raises what :func:`tvmax`
    raises, and returns what ``tvmax(z, lam)`` returns, with the same backward pass. Elsewhere
    it is computed at once.
    """
    _check_grid(z, "tvmax")
    lam = check_lam(lam, "tvmax")
    if not overlaps(z.device, overlap, solver) or is_zero(lam):
        weights = tvmax(z, lam, solver=solver)
        return lambda: weights
    rows = z.reshape(-1, z.shape[-2] * z.shape[-1])
    pinned = rows.is_cuda
    host = torch.empty(rows.shape, dtype=_kernel_dtype(rows), pin_memory=pinned)
    host.copy_(rows.detach(), non_blocking=True)
    lam_host = lam
    if isinstance(lam, Tensor):
        lam_host = torch.empty((), dtype=torch.float64, pin_memory=pinned)
        lam_host.copy_(lam.detach(), non_blocking=True)
    copied = None
    if pinned:
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(rows.device))
    job = _background().submit(_solve_when_copied, copied, host, lam_host, z.shape,
                               numba.get_num_threads())

    def finish() -> Tensor:
        results, code = job.result()
        if code >= 0:
            _raise_invalid(host, z.shape, code)
        solved = tuple(result.to(rows.device, non_blocking=True) for result in results)
        if rows.is_cuda:
            return TVmaxDeviceFunction.apply(rows, lam, z.shape, solved, "host").view(z.shape)
        return TVmaxFunction.apply(rows, lam, z.shape, solved).view(z.shape)

    return finish


@cache
def _background() -> ThreadPoolExecutor:
    """The one thread of background solves (started at the first)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tvmax")


def _solve_when_copied(copied, host: Tensor, lam: float | Tensor, grid_shape: torch.Size,
                       threads: int):
    """In the background thread: wait for the copy to ``host`` (a CUDA event, or None), then
    _solve_host_rows into page-locked memory if ``host`` is, on the caller's number of numba
    threads (a per-thread setting: ``numba.set_num_threads`` in the caller's thread does not
    reach this one)."""
    numba.set_num_threads(threads)
    if copied is not None:
        copied.synchronize()
    return _solve_host_rows(host, float(lam), grid_shape, pinned=host.is_pinned())


class TVMax(nn.Module):
    """TVmax attention over the grid: ``forward(scores (..., H, W), mask=None)``.

    Args:
        lam: TV strength >= 0 (the paper uses 0.01).
        learn_lam: learn lam by gradient descent. lam is then softplus(raw) with an
            unconstrained parameter ``raw``, so it stays > 0 whatever the optimizer does
            (lam must then start > 0).
        solver: the forward solver of CUDA scores: "host", the exact CPU solver (a round trip
            per call), or "device", certified Dykstra on the GPU (Triton), whose uncertified
            grids go to the host. CPU scores always take the CPU solver.
        overlap: :meth:`start` solves on the host in a background thread while its caller
            (the decoder's teacher-forced pass) goes on launching GPU work.
    """

    is_sparse = True

    def __init__(self, lam: float = 0.01, learn_lam: bool = False, solver: str = "host",
                 overlap: bool = False) -> None:
        super().__init__()
        if solver not in SOLVERS:
            raise ValueError(f"TVMax: solver must be one of {SOLVERS}, got {solver!r}")
        self.solver, self.overlap = solver, bool(overlap)
        lam = check_lam(lam, "TVMax")
        if isinstance(lam, Tensor):
            lam = float(lam.detach())
        self.learn_lam = bool(learn_lam)
        if self.learn_lam:
            if lam <= 0:
                raise ValueError(f"TVMax: a learnable lam must start > 0, got lam={lam}")
            self.raw_lam = nn.Parameter(torch.tensor(inverse_softplus(lam),
                                                     dtype=torch.get_default_dtype()))
        else:
            self.fixed_lam = lam

    @property
    def lam(self) -> float | Tensor:
        """The current lam: a float, or a 0-dim tensor carrying the gradient when learned."""
        if self.learn_lam:
            return nn.functional.softplus(self.raw_lam)
        return self.fixed_lam

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return tvmax(scores, self.lam, mask, solver=self.solver)

    def starts_in_background(self, device: torch.device) -> bool:
        """Whether :meth:`start` on ``device`` solves in a background thread (:func:`overlaps`)."""
        return overlaps(device, self.overlap, self.solver)

    def start(self, scores: Tensor) -> Callable[[], Tensor]:
        """:func:`tvmax_start` of ``scores`` (..., H, W) at this module's lam and settings: a
        function that returns ``self(scores)`` when called."""
        return tvmax_start(scores, self.lam, overlap=self.overlap, solver=self.solver)

    def extra_repr(self) -> str:
        lam = self.lam.detach() if isinstance(self.lam, Tensor) else self.lam
        return (f"lam={float(lam):.4g}, learn_lam={self.learn_lam}, solver={self.solver}, "
                f"overlap={self.overlap}")
