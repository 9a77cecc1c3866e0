"""alpha-entmax: Tsallis-entropy regularized argmax (Peters, Niculae & Martins, 2019).

alpha-entmax(z) = argmax_{p in simplex} p.z + H^T_alpha(p) = [(alpha - 1) z - tau]_+^(1/(alpha-1))
(Peters et al., Eq. 10 and 13). alpha -> 1 is softmax, alpha = 2 is sparsemax; every alpha > 1 gives
sparse outputs. 1.5-entmax is solved exactly by sorting (Alg. 2); any alpha by bisection on tau
(Alg. 1), with the gradient with respect to alpha of Correia, Niculae & Martins (2019), Prop. 1,
so that alpha can be learned.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._autograd import first_order_only
from ._checks import apply_mask, check_alpha, check_scores, checked_max, fail_if, half_in_float32
from ._flat import FlatGridMapping
from ._softplus import inverse_softplus
from .sparsemax import ranks_along, sparsemax


def _support_jvp(s: Tensor, grad: Tensor, dim: int) -> Tensor:
    """(diag(s) - s s^T / sum(s)) grad along dim: the alpha-entmax Jacobian (Peters, Prop. 1).

    ``s`` is p^(2 - alpha) on the support and 0 elsewhere (sqrt(p) for alpha = 1.5).
    """
    sg = s * grad
    return sg - s * (sg.sum(dim, keepdim=True) / s.sum(dim, keepdim=True))


class Entmax15Function(torch.autograd.Function):
    """Exact 1.5-entmax (Peters et al., Alg. 2) with backward s = sqrt(p) in Prop. 1."""

    @staticmethod
    def forward(ctx, z: Tensor, z_max: Tensor, dim: int) -> Tensor:
        # Work with x = (alpha - 1) (z - max z) = (z - max z) / 2, so p = [x - tau]_+^2 and
        # tau >= max x - 1 = -1 (no p exceeds 1): entries below -1 are never in the support,
        # and clamping them at -2 leaves the result unchanged while keeping -inf (masked)
        # and huge negative scores out of the squares and cumulative sums below.
        x = torch.clamp((z - z_max) / 2, min=-2)
        x_sorted = torch.sort(x, dim=dim, descending=True).values
        ranks = ranks_along(x, dim)
        mean = x_sorted.cumsum(dim) / ranks
        mean_sq = (x_sorted * x_sorted).cumsum(dim) / ranks
        # tau_k solves sum_{j<=k} (x_(j) - tau)^2 = 1 for the top-k entries.
        delta = (1 - ranks * (mean_sq - mean * mean)) / ranks
        tau = mean - torch.sqrt(torch.clamp(delta, min=0))
        support_size = (tau <= x_sorted).sum(dim, keepdim=True)
        tau_star = tau.gather(dim, support_size - 1)
        p = torch.clamp(x - tau_star, min=0) ** 2
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    @first_order_only
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (p,) = ctx.saved_tensors
        return _support_jvp(torch.sqrt(p), grad, ctx.dim), None, None


@half_in_float32
def entmax15(z: Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """1.5-entmax along ``dim``, exact (sort-based, Peters et al. 2019, Alg. 2).

    Args:
        z: scores, any shape, float32 or float64 (float16 and bfloat16 in float32), any
            device (runs natively on CUDA); ``-inf`` = masked.
        dim: dimension to normalize over.
        mask: optional bool tensor broadcastable to ``z``; False cells get exactly 0 weight
            and 0 gradient (equivalent to ``-inf`` scores).

    Returns:
        Sparse probabilities of ``z``'s shape and dtype.

    Raises:
        ValueError: NaN or ``+inf`` scores, or a row with every entry masked.
    """
    dim = check_scores(z, dim, "entmax15")
    z = apply_mask(z, mask, "entmax15")
    return Entmax15Function.apply(z, checked_max(z, dim, "entmax15"), dim)


# Bisection steps on log(-tau) before those on tau (EntmaxBisectFunction.forward): they
# shorten a bracket of length (alpha - 1) * log(n) <= 256 to 1/16.
LOG_STEPS = 12


def _mass(x: Tensor, tau: Tensor, exponent: Tensor, dim: int) -> Tensor:
    """sum_i [x_i - tau]_+^exponent along ``dim``: the mass alpha-entmax's threshold tau
    gives (1 at the solution; Peters et al., Eq. 13)."""
    return (torch.clamp(x - tau, min=0) ** exponent).sum(dim, keepdim=True)


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax by bisection on tau (Peters et al., Alg. 1), differentiable in z and alpha.

    ``alpha`` has z's rank with size 1 along ``dim``.
    """

    @staticmethod
    def forward(ctx, z: Tensor, z_max: Tensor, alpha: Tensor, dim: int, n_iter: int) -> Tensor:
        x = (alpha - 1) * (z - z_max)
        exponent = 1 / (alpha - 1)
        # max x = 0, and 1/n <= max p <= 1 bracket tau in [-1, -(1/n)^(alpha - 1)]: tau is
        # tiny for large alpha and n, and for alpha > 2 the weights magnify its error near the
        # edge of the support, so tau needs relative precision. LOG_STEPS steps on log(-tau),
        # whose bracket [-(alpha - 1) log n, 0] is short, narrow it to a few percent of tau;
        # n_iter steps on tau itself (log(-tau) in float32 resolves tau only to ~1e-6) then
        # pin it down to the dtype's precision.
        n = z.shape[dim]
        log_lo = torch.zeros_like(x.narrow(dim, 0, 1) + alpha)  # tau = -1: mass >= 1
        log_hi = (-(alpha - 1) * math.log(n)).expand_as(log_lo)  # mass <= 1
        for _ in range(LOG_STEPS):
            log_mid = (log_lo + log_hi) / 2
            above = _mass(x, -torch.exp(log_mid), exponent, dim) >= 1
            log_lo = torch.where(above, log_mid, log_lo)
            log_hi = torch.where(above, log_hi, log_mid)
        tau_lo, tau_hi = -torch.exp(log_lo), -torch.exp(log_hi)
        for _ in range(n_iter):
            tau_mid = (tau_lo + tau_hi) / 2
            above = _mass(x, tau_mid, exponent, dim) >= 1
            tau_lo = torch.where(above, tau_mid, tau_lo)
            tau_hi = torch.where(above, tau_hi, tau_mid)
        # tau_lo keeps mass >= 1 (> 0), so normalizing removes the last bisection error.
        p = torch.clamp(x - tau_lo, min=0) ** exponent
        p = p / p.sum(dim, keepdim=True)
        ctx.save_for_backward(p, alpha)
        ctx.dim = dim
        return p

    @staticmethod
    @first_order_only
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None, None, None]:
        p, alpha = ctx.saved_tensors
        dim = ctx.dim
        support = p > 0
        s = torch.where(support, p, 1) ** (2 - alpha) * support
        grad_z = _support_jvp(s, grad, dim) if ctx.needs_input_grad[0] else None
        grad_alpha = None
        if ctx.needs_input_grad[2]:
            # Correia et al. (2019), Prop. 1 (Eq. 9) with p~ = s / sum s and h = -p log p.
            p_tilde = s / s.sum(dim, keepdim=True)
            h = -torch.xlogy(p, p)
            d_alpha = (p - p_tilde) / (alpha - 1) ** 2 + (
                h - p_tilde * h.sum(dim, keepdim=True)
            ) / (alpha - 1)
            grad_alpha = (grad * d_alpha).sum(dim, keepdim=True)
        return grad_z, None, grad_alpha, None, None


def _alpha_along(alpha: float | Tensor, z: Tensor, dim: int) -> Tensor:
    """alpha as a tensor of z's rank with size 1 along ``dim`` (differentiable reshaping)."""
    alpha = torch.as_tensor(alpha, dtype=z.dtype, device=z.device)
    reduced = z.shape[:dim] + z.shape[dim + 1 :]
    if alpha.dim() == z.dim() and alpha.shape[dim] == 1:
        kept = z.shape[:dim] + (1,) + z.shape[dim + 1 :]
        if torch.broadcast_shapes(alpha.shape, kept) == kept:
            return alpha.expand(kept)
    elif alpha.dim() < z.dim():
        try:
            if torch.broadcast_shapes(alpha.shape, reduced) == reduced:
                return alpha.expand(reduced).unsqueeze(dim)
        except RuntimeError:
            pass
    raise ValueError(
        f"entmax_bisect: alpha of shape {tuple(alpha.shape)} must broadcast to the scores' "
        f"shape without dim {dim}, {tuple(reduced)} (or have size 1 along dim)"
    )


@half_in_float32
def entmax_bisect(
    z: Tensor,
    alpha: float | Tensor,
    dim: int = -1,
    mask: Tensor | None = None,
    n_iter: int | None = None,
) -> Tensor:
    """alpha-entmax along ``dim`` for any alpha > 1, by bisection (Peters et al., Alg. 1).

    Differentiable with respect to ``z`` (Peters et al., Prop. 1) and to ``alpha``
    (Correia et al., 2019, Prop. 1), both in closed form at the solution: the bisection
    iterations are not unrolled.

    Args:
        z: scores, any shape, float32 or float64 (float16 and bfloat16 in float32), any
            device (runs natively on CUDA); ``-inf`` = masked.
        alpha: a float, or a tensor broadcastable to ``z``'s shape without ``dim`` (one
            alpha per row), or of ``z``'s rank with size 1 along ``dim``. Must be > 1.
        dim: dimension to normalize over.
        mask: optional bool tensor broadcastable to ``z``; False cells get exactly 0 weight
            and 0 gradient (equivalent to ``-inf`` scores).
        n_iter: bisection steps on tau, after :data:`LOG_STEPS` on log(-tau); default: the
            dtype's mantissa bits + 2 (25 for float32, 54 for float64), which pin tau down
            to the dtype's relative precision where (alpha - 1) * log(n) <= 256 for rows of
            n entries.

    Raises:
        ValueError: alpha <= 1 or not finite, NaN or ``+inf`` scores, fully masked rows.
    """
    dim = check_scores(z, dim, "entmax_bisect")
    check_alpha(alpha, "entmax_bisect")
    z = apply_mask(z, mask, "entmax_bisect")
    if n_iter is None:
        n_iter = round(-math.log2(torch.finfo(z.dtype).eps)) + 2
    elif isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"entmax_bisect: n_iter must be a positive int, got {n_iter!r}")
    alpha = _alpha_along(alpha, z, dim)
    # In the scores' dtype: an alpha of 1 + 1e-8 is 1 in float32, where (alpha - 1) = 0 gave
    # uniform weights, or NaN beside a masked cell.
    fail_if((alpha <= 1).any(), lambda: (
        f"entmax_bisect: alpha rounds to 1 in the scores' dtype {z.dtype}: use softmax, or "
        "float64 scores"))
    return EntmaxBisectFunction.apply(z, checked_max(z, dim, "entmax_bisect"), alpha, dim, n_iter)


class Entmax15(FlatGridMapping):
    """1.5-entmax over the H*W cells of each grid (sparse attention, exact)."""

    is_sparse = True

    def map_flat(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        return entmax15(scores, dim=-1, mask=mask)


class Entmax(FlatGridMapping):
    """alpha-entmax over the H*W cells of each grid, with a fixed or learned scalar alpha.

    A learned alpha is parametrized as alpha = 1 + softplus(a), which keeps it > 1 for any
    real ``a`` without the upper bound of Correia et al.'s 1 + sigmoid(a) (alpha > 2 is
    allowed). A fixed alpha of exactly 1.5 or 2 uses the exact sort-based 1.5-entmax or
    sparsemax; other values use bisection.

    Args:
        alpha: initial (or fixed) alpha, > 1.
        learn_alpha: make alpha a trainable parameter.
    """

    is_sparse = True

    def __init__(self, alpha: float = 1.5, learn_alpha: bool = False):
        super().__init__()
        check_alpha(alpha, "Entmax")
        self.learn_alpha = bool(learn_alpha)
        if self.learn_alpha:
            self.alpha_param = nn.Parameter(torch.tensor(inverse_softplus(alpha - 1)))
        else:
            self.fixed_alpha = float(alpha)

    @property
    def alpha(self) -> Tensor | float:
        """The current alpha (a 0-dim tensor carrying gradient when learned)."""
        if self.learn_alpha:
            return 1 + F.softplus(self.alpha_param)
        return self.fixed_alpha

    def map_flat(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        if not self.learn_alpha and self.fixed_alpha == 1.5:
            return entmax15(scores, dim=-1, mask=mask)
        if not self.learn_alpha and self.fixed_alpha == 2:
            return sparsemax(scores, dim=-1, mask=mask)
        return entmax_bisect(scores, self.alpha, dim=-1, mask=mask)

    def extra_repr(self) -> str:
        alpha = self.alpha
        alpha = float(alpha.detach()) if isinstance(alpha, Tensor) else alpha
        return f"alpha={alpha:.4g}, learn_alpha={self.learn_alpha}"
