"""sparsemax and softmax against independent references (entmax package, hand computations)."""

import entmax
import pytest
import torch

from captioner.attention import Softmax, Sparsemax, softmax, sparsemax

SHAPES_DIMS = [((7,), -1), ((4, 9), -1), ((4, 9), 0), ((3, 5, 6), 1), ((2, 3, 64), -1)]


def _random(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=dtype) * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "dim"), SHAPES_DIMS)
def test_sparsemax_matches_entmax_package(shape, dim, dtype):
    z = _random(shape, dtype).requires_grad_()
    z_ref = z.detach().clone().requires_grad_()
    p, p_ref = sparsemax(z, dim=dim), entmax.sparsemax(z_ref, dim=dim)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(p, p_ref, atol=tol, rtol=0)
    assert p.dtype == dtype and (p == 0).any()
    g = _random(shape, dtype, seed=1)
    (p * g).sum().backward()
    (p_ref * g).sum().backward()
    torch.testing.assert_close(z.grad, z_ref.grad, atol=tol * 10, rtol=0)


def test_sparsemax_hand_computed():
    # sorted [1, .5, -1]: support {1, .5}, tau = (1.5 - 1) / 2 = .25
    p = sparsemax(torch.tensor([0.5, -1.0, 1.0], dtype=torch.float64))
    assert p.tolist() == [0.25, 0.0, 0.75]


def test_gradcheck_sparsemax_and_softmax():
    z = _random((3, 6), torch.float64).requires_grad_()
    mask = torch.tensor([True, False, True, True, True, False])
    for func in (sparsemax, softmax):
        assert torch.autograd.gradcheck(lambda x, f=func: f(x, dim=-1), (z,))
        assert torch.autograd.gradcheck(lambda x, f=func: f(x, dim=0), (z,))
        assert torch.autograd.gradcheck(lambda x, f=func: f(x, mask=mask), (z,))


@pytest.mark.parametrize("func", [sparsemax, softmax])
def test_simplex_translation_and_permutation(func):
    z = _random((5, 11), torch.float64)
    p = func(z)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(func(z + 3.7), p)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(func(z[:, perm]), p[:, perm])


@pytest.mark.parametrize(("func", "reference"), [(sparsemax, entmax.sparsemax),
                                                 (softmax, torch.softmax)])
def test_mask_equals_dropping_cells(func, reference):
    z = _random((4, 10), torch.float64).requires_grad_()
    mask = torch.rand(4, 10, generator=torch.Generator().manual_seed(5)) > 0.4
    mask[:, 0] = True
    p = func(z, mask=mask)
    g = _random((4, 10), torch.float64, seed=2)
    (p * g).sum().backward()
    assert (p[~mask] == 0).all() and (z.grad[~mask] == 0).all()
    for row in range(4):
        keep = mask[row]
        torch.testing.assert_close(p[row, keep], reference(z.detach()[row, keep], dim=-1))
    # -inf scores are the same as a mask
    torch.testing.assert_close(func(z.detach().masked_fill(~mask, -float("inf"))), p)


def test_mask_broadcasts_over_batch():
    z = _random((3, 2, 5), torch.float64)
    mask = torch.tensor([True, False, True, True, False])
    p = sparsemax(z, mask=mask)
    assert (p[..., ~mask] == 0).all()
    torch.testing.assert_close(p[..., mask], entmax.sparsemax(z[..., mask], dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparsemax_extreme_inputs(dtype):
    inf = float("inf")
    cases = {
        (1e30, 0.0, -1e30): [1.0, 0.0, 0.0],
        (1e-30, 0.0, -1e-30): [1 / 3, 1 / 3, 1 / 3],
        (2.0, 2.0, 0.0): [0.5, 0.5, 0.0],
        (-inf, 0.3, -inf): [0.0, 1.0, 0.0],
        (5.0, 5.0, 5.0, 5.0): [0.25] * 4,
        (-1e30, -1e30): [0.5, 0.5],
    }
    for z, expected in cases.items():
        p = sparsemax(torch.tensor(z, dtype=dtype))
        torch.testing.assert_close(p, torch.tensor(expected, dtype=dtype))


def test_huge_maxima_in_many_rows_are_valid():
    # the validation sums row maxima; an overflowing sum must not be taken for +inf scores
    z = torch.full((4, 3), 1e308, dtype=torch.float64)
    z[:, 0] = -1e308
    expected = torch.tensor([[0.0, 0.5, 0.5]] * 4, dtype=torch.float64)
    for func in (sparsemax, softmax):
        torch.testing.assert_close(func(z), expected)


def test_sparsemax_ties_gradient_sums_to_zero():
    z = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    p = sparsemax(z)
    torch.testing.assert_close(p, torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]], dtype=torch.float64))
    p[0, 0].backward()
    torch.testing.assert_close(
        z.grad, torch.tensor([[2 / 3, -1 / 3, -1 / 3, 0.0]], dtype=torch.float64)
    )


@pytest.mark.parametrize(("module", "func"), [(Sparsemax(), sparsemax), (Softmax(), softmax)])
def test_modules_flatten_grid_row_major(module, func):
    scores = _random((2, 3, 4, 5), torch.float64)
    mask = torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0, 0] = True
    weights = module(scores, mask)
    assert weights.shape == scores.shape
    expected = func(scores.reshape(2, 3, 20), mask=mask.reshape(2, 3, 20)).reshape(2, 3, 4, 5)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(weights.sum((-2, -1)), torch.ones(2, 3, dtype=torch.float64))
    assert module.is_sparse == (func is sparsemax)


def test_sparsemax_module_rejects_vector():
    with pytest.raises(ValueError, match=r"\(\.\.\., H, W\)"):
        Sparsemax()(torch.zeros(5))
