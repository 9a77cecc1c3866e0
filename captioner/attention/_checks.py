"""Validation and mask helpers shared by every attention mapping.

All mappings follow one convention (also in the ``captioner.attention`` package docstring):

* scores are a floating-point tensor; ``-inf`` is allowed and means "masked";
  NaN and ``+inf`` are rejected with a :class:`ValueError`;
* ``mask`` is a bool tensor broadcastable to the scores, ``True`` = the cell may
  receive attention; masked cells get exactly zero weight and zero gradient;
* a row (a slice along ``dim``) with no unmasked, finite-or-``-inf``-free entry has no
  probability distribution: it raises a :class:`ValueError` rather than returning
  NaN or an arbitrary distribution.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

# The DeferredChecks collecting the outcome of checks of device tensors, if any.
_COLLECTOR: ContextVar[DeferredChecks | None] = ContextVar("captioner_checks", default=None)
# True while the rows being checked are grids (..., H, W) flattened to (..., H*W).
_ROWS_ARE_GRIDS: ContextVar[bool] = ContextVar("captioner_rows_are_grids", default=False)


@contextmanager
def rows_are_grids() -> Iterator[None]:
    """Inside, a fully masked row is described as a grid of the caller's scores: the grid
    mappings check their (..., H, W) scores flattened to rows (..., H*W) along the last dim,
    a dim the caller never passed."""
    token = _ROWS_ARE_GRIDS.set(True)
    try:
        yield
    finally:
        _ROWS_ARE_GRIDS.reset(token)


class DeferredChecks:
    """Collects the checks of GPU tensors made inside ``with``, to be read back all at once.

    A check of a CUDA tensor needs its verdict on the host: a device sync per call, dozens per
    training step. Inside ``with checks:`` the verdicts stay queued on the device instead, and
    :meth:`raise_first` reads them with one sync and raises the first failure's ValueError,
    the same as an immediate check would have. CPU tensors are checked at once (there is no
    sync to save). The training step and beam search collect their checks this way.
    """

    def __init__(self) -> None:
        self._failed: list[tuple[Tensor, Callable[[], str | None]]] = []
        self._tokens: list = []

    def __enter__(self) -> DeferredChecks:
        self._tokens.append(_COLLECTOR.set(self))
        return self

    def __exit__(self, *exc_info) -> None:
        _COLLECTOR.reset(self._tokens.pop())

    def add(self, verdict: Tensor, describe: Callable[[], str | None]) -> None:
        """Queue a check: ``verdict`` is a bool (True = failed) or a floating value (failed
        unless finite), one element each."""
        self._failed.append((verdict.reshape(()), describe))

    def raise_first(self) -> None:
        """Raise ValueError(describe()) for the first failed check since the last call."""
        pending, self._failed = self._failed, []
        if not pending:
            return
        # The finiteness of every floating verdict is tested here at once, not per check.
        flags = [verdict for verdict, _ in pending if verdict.dtype == torch.bool]
        values = [verdict.double() for verdict, _ in pending if verdict.dtype != torch.bool]
        parts = [torch.stack(flags)] if flags else []
        if values:
            parts.append(~torch.isfinite(torch.stack(values)))
        verdicts = torch.cat(parts).tolist()  # the one sync
        failed_flags, failed_values = iter(verdicts[:len(flags)]), iter(verdicts[len(flags):])
        for verdict, describe in pending:
            failed = next(failed_flags if verdict.dtype == torch.bool else failed_values)
            message = describe() if failed else None
            if message is not None:
                raise ValueError(message)


def fail_if(failed: Tensor, describe: Callable[[], str | None]) -> None:
    """Raise ValueError(describe()) if the 0-dim bool tensor ``failed`` is True.

    Inside a :class:`DeferredChecks` a device tensor is only queued (no host sync here).
    ``describe`` may return None when a closer look finds nothing wrong after all.
    """
    collector = _COLLECTOR.get()
    if collector is not None and failed.device.type != "cpu":
        collector.add(failed, describe)
        return
    if bool(failed):
        message = describe()
        if message is not None:
            raise ValueError(message)


def fail_unless_finite(value: Tensor, describe: Callable[[], str | None]) -> None:
    """Raise ValueError(describe()) if the one-element floating tensor ``value`` is NaN or
    infinite. Inside a :class:`DeferredChecks` a device tensor is only queued, and tested
    with the others when they are read: no kernel beyond the one that made ``value``."""
    collector = _COLLECTOR.get()
    if collector is not None and value.device.type != "cpu":
        collector.add(value, describe)
        return
    if not math.isfinite(float(value)):
        message = describe()
        if message is not None:
            raise ValueError(message)


def half_in_float32(mapping: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``mapping(z, ...)`` computed in float32 when ``z`` is float16 or bfloat16, its weights
    (and gradients) returned in z's dtype, as the fused kernels compute them. In half
    precision a sparse mapping's weights, differences of scores near the threshold, lose
    bits to the scores' size: in bfloat16, oscarmax's weights on a grid of 64 N(0, 1) scores
    summed to 1.195."""

    @functools.wraps(mapping)
    def computed_in_float32(z, *args, **kwargs):
        if isinstance(z, Tensor) and z.dtype in (torch.float16, torch.bfloat16):
            return mapping(z.float(), *args, **kwargs).to(z.dtype)
        return mapping(z, *args, **kwargs)

    return computed_in_float32


def check_scores(z: Tensor, dim: int, func: str, *, min_dim: int = 1) -> int:
    """Check that ``z`` is a non-empty floating tensor of rank >= ``min_dim``.

    Returns ``dim`` normalized to a non-negative axis index.
    """
    if not isinstance(z, Tensor):
        raise TypeError(f"{func}: scores must be a torch.Tensor, got {type(z).__name__}")
    if not z.is_floating_point():
        raise ValueError(f"{func}: scores must be a floating-point tensor, got dtype {z.dtype}")
    if z.dim() < min_dim:
        raise ValueError(
            f"{func}: scores must have at least {min_dim} dimension(s), "
            f"got shape {tuple(z.shape)}"
        )
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{func}: dim must be an int, got {dim!r}")
    if not -z.dim() <= dim < z.dim():
        raise ValueError(f"{func}: dim={dim} is out of range for scores of shape {tuple(z.shape)}")
    dim %= z.dim()
    if z.shape[dim] == 0:
        raise ValueError(f"{func}: scores have an empty dimension {dim} (shape {tuple(z.shape)})")
    return dim


def check_mask(mask: Tensor, shape: torch.Size, func: str) -> Tensor:
    """Check that ``mask`` is a bool tensor broadcastable to ``shape``; return it expanded."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{func}: mask must be a bool tensor (True = may attend), got {kind}")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(
            f"{func}: mask of shape {tuple(mask.shape)} does not broadcast to scores of shape "
            f"{tuple(shape)}"
        )
    return mask.expand(shape)


def apply_mask(z: Tensor, mask: Tensor | None, func: str) -> Tensor:
    """Return ``z`` with masked cells set to ``-inf`` (no copy when ``mask`` is None).

    ``masked_fill`` routes no gradient to the filled cells, which gives masked cells an
    exact zero gradient whatever the mapping does with ``-inf``.
    """
    if mask is None:
        return z
    mask = check_mask(mask, z.shape, func).to(z.device)
    return z.masked_fill(~mask, -math.inf)


def checked_max(z: Tensor, dim: int, func: str) -> Tensor:
    """Row maxima of ``z`` along ``dim`` (keepdim), rejecting NaN, ``+inf`` and empty rows.

    One reduction serves both the numerically stable shift and the validation: a row's
    maximum is NaN iff the row holds a NaN, ``+inf`` iff it holds ``+inf`` (and no NaN) and
    ``-inf`` iff every entry is masked or ``-inf``. A finite sum of the maxima rules all three
    out; float64 keeps huge finite float32 maxima from overflowing it (if it overflows anyway,
    the description finds nothing wrong and nothing is raised). The check is deferred inside
    :class:`DeferredChecks`.
    """
    z_max = z.detach().amax(dim=dim, keepdim=True)
    grids = _ROWS_ARE_GRIDS.get()
    fail_unless_finite(z_max.sum(dtype=torch.float64),
                       lambda: _describe_max(z_max, dim, z.dim(), func, grids))
    return z_max


def check_distributions(p: Tensor, z: Tensor, dim: int, func: str) -> None:
    """Reject the scores ``z`` that a mapping ``p = mapping(z)`` along ``dim`` turned into NaN:
    a NaN or ``+inf`` score, or a row with every entry masked or ``-inf``, as
    :func:`checked_max` does, for a mapping such as softmax that needs no maxima of its own.

    One float64 sum of ``p`` (at most the number of rows, if valid) is the whole check; the
    description looks at ``z`` only on failure.
    """
    grids = _ROWS_ARE_GRIDS.get()
    fail_unless_finite(
        p.detach().sum(dtype=torch.float64),
        lambda: _describe_max(z.detach().amax(dim=dim, keepdim=True), dim, z.dim(), func, grids),
    )


def _describe_max(z_max: Tensor, dim: int, rank: int, func: str, grids: bool) -> str | None:
    if bool(torch.isnan(z_max).any()):
        return f"{func}: scores contain NaN"
    if bool(torch.isposinf(z_max).any()):
        return f"{func}: scores contain +inf (only -inf is allowed, meaning masked)"
    empty = torch.isneginf(z_max)
    if not bool(empty.any()):
        return None
    row = torch.nonzero(empty.squeeze(dim))[0].tolist() if rank > 1 else None
    if grids:
        where = f" at index {row} of the leading dimensions" if row is not None else ""
        return (f"{func}: every cell of the grid{where} is masked or -inf; such a grid has no "
                "attention distribution")
    where = f" in the row at index {row} of the other dimensions" if row is not None else ""
    return (
        f"{func}: every entry along dim {dim} is masked or -inf{where}; "
        "such a row has no probability distribution"
    )


def check_lam(lam: float | Tensor, func: str, name: str = "lam") -> float | Tensor:
    """Check a regularization strength: a float or 0-dim tensor, finite and >= 0 (a tensor's
    value is checked without a host sync inside :class:`DeferredChecks`)."""
    if isinstance(lam, Tensor):
        if lam.dim() != 0:
            raise ValueError(
                f"{func}: {name} must be a float or a 0-dim tensor, got shape {tuple(lam.shape)}"
            )
        value = lam.detach()
        fail_if(
            ~(torch.isfinite(value) & (value >= 0)),
            lambda: f"{func}: {name} must be finite and >= 0, got {float(value)}",
        )
        return lam
    if not isinstance(lam, (int, float)) or isinstance(lam, bool):
        raise TypeError(f"{func}: {name} must be a float or a 0-dim tensor, got {lam!r}")
    value = float(lam)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{func}: {name} must be finite and >= 0, got {value}")
    return value


def check_alpha(alpha: float | Tensor, func: str) -> None:
    """Check that every alpha is finite and > 1 (alpha = 1 is softmax: use that instead)."""
    if isinstance(alpha, Tensor):
        if not alpha.is_floating_point():
            raise ValueError(f"{func}: alpha must be a floating-point tensor, got {alpha.dtype}")
        bad = ~(torch.isfinite(alpha) & (alpha > 1))
        fail_if(
            bad.any(),
            lambda: f"{func}: alpha must be finite and > 1 (use softmax for alpha = 1), "
            f"got {alpha[bad].flatten()[0].item()}",
        )
    elif isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        if not (math.isfinite(alpha) and alpha > 1):
            raise ValueError(
                f"{func}: alpha must be finite and > 1 (use softmax for alpha = 1), got {alpha}"
            )
    else:
        raise TypeError(f"{func}: alpha must be a float or a tensor, got {alpha!r}")
