"""1-D TV prox and fusedmax against prox_tv (Barbero & Sra) and the entmax package."""

import entmax
import numba
import numpy as np
import prox_tv as ptv
import pytest
import torch

from captioner.attention import Fusedmax, build, fusedmax, oscarmax, sparsemax, tv1d_prox

F64 = torch.float64


def _random(shape, dtype=F64, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=dtype) * scale


def _reference_prox(z, lam):
    """prox_tv's taut-string TV1D prox, row by row over the last dim (float64 numpy)."""
    rows = z.detach().double().reshape(-1, z.shape[-1]).numpy()
    out = np.stack([ptv.tv1_1d(np.ascontiguousarray(row), lam) for row in rows])
    return torch.from_numpy(out).reshape(z.shape)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 64, 196])
def test_tv1d_prox_matches_prox_tv(n):
    z = _random((40, n), seed=n, scale=2.0)
    for lam in (0.0, 0.001, 0.01, 0.1, 0.5, 1.0, 10.0):
        torch.testing.assert_close(tv1d_prox(z, lam), _reference_prox(z, lam), atol=1e-9, rtol=0)


@pytest.mark.parametrize("lam", [1e12, 1e16, 1e20, 1e308])
def test_a_huge_lam_gives_the_mean_exactly(lam):
    """Beyond the largest prefix sum of the deviations from the mean, the prox is the mean.
    Condat's algorithm (and prox_tv's, which gives the same) lost it to rounding at 1e16
    (0.031 for a mean of 0.068), to -256 at 1e20, and to +inf at 1e308."""
    z = _random((4, 64), seed=3)
    mean = z.mean(-1, keepdim=True)
    torch.testing.assert_close(tv1d_prox(z, lam), mean.expand_as(z), atol=1e-14, rtol=0)
    torch.testing.assert_close(fusedmax(z, lam), torch.full_like(z, 1 / 64), atol=1e-15, rtol=0)
    zg = _random((2, 7), seed=4).requires_grad_()
    lam_t = torch.tensor(lam, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(tv1d_prox, (zg, lam_t))
    g = _random((2, 7), seed=5)
    tv1d_prox(zg, lam_t).backward(g)
    torch.testing.assert_close(zg.grad, g.mean(-1, keepdim=True).expand_as(g))
    assert lam_t.grad.item() == 0.0


def test_tv1d_prox_other_dims_and_float32():
    z = _random((3, 9, 4), seed=1)
    moved = tv1d_prox(z, 0.2, dim=1).transpose(1, 2)
    torch.testing.assert_close(moved, _reference_prox(z.transpose(1, 2), 0.2), atol=1e-9, rtol=0)
    z32 = z.float()
    out = tv1d_prox(z32, 0.2)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference_prox(z32, 0.2), atol=1e-6, rtol=0)


def test_tv1d_prox_segments_hold_bitwise_equal_values():
    z = _random((50, 30), seed=2)
    x = tv1d_prox(z, 0.3)
    ref = _reference_prox(z, 0.3)
    # wherever the reference fuses neighbours (equal to rounding), ours is exactly equal
    fused = (ref[:, 1:] - ref[:, :-1]).abs() < 1e-9
    assert fused.any()
    assert (x[:, 1:][fused] == x[:, :-1][fused]).all()


def test_tv1d_prox_mask_removes_cells_from_the_chain():
    z = _random((6, 12), seed=3)
    mask = torch.rand(6, 12, generator=torch.Generator().manual_seed(4)) > 0.3
    mask[:, 5] = True
    z = z.masked_fill(torch.arange(12) == 7, -float("inf"))  # -inf is masked too
    x = tv1d_prox(z, 0.4, mask=mask)
    keep = mask & (z > -float("inf"))
    assert torch.isneginf(x[~keep]).all()
    for row in range(6):
        expected = _reference_prox(z[row, keep[row]], 0.4)
        torch.testing.assert_close(x[row, keep[row]], expected, atol=1e-9, rtol=0)


@pytest.mark.parametrize("lam", [0.01, 0.1, 1.0])
def test_fusedmax_matches_sparsemax_of_prox_tv(lam):
    z = _random((20, 16), seed=5, scale=2.0)
    expected = entmax.sparsemax(_reference_prox(z, lam), dim=-1)
    torch.testing.assert_close(fusedmax(z, lam), expected, atol=1e-9, rtol=0)


def test_fusedmax_gradcheck_in_scores_and_lam():
    # distinct, well separated values keep the segments stable under finite differences
    z = (torch.randperm(9, generator=torch.Generator().manual_seed(6)).double() * 0.37)
    z = z.reshape(1, 9).repeat(3, 1) + torch.tensor([[0.0], [0.11], [0.23]], dtype=F64)
    z = z.requires_grad_()
    lam = torch.tensor(0.15, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fusedmax(a, b), (z, lam))
    assert torch.autograd.gradcheck(lambda a, b: tv1d_prox(a, b), (z, lam))
    assert torch.autograd.gradcheck(lambda a: fusedmax(a.t(), 0.3, dim=0), (z,))


def test_tv1d_backward_is_the_segment_average():
    z = torch.tensor([[0.0, 3.0, 3.2, 2.9, 0.0, -1.0]], dtype=F64, requires_grad=True)
    lam = torch.tensor(0.5, dtype=F64, requires_grad=True)
    x = tv1d_prox(z, lam)
    ref = _reference_prox(z, 0.5)
    # by hand: segments {0}, {1, 2, 3}, {4}, {5}; the middle one is a local maximum
    torch.testing.assert_close(x.detach(), ref, atol=1e-12, rtol=0)
    assert x[0, 1] == x[0, 2] == x[0, 3] and x[0, 3] != x[0, 4]
    g = torch.tensor([[1.0, 2.0, 4.0, 6.0, 1.0, 1.0]], dtype=F64)
    z_grad, lam_grad = torch.autograd.grad(x, (z, lam), g)
    torch.testing.assert_close(z_grad, torch.tensor([[1.0, 4.0, 4.0, 4.0, 1.0, 1.0]], dtype=F64))
    # d x / d lam: +1 for the left end (higher right neighbour), -2/3 on the peak,
    # 0 for {4} (one higher and one lower neighbour), +1 for the right end
    torch.testing.assert_close(lam_grad, torch.tensor(1.0 - 2 / 3 * 12 + 0.0 + 1.0, dtype=F64))


def test_fusedmax_lam_zero_is_sparsemax():
    z = _random((4, 10), seed=7).requires_grad_()
    g = _random((4, 10), seed=8)
    p = fusedmax(z, 0.0)
    torch.testing.assert_close(p, entmax.sparsemax(z.detach(), dim=-1), atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad((p * g).sum(), z)
    (ref,) = torch.autograd.grad((sparsemax(z) * g).sum(), z)
    torch.testing.assert_close(grad, ref)
    lam = torch.tensor(0.0, dtype=F64, requires_grad=True)
    torch.testing.assert_close(fusedmax(z, lam), p)


def test_fusedmax_properties():
    z = _random((5, 14), seed=9)
    p = fusedmax(z, 0.2)
    assert (p >= 0).all() and (p == 0).any()
    torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=F64))
    torch.testing.assert_close(fusedmax(z + 4.2, 0.2), p)
    # TV is symmetric under reversing the chain (not under arbitrary permutations)
    torch.testing.assert_close(fusedmax(z.flip(-1), 0.2), p.flip(-1))


def test_fusedmax_mask_zero_weight_and_gradient():
    z = _random((4, 11), seed=10).requires_grad_()
    mask = torch.rand(4, 11, generator=torch.Generator().manual_seed(11)) > 0.35
    mask[:, 2] = True
    p = fusedmax(z, 0.3, mask=mask)
    (grad,) = torch.autograd.grad((p * _random((4, 11), seed=12)).sum(), z)
    assert (p[~mask] == 0).all() and (grad[~mask] == 0).all()
    for row in range(4):
        kept = z.detach()[row, mask[row]]
        expected = entmax.sparsemax(_reference_prox(kept, 0.3), dim=-1)
        torch.testing.assert_close(p[row, mask[row]], expected, atol=1e-9, rtol=0)


@pytest.mark.parametrize("mapping", [fusedmax, oscarmax], ids=["fusedmax", "oscarmax"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_fused_mappings_on_extreme_inputs(mapping, dtype):
    inf = float("inf")
    cases = {
        (1e30, 0.0, -1e30): [1.0, 0.0, 0.0],
        (1e-30, 0.0, -1e-30): [1 / 3, 1 / 3, 1 / 3],
        (2.0, 2.0, 0.0): [0.5, 0.5, 0.0],
        (3.0, -inf, 3.0, 0.0): [0.5, 0.0, 0.5, 0.0],
        (1.0, 1.0, 1.0, 1.0): [0.25] * 4,
    }
    for z, expected in cases.items():
        p = mapping(torch.tensor(z, dtype=dtype), 0.1)
        torch.testing.assert_close(p, torch.tensor(expected, dtype=dtype))


def test_fusedmax_module():
    module = build("fusedmax", lam=0.25)
    assert isinstance(module, Fusedmax) and module.is_sparse and "lam=0.25" in repr(module)
    scores = _random((2, 3, 4), seed=13)
    expected = fusedmax(scores.reshape(2, 12), 0.25).reshape(2, 3, 4)
    torch.testing.assert_close(module(scores), expected)
    with pytest.raises(ValueError, match="lam must be finite and >= 0"):
        Fusedmax(lam=-0.1)


def test_parallel_drivers_run_with_several_threads_on_batches_not_tiny(two_numba_threads):
    from captioner.attention._grouped import PARALLEL_MIN_CELLS, by_size

    run = by_size(lambda z: "serial", lambda z: "parallel")
    small, large = np.zeros(PARALLEL_MIN_CELLS - 1), np.zeros(PARALLEL_MIN_CELLS)
    assert (run(small), run(large)) == ("serial", "parallel")
    numba.set_num_threads(1)
    assert run(large) == "serial"


def test_parallel_kernels_agree_with_the_serial_ones(two_numba_threads):
    z = _random((600, 64), seed=14, scale=2.0).requires_grad_()
    torch.testing.assert_close(
        tv1d_prox(z.detach(), 0.1), _reference_prox(z.detach(), 0.1), atol=1e-9, rtol=0
    )
    g = _random((600, 64), seed=15)
    (grad,) = torch.autograd.grad((fusedmax(z, 0.1) * g).sum(), z)
    numba.set_num_threads(1)  # the serial drivers
    for rows in (slice(0, 64), slice(536, 600)):
        chunk = z.detach()[rows].requires_grad_()
        (expected,) = torch.autograd.grad((fusedmax(chunk, 0.1) * g[rows]).sum(), chunk)
        torch.testing.assert_close(grad[rows], expected, atol=1e-12, rtol=0)
