"""OSCAR prox and oscarmax against their optimality certificate and hand computations."""

import itertools

import entmax
import numba
import numpy as np
import pytest
import torch

from captioner.attention import Oscarmax, build, oscar_prox, oscarmax, sparsemax

F64 = torch.float64


def _random(shape, dtype=F64, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=dtype) * scale


def _assert_oscar_optimal(z, y, lam, atol=1e-9):
    """Fenchel certificate of y = prox_{lam OSCAR}(z) for one vector.

    OSCAR(y) = sum_{i<j} max(|y_i|, |y_j|) is the OWL norm with weights w = (n-1, ..., 0); its
    dual unit ball is {u : sum of the k largest |u_i| <= w_1 + ... + w_k for all k}. y is the
    prox iff u = (z - y) / lam lies in that ball and u.y = OSCAR(y).
    """
    z, y = np.asarray(z, dtype=float), np.asarray(y, dtype=float)
    n = len(z)
    u = (z - y) / lam
    top_sums = np.cumsum(np.sort(np.abs(u))[::-1])
    assert (top_sums <= np.cumsum(np.arange(n - 1, -1, -1.0)) + atol).all()
    penalty = sum(max(abs(y[i]), abs(y[j])) for i, j in itertools.combinations(range(n), 2))
    assert abs(u @ y - penalty) <= atol * max(1.0, penalty)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_oscar_prox_is_optimal(n):
    z = _random((10, n), seed=n, scale=2.0)
    for lam in (0.001, 0.01, 0.1, 0.5, 2.0):
        y = oscar_prox(z, lam)
        for row_z, row_y in zip(z, y, strict=True):
            _assert_oscar_optimal(row_z.numpy(), row_y.numpy(), lam)


def test_certificate_rejects_a_wrong_prox():
    z = _random((8,), seed=1, scale=2.0)
    with pytest.raises(AssertionError):
        _assert_oscar_optimal(z.numpy(), (oscar_prox(z, 0.1) * 1.01).numpy(), 0.1)


def test_oscar_prox_hand_computed():
    z = torch.tensor([[1.0, 0.8], [3.0, 1.0], [-1.0, 0.8], [0.1, -0.2]], dtype=F64)
    # [1, .8]: 1 - .5 < .8 so both fuse at t with 2t - 1.8 + .5 = 0; [3, 1]: no fusion;
    # signs are kept; [.1, -.2]: .2 - .5 < 0 and .1 < 0: both vanish
    expected = [[0.65, 0.65], [2.5, 1.0], [-0.65, 0.65], [0.0, 0.0]]
    torch.testing.assert_close(oscar_prox(z, 0.5), torch.tensor(expected, dtype=F64))


def test_oscar_prox_mask_and_equivariances():
    z = _random((4, 9), seed=2)
    mask = torch.rand(4, 9, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[:, 0] = True
    y = oscar_prox(z, 0.2, mask=mask)
    assert torch.isneginf(y[~mask]).all()
    for row in range(4):
        _assert_oscar_optimal(z[row, mask[row]].numpy(), y[row, mask[row]].numpy(), 0.2)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(4))
    full = oscar_prox(z, 0.2)
    torch.testing.assert_close(oscar_prox(z[:, perm], 0.2), full[:, perm])
    torch.testing.assert_close(oscar_prox(-z, 0.2), -full)


@pytest.mark.parametrize("lam", [0.01, 0.1, 0.5])
def test_oscarmax_is_sparsemax_of_the_prox(lam):
    z = _random((6, 10), seed=5)
    y = oscar_prox(z, lam)
    torch.testing.assert_close(oscarmax(z, lam), entmax.sparsemax(y, dim=-1), atol=1e-12, rtol=0)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(oscarmax(z[:, perm], lam), oscarmax(z, lam)[:, perm])


def test_oscarmax_gradcheck_in_scores_and_lam():
    z = torch.tensor([[0.9, -0.88, 1.3, 0.2, 1.25, -1.7, 0.6]], dtype=F64)
    z = (z + torch.tensor([[0.0], [0.05]], dtype=F64)).requires_grad_()
    lam = torch.tensor(0.04, dtype=F64, requires_grad=True)
    y = oscar_prox(z.detach(), 0.04)
    assert (y.abs().unsqueeze(-1) == y.abs().unsqueeze(-2)).sum() > 2 * 7  # some clusters
    assert torch.autograd.gradcheck(lambda a, b: oscarmax(a, b), (z, lam))
    assert torch.autograd.gradcheck(lambda a, b: oscar_prox(a, b), (z, lam))


def test_oscar_backward_signed_cluster_average():
    z = torch.tensor([[-1.0, 0.8, 3.0, 0.1, 0.05]], dtype=F64, requires_grad=True)
    lam = torch.tensor(0.25, dtype=F64, requires_grad=True)
    y = oscar_prox(z, lam)
    # sorted |z| = 3, 1, .8, .1, .05 minus .25 * (4, 3, 2, 1, 0) = 2, .25, .3, -.15, .05:
    # pool {1, .8} at .275 (signs kept) and {.1, .05} at -.05, clipped to the zero cluster
    torch.testing.assert_close(
        y.detach(), torch.tensor([[-0.275, 0.275, 2.0, 0.0, 0.0]], dtype=F64)
    )
    g = torch.tensor([[1.0, 3.0, 5.0, 7.0, 9.0]], dtype=F64)
    z_grad, lam_grad = torch.autograd.grad(y, (z, lam), g)
    # cluster {-1, .8}: s_i * mean(s_j g_j) = -+(-1 + 3) / 2; zero cluster: no gradient
    torch.testing.assert_close(z_grad, torch.tensor([[-1.0, 1.0, 5.0, 0.0, 0.0]], dtype=F64))
    # d|y|/d lam = -(mean weight): -4 for 3.0, -(3 + 2) / 2 for the pair (signed)
    torch.testing.assert_close(lam_grad, torch.tensor(5.0 * -4 + (-1 + 3) * -2.5, dtype=F64))


def test_oscarmax_lam_zero_mask_and_module():
    z = _random((3, 8), seed=7).requires_grad_()
    torch.testing.assert_close(oscarmax(z, 0.0), sparsemax(z))
    mask = torch.rand(3, 8, generator=torch.Generator().manual_seed(8)) > 0.3
    mask[:, 1] = True
    p = oscarmax(z, 0.1, mask=mask)
    (grad,) = torch.autograd.grad((p * _random((3, 8), seed=9)).sum(), z)
    assert (p[~mask] == 0).all() and (grad[~mask] == 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=F64))
    module = build("oscarmax", lam=0.05)
    assert isinstance(module, Oscarmax) and module.is_sparse and "lam=0.05" in repr(module)
    scores = z.detach().reshape(3, 2, 4)
    torch.testing.assert_close(module(scores).reshape(3, 8), oscarmax(z.detach(), 0.05))


def test_scores_whose_prox_overflows_are_named_as_such():
    # The prox sums a fused group's scores: finite scores near float64's limit overflowed,
    # and sparsemax then refused "+inf scores" the caller never gave.
    z = torch.tensor([[1e308, -1e308, 0.0, 1e308]], dtype=F64)
    with pytest.raises(ValueError, match=r"^oscarmax: scores of magnitude up to 1e\+308 "
                                         r"overflow the sums of its prox in float64"):
        oscarmax(z, 0.1)
    # Masked cells (-inf inside the prox) are no overflow.
    assert torch.isfinite(oscarmax(z / 1e300, 0.1, mask=torch.tensor([True, True, False, True]))
                          ).all()


def test_parallel_kernels_agree_with_the_serial_ones(two_numba_threads):
    z = _random((600, 64), seed=10).requires_grad_()
    y = oscar_prox(z.detach(), 0.01)
    for row in (0, 599):
        _assert_oscar_optimal(z.detach()[row].numpy(), y[row].numpy(), 0.01)
    g = _random((600, 64), seed=11)
    (grad,) = torch.autograd.grad((oscarmax(z, 0.01) * g).sum(), z)
    numba.set_num_threads(1)  # the serial drivers
    chunk = z.detach()[-64:].requires_grad_()
    (expected,) = torch.autograd.grad((oscarmax(chunk, 0.01) * g[-64:]).sum(), chunk)
    torch.testing.assert_close(grad[-64:], expected, atol=1e-12, rtol=0)
