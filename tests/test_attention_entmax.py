"""1.5-entmax and alpha-entmax against the entmax package and their optimality conditions."""

import math

import entmax
import pytest
import torch

from captioner.attention import Entmax, Entmax15, build, entmax15, entmax_bisect, sparsemax

F64 = torch.float64


def _random(shape, dtype=F64, seed=0, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=dtype) * scale


def _value_and_grad(func, z, g):
    z = z.detach().clone().requires_grad_()
    p = func(z)
    (p * g).sum().backward()
    return p.detach(), z.grad


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(("shape", "dim"), [((9,), -1), ((5, 8), 0), ((3, 4, 64), -1)])
def test_entmax15_matches_entmax_package(shape, dim, dtype):
    z, g = _random(shape, dtype), _random(shape, dtype, seed=1)
    p, grad = _value_and_grad(lambda x: entmax15(x, dim=dim), z, g)
    p_ref, grad_ref = _value_and_grad(lambda x: entmax.entmax15(x, dim=dim), z, g)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(p, p_ref, atol=tol, rtol=0)
    torch.testing.assert_close(grad, grad_ref, atol=10 * tol, rtol=0)
    assert (p == 0).any()


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.5, 2.0, 2.7])
def test_entmax_bisect_matches_entmax_package(alpha):
    z, g = _random((6, 17)), _random((6, 17), seed=1)
    p, grad = _value_and_grad(lambda x: entmax_bisect(x, alpha), z, g)
    p_ref, grad_ref = _value_and_grad(lambda x: entmax.entmax_bisect(x, alpha, n_iter=100), z, g)
    torch.testing.assert_close(p, p_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(grad, grad_ref, atol=1e-9, rtol=0)


def test_entmax_bisect_alpha_gradient_matches_entmax_package():
    z, g = _random((4, 3, 10)), _random((4, 3, 10), seed=1)
    alpha = 1.1 + 1.5 * torch.rand(4, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    ours, ref = alpha.clone().requires_grad_(), alpha.unsqueeze(-1).requires_grad_()
    (entmax_bisect(z, ours) * g).sum().backward()
    (entmax.entmax_bisect(z, ref, n_iter=100) * g).sum().backward()
    torch.testing.assert_close(ours.grad, ref.grad.squeeze(-1), atol=1e-8, rtol=0)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 1.9, 3.0])
def test_entmax_bisect_optimality_conditions(alpha):
    # Peters et al. Eq. 13: p_i^(alpha-1) = (alpha-1) z_i - tau on the support and
    # (alpha-1) z_i <= tau off it.
    z = _random((8, 12), seed=4)
    p = entmax_bisect(z, alpha)
    torch.testing.assert_close(p.sum(-1), torch.ones(8, dtype=F64))
    for row_z, row_p in zip(z, p, strict=True):
        support = row_p > 0
        tau = (alpha - 1) * row_z[support] - row_p[support] ** (alpha - 1)
        torch.testing.assert_close(tau, tau.mean().expand_as(tau), atol=1e-9, rtol=0)
        assert ((alpha - 1) * row_z[~support] <= tau.mean() + 1e-9).all()


def _bisect_in_mpmath(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax of each row of ``z`` by bisection in 60-digit arithmetic (Peters et al.,
    Eq. 13: sum_i [x_i - tau]_+^(1/(alpha-1)) = 1 with x = (alpha-1) z), as float64."""
    import mpmath

    rows = []
    with mpmath.workdps(60):
        a = mpmath.mpf(alpha)
        for row in z.double().tolist():
            top = max(row)
            x = [(a - 1) * (mpmath.mpf(v) - top) for v in row]
            lo, hi = mpmath.mpf(-1), -(mpmath.mpf(1) / len(x)) ** (a - 1)
            for _ in range(300):
                mid = (lo + hi) / 2
                if sum(max(v - mid, 0) ** (1 / (a - 1)) for v in x) >= 1:
                    lo = mid
                else:
                    hi = mid
            p = [max(v - lo, 0) ** (1 / (a - 1)) for v in x]
            rows.append([float(v / sum(p)) for v in p])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [2.5, 4.0, 6.0])
@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_entmax_bisect_is_exact_to_the_dtype_for_large_alpha(alpha, scale):
    # For alpha > 2 the weights magnify tau's error near the edge of the support, and tau is
    # tiny (~ n^-(alpha-1)): a bisection that pins tau only to the dtype's absolute precision
    # was off by 8e-3 in float32 at alpha 6 (the entmax package: 2e-4), and 2e-11 in float64.
    torch.manual_seed(0)
    z = torch.randn(6, 37) * scale
    exact = _bisect_in_mpmath(z, alpha)
    assert (entmax_bisect(z.double(), alpha) - exact).abs().max() <= 1e-12
    package = (entmax.entmax_bisect(z, alpha, n_iter=100).double() - exact).abs().max()
    assert (entmax_bisect(z, alpha).double() - exact).abs().max() <= max(2 * package, 1e-6)


def test_entmax15_two_point_closed_form():
    # two cells: sqrt(p1) - sqrt(p2) = (z1 - z2) / 2 and p1 + p2 = 1
    p = entmax15(torch.tensor([1.0, 0.0], dtype=F64))
    torch.testing.assert_close(p[0].sqrt() - p[1].sqrt(), torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=F64))


def test_exact_and_bisection_agree():
    z = _random((5, 30), seed=6)
    torch.testing.assert_close(entmax_bisect(z, 1.5), entmax15(z), atol=1e-12, rtol=0)
    torch.testing.assert_close(entmax_bisect(z, 2.0), sparsemax(z), atol=1e-12, rtol=0)


def test_gradcheck_entmax15_and_bisect():
    z = _random((3, 7)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: entmax15(x, dim=0), (z,))
    alpha = torch.tensor([1.3, 1.6, 2.4], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, a: entmax_bisect(x, a), (z, alpha))
    scalar = torch.tensor(1.7, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, a: entmax_bisect(x, a, dim=0), (z, scalar))


@pytest.mark.parametrize("func", [entmax15, lambda z, mask=None: entmax_bisect(z, 1.4, mask=mask)])
def test_mask_zero_weight_zero_grad_and_equals_dropping(func):
    z = _random((4, 10)).requires_grad_()
    mask = torch.rand(4, 10, generator=torch.Generator().manual_seed(5)) > 0.4
    mask[:, 3] = True
    p = func(z, mask=mask)
    (p * _random((4, 10), seed=2)).sum().backward()
    assert (p[~mask] == 0).all() and (z.grad[~mask] == 0).all()
    for row in range(4):
        kept = z.detach()[row, mask[row]]
        torch.testing.assert_close(p[row, mask[row]], func(kept), atol=1e-12, rtol=0)
    torch.testing.assert_close(func(z.detach().masked_fill(~mask, -float("inf"))), p)


@pytest.mark.parametrize("func", [entmax15, lambda z: entmax_bisect(z, 1.3)])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_extreme_inputs(func, dtype):
    inf = float("inf")
    cases = {
        (1e30, 0.0, -1e30, -inf): [1.0, 0.0, 0.0, 0.0],
        (1e-30, 0.0, -1e-30): [1 / 3, 1 / 3, 1 / 3],
        (-1e30, -1e30, -inf): [0.5, 0.5, 0.0],
        (4.0, 4.0, 4.0, 4.0): [0.25] * 4,
    }
    for z, expected in cases.items():
        p = func(torch.tensor(z, dtype=dtype))
        torch.testing.assert_close(p, torch.tensor(expected, dtype=dtype))


def test_translation_and_permutation():
    z = _random((3, 9))
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(1))
    for func in (entmax15, lambda x: entmax_bisect(x, 1.7)):
        p = func(z)
        torch.testing.assert_close(func(z - 5.5), p)
        torch.testing.assert_close(func(z[:, perm]), p[:, perm])


def test_alpha_validation():
    z = torch.zeros(2, 3)
    for bad in (1.0, 0.5, float("nan"), torch.tensor([1.2, 1.0])):
        with pytest.raises(ValueError, match="alpha must be finite and > 1"):
            entmax_bisect(z, bad)
    with pytest.raises(ValueError, match="alpha of shape"):
        entmax_bisect(z, torch.full((3,), 1.5))
    with pytest.raises(ValueError, match="alpha must be finite and > 1"):
        Entmax(alpha=1.0)
    # 1 + 1e-8 is 1.0 in float32: uniform weights, or NaN beside a masked cell.
    masked = torch.tensor([[2.0, 1.0, -math.inf, -1.0]])
    with pytest.raises(ValueError, match=r"alpha rounds to 1 in the scores' dtype torch.float32"):
        entmax_bisect(masked, 1 + 1e-8)
    torch.testing.assert_close(entmax_bisect(masked.double(), 1 + 1e-8),
                               torch.softmax(masked.double(), dim=-1), atol=1e-7, rtol=0)


def test_a_large_learned_alpha_starts_where_it_is_asked():
    # The inverse softplus overflowed (math range error) from alpha = 711.
    for alpha in (1.01, 800.0):
        torch.testing.assert_close(build("entmax", alpha=alpha, learn_alpha=True).alpha.detach(),
                                   torch.tensor(alpha))
    torch.testing.assert_close(build("tvmax", lam=1e4, learn_lam=True).lam.detach(),
                               torch.tensor(1e4))


def test_entmax_module_learns_alpha_and_keeps_it_above_one():
    module = build("entmax", alpha=1.3, learn_alpha=True)
    assert isinstance(module, Entmax) and module.is_sparse
    assert "alpha=1.3, learn_alpha=True" in repr(module)
    torch.testing.assert_close(module.alpha.detach(), torch.tensor(1.3))
    scores = _random((2, 3, 4), dtype=torch.float32)
    (module(scores) * _random((2, 3, 4), dtype=torch.float32, seed=3)).sum().backward()
    assert module.alpha_param.grad is not None and module.alpha_param.grad != 0
    with torch.no_grad():
        module.alpha_param.fill_(-15.0)
    assert module.alpha > 1


def test_modules_flatten_grid():
    scores = _random((2, 3, 5))
    flat = scores.reshape(2, 15)
    torch.testing.assert_close(Entmax15()(scores).reshape(2, 15), entmax15(flat))
    torch.testing.assert_close(Entmax(1.5)(scores), Entmax15()(scores))
    torch.testing.assert_close(Entmax(alpha=2.2)(scores).reshape(2, 15), entmax_bisect(flat, 2.2))
    assert list(Entmax(alpha=2.2).parameters()) == []
