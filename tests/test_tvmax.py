"""TVmax and the 2-D TV prox against prox_tv (Barbero & Sra) and closed forms built here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from captioner.attention.tvmax import TVMax, tv2d_prox, tvmax

ptv = pytest.importorskip("prox_tv")
entmax = pytest.importorskip("entmax")

SHAPES = [(1, 9), (9, 1), (1, 1), (7, 7), (8, 8), (14, 14), (5, 11), (11, 4)]
LAMS = [0.001, 0.01, 0.1, 0.3, 1.0]
FUSED = 1e-9  # the reference (converged to ~1e-13) puts fused cells closer than this
APART = 1e-5  # inputs whose neighbours differ by (FUSED, APART) are too close to a group change


def reference_prox(z: np.ndarray, lam: float) -> np.ndarray:
    """prox_tv's Yang et al. solver, run long enough to agree with the exact prox to ~1e-13."""
    return ptv.tv1_2d(np.asarray(z, dtype=np.float64), lam, max_iters=5000, method="yang")


def neighbour_pairs(height: int, width: int, active: np.ndarray | None = None):
    """Row-major flat index pairs of the 4-neighbour grid edges (both cells active)."""
    idx = np.arange(height * width).reshape(height, width)
    pairs = np.concatenate(
        [
            np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], 1),
            np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], 1),
        ]
    )
    if active is not None:
        flat = active.ravel()
        pairs = pairs[flat[pairs[:, 0]] & flat[pairs[:, 1]]]
    return pairs


def components(n: int, pairs: np.ndarray, joined: np.ndarray) -> np.ndarray:
    """Connected-component label of each of n nodes, joining the pairs where joined is True."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (a, b), j in zip(pairs, joined, strict=True):
        if j:
            parent[root(a)] = root(b)
    roots = [root(i) for i in range(n)]
    return np.unique(roots, return_inverse=True)[1]


def reference_groups(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fused groups of a reference prox solution w (H, W) and the grid's edge list."""
    pairs = neighbour_pairs(*w.shape)
    flat = w.ravel()
    return components(
        flat.size, pairs, np.abs(flat[pairs[:, 0]] - flat[pairs[:, 1]]) < FUSED
    ), pairs


def well_separated(w: np.ndarray) -> bool:
    pairs = neighbour_pairs(*w.shape)
    diff = np.abs(w.ravel()[pairs[:, 0]] - w.ravel()[pairs[:, 1]])
    return not np.any((diff > FUSED) & (diff < APART))


def sparsemax_jacobian(p: np.ndarray) -> np.ndarray:
    """Martins & Astudillo's J = diag(s) - s s^T / |S| at p (flat)."""
    s = (p > 0).astype(np.float64)
    return np.diag(s) - np.outer(s, s) / s.sum()


def group_average_matrix(labels: np.ndarray) -> np.ndarray:
    same = (labels[:, None] == labels[None, :]).astype(np.float64)
    return same / same.sum(1, keepdims=True)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_prox_and_tvmax_match_prox_tv(shape):
    rng = np.random.default_rng(sum(shape))
    for lam in LAMS:
        z = rng.normal(size=(2, *shape)) * rng.choice([0.3, 1.0, 3.0])
        ours = tv2d_prox(torch.from_numpy(z), lam).numpy()
        probs = tvmax(torch.from_numpy(z), lam).numpy()
        for b in range(2):
            ref = reference_prox(z[b], lam)
            np.testing.assert_allclose(ours[b], ref, atol=1e-6, rtol=0, err_msg=f"lam={lam}")
            ref_p = entmax.sparsemax(torch.from_numpy(ref).flatten(), dim=-1).numpy()
            np.testing.assert_allclose(probs[b].ravel(), ref_p, atol=1e-6, rtol=0)


def test_groups_are_exact_and_bitwise_constant():
    """Cells fused in the reference share one bit pattern; neighbours across groups differ."""
    rng = np.random.default_rng(1)
    checked = 0
    for lam in [0.05, 0.2, 0.5]:
        z = rng.normal(size=(6, 8, 8))
        out = tv2d_prox(torch.from_numpy(z), lam).numpy()
        for b in range(6):
            ref = reference_prox(z[b], lam)
            if not well_separated(ref):
                continue
            labels, pairs = reference_groups(ref)
            assert labels.max() + 1 < 64, "the test needs fused groups"
            flat = out[b].ravel()
            same = labels[pairs[:, 0]] == labels[pairs[:, 1]]
            equal = flat[pairs[:, 0]] == flat[pairs[:, 1]]
            np.testing.assert_array_equal(equal, same)
            checked += 1
    assert checked >= 12


def test_float32_groups_bitwise_constant_and_close_to_float64():
    z = torch.randn(16, 8, 8, generator=torch.Generator().manual_seed(2))
    out32 = tvmax(z, 0.1)
    out64 = tvmax(z.double(), 0.1)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), out64, atol=1e-6, rtol=0)
    prox32 = tv2d_prox(z, 0.1)
    prox64 = tv2d_prox(z.double(), 0.1)
    # The float32 output is the float64 solution rounded: equal neighbours stay equal.
    torch.testing.assert_close(prox32, prox64.float(), atol=0, rtol=0)


@pytest.mark.parametrize("lam", [0.02, 0.1, 0.4])
def test_backward_matches_group_average_of_sparsemax_jacobian(lam):
    """dz = M J_sp^T g with groups and support taken from the reference solution."""
    rng = np.random.default_rng(int(lam * 100))
    height, width = 7, 6
    tested = 0
    for _ in range(12):
        z = rng.normal(size=(height, width))
        ref = reference_prox(z, lam)
        if not well_separated(ref):
            continue
        labels, _ = reference_groups(ref)
        ref_p = entmax.sparsemax(torch.from_numpy(ref).flatten(), dim=-1).numpy()
        if np.any((ref_p > 0) & (ref_p < APART)):
            continue
        g = rng.normal(size=height * width)
        expected = group_average_matrix(labels) @ sparsemax_jacobian(ref_p).T @ g

        zt = torch.from_numpy(z).requires_grad_()
        tvmax(zt, lam).backward(torch.from_numpy(g).view(height, width))
        np.testing.assert_allclose(zt.grad.numpy().ravel(), expected, atol=1e-5, rtol=0)

        zt = torch.from_numpy(z).requires_grad_()
        tv2d_prox(zt, lam).backward(torch.from_numpy(g).view(height, width))
        np.testing.assert_allclose(
            zt.grad.numpy().ravel(), group_average_matrix(labels) @ g, atol=1e-5, rtol=0
        )
        tested += 1
    assert tested >= 6


def _safely_screened(z, lam):
    """How many cells of grid z _screen alone takes out (before _screen_levels)."""
    from captioner.attention._tv2d_prox import _workspace
    from captioner.attention._tvmax_kernels import _scratch, _screen

    active = np.ones(z.size, dtype=bool)
    _screen(_workspace(z.size), _scratch(z.size), z.ravel().copy(), active, lam, *z.shape)
    return int((~active).sum())


# 16 x 16 smooth grids at lam 0.3 and 1 keep over 64 cells after _screen: _screen_levels
# then pins more by min-cuts at levels below TVmax's threshold.
@pytest.mark.parametrize(("smooth", "size", "lams"), [
    (False, 14, [0.05, 0.1, 0.3]), (True, 14, [0.05, 0.1, 0.3]), (True, 16, [0.3, 1.0])])
def test_screening_keeps_weights_and_gradients_exact(smooth, size, lams):
    """Cells screened out (zero weight for sure) leave weights, the z-gradient and the
    lam-gradient (through their edges to kept cells, Eq. 8) as sparsemax of prox_tv's prox."""
    from captioner.attention._tv2d_prox import MAX_MERGE_ROUNDS
    from captioner.attention._tvmax_kernels import tvmax_rows_serial

    rng = np.random.default_rng(21 + smooth + size)
    height = width = size
    screened = safely = tested = 0
    for lam in lams:
        for _ in range(4):
            z = rng.normal(size=(height, width))
            if smooth:  # neighbouring scores alike, as in trained models: larger fused groups
                z = (z + np.roll(z, 1, 0) + np.roll(z, 1, 1) + np.roll(z, (1, 1), (0, 1))) / 2
            weights = np.empty((1, z.size))
            group = np.empty((1, z.size), dtype=np.int32)
            dlam = np.empty((1, z.size))
            assert tvmax_rows_serial(z.reshape(1, -1).copy(), lam, weights, group, dlam,
                                     height, width, 1, MAX_MERGE_ROUNDS) == -1
            assert np.all(weights[group < 0] == 0)
            screened += int((group < 0).sum())
            safely += _safely_screened(z, lam)

            ref = reference_prox(z, lam)
            ref_p = entmax.sparsemax(torch.from_numpy(ref).flatten(), dim=-1).numpy()
            np.testing.assert_allclose(weights[0], ref_p, atol=1e-6, rtol=0)
            h = 1e-5
            lo, hi = (reference_prox(z, lam + d) for d in (-h, h))
            if not well_separated(ref) or np.any((ref_p > 0) & (ref_p < APART)):
                continue
            if reference_groups(lo)[0].max() != reference_groups(hi)[0].max():
                continue
            g = rng.normal(size=z.size)
            zt = torch.from_numpy(z).requires_grad_()
            lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
            (tvmax(zt, lam_t).flatten() * torch.from_numpy(g)).sum().backward()
            labels, _ = reference_groups(ref)
            expected = group_average_matrix(labels) @ sparsemax_jacobian(ref_p).T @ g
            np.testing.assert_allclose(zt.grad.numpy().ravel(), expected, atol=1e-5, rtol=0)
            p_lo, p_hi = (entmax.sparsemax(torch.from_numpy(r).flatten(), dim=-1).numpy()
                          for r in (lo, hi))
            fd = float(g @ (p_hi - p_lo)) / (2 * h)
            assert lam_t.grad.item() == pytest.approx(fd, abs=1e-5 + 1e-4 * abs(fd))
            tested += 1
    assert screened > len(lams) * 4 * height * width / 2, "most cells should be screened"
    if size == 16:
        assert screened > safely + len(lams) * 4 * 20, "_screen_levels should pin many more"
    assert tested >= 6


def test_lam_gradient_matches_finite_differences_of_prox_tv():
    rng = np.random.default_rng(5)
    tested = 0
    for lam in [0.05, 0.15, 0.4]:
        for _ in range(4):
            z = rng.normal(size=(6, 7))
            h = 1e-4
            lo, mid, hi = (reference_prox(z, lam + d) for d in (-h, 0.0, h))
            if (
                not well_separated(mid)
                or reference_groups(lo)[0].max() != reference_groups(hi)[0].max()
            ):
                continue
            g = rng.normal(size=z.shape)
            fd = np.sum(g * (hi - lo)) / (2 * h)
            lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
            (tv2d_prox(torch.from_numpy(z), lam_t) * torch.from_numpy(g)).sum().backward()
            assert lam_t.grad.item() == pytest.approx(fd, abs=1e-6 + 1e-4 * abs(fd))
            tested += 1
    assert tested >= 6


def test_gradcheck_z_and_lam():
    gen = torch.Generator().manual_seed(3)
    for shape, lam in [((4, 5), 0.1), ((2, 3, 4), 0.3), ((1, 6), 0.05)]:
        z = (torch.randn(*shape, generator=gen, dtype=torch.float64) * 2).requires_grad_()
        lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda z, lam: tvmax(z, lam), (z, lam_t))
        assert torch.autograd.gradcheck(lambda z, lam: tv2d_prox(z, lam), (z, lam_t))


def test_mask_splits_the_grid_and_gets_zero_weight_and_gradient():
    """A masked column cuts the grid: each side is an independent prox problem."""
    rng = np.random.default_rng(7)
    z = rng.normal(size=(6, 7))
    mask = np.ones((6, 7), dtype=bool)
    mask[:, 3] = False
    lam = 0.2
    zt = torch.from_numpy(z).requires_grad_()
    prox = tv2d_prox(zt, lam, torch.from_numpy(mask)).detach().numpy()
    assert np.all(np.isneginf(prox[~mask]))
    np.testing.assert_allclose(prox[:, :3], reference_prox(z[:, :3], lam), atol=1e-6, rtol=0)
    np.testing.assert_allclose(prox[:, 4:], reference_prox(z[:, 4:], lam), atol=1e-6, rtol=0)

    weights = tvmax(zt, lam, torch.from_numpy(mask))
    assert torch.all(weights[~torch.from_numpy(mask)] == 0)
    assert weights.sum().item() == pytest.approx(1.0)
    weights.backward(torch.from_numpy(rng.normal(size=(6, 7))))
    assert torch.all(zt.grad[~torch.from_numpy(mask)] == 0)

    # -inf scores are the same as masked cells.
    z_inf = torch.from_numpy(np.where(mask, z, -np.inf))
    torch.testing.assert_close(tvmax(z_inf, lam), weights.detach(), atol=0, rtol=0)


def test_masked_corner_equals_prox_tv_on_remaining_l_shape():
    """Masking a corner cell removes its two edges: compare with prox_tv on a 1-D chain."""
    rng = np.random.default_rng(8)
    z = rng.normal(size=(2, 2))
    mask = torch.tensor([[False, True], [True, True]])
    # The remaining cells (0,1), (1,1), (1,0) form the chain (0,1) - (1,1) - (1,0).
    chain = np.array([z[0, 1], z[1, 1], z[1, 0]])
    for lam in [0.05, 0.3, 2.0]:
        ref = ptv.tv1_1d(chain, lam)
        out = tv2d_prox(torch.from_numpy(z), lam, mask).numpy()
        np.testing.assert_allclose([out[0, 1], out[1, 1], out[1, 0]], ref, atol=1e-9, rtol=0)


def test_lam_zero_is_sparsemax_and_small_lam_is_close():
    z = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = entmax.sparsemax(z.flatten(-2), dim=-1).view_as(z)
    torch.testing.assert_close(tvmax(z, 0.0), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(tv2d_prox(z, 0.0), z, atol=0, rtol=0)
    torch.testing.assert_close(tvmax(z, 1e-9), expected, atol=1e-8, rtol=0)


def test_translation_invariance():
    z = torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    torch.testing.assert_close(tv2d_prox(z + 5.0, 0.1), tv2d_prox(z, 0.1) + 5.0)
    torch.testing.assert_close(tvmax(z + 5.0, 0.1), tvmax(z, 0.1), atol=1e-12, rtol=0)


def test_all_equal_scores_are_one_group():
    z = torch.full((3, 4, 5), 0.7, dtype=torch.float64, requires_grad=True)
    prox = tv2d_prox(z, 0.1)
    assert torch.all(prox == prox[0, 0, 0]) and prox[0, 0, 0].item() == pytest.approx(
        0.7, abs=1e-15
    )
    weights = tvmax(z, 0.1)
    assert torch.all(weights == weights[0, 0, 0])
    assert weights[0, 0, 0].item() == pytest.approx(1 / 20)
    g = torch.randn(3, 4, 5, dtype=torch.float64)
    tv2d_prox(z, 0.1).backward(g)
    torch.testing.assert_close(z.grad, g.mean((-2, -1), keepdim=True).expand_as(g))


def test_huge_and_tiny_magnitudes():
    rng = np.random.default_rng(9)
    big = rng.normal(size=(5, 6)) * 1e8
    out = tv2d_prox(torch.from_numpy(big), 0.1).numpy()
    np.testing.assert_allclose(out, reference_prox(big, 0.1), rtol=1e-12, atol=0)
    weights = tvmax(torch.from_numpy(big), 0.1)
    assert weights.max().item() == 1.0 and (weights > 0).sum().item() == 1
    tiny = rng.normal(size=(5, 6)) * 1e-12
    out = tv2d_prox(torch.from_numpy(tiny), 0.1)
    assert torch.all(out == out[0, 0]) and out[0, 0].item() == pytest.approx(tiny.mean(), abs=1e-25)
    torch.testing.assert_close(
        tvmax(torch.from_numpy(tiny), 0.1), torch.full((5, 6), 1 / 30.0, dtype=torch.float64)
    )


@pytest.mark.parametrize("lam", [1e16, 1e20, 1e308])
@pytest.mark.parametrize("driver", ["serial", "parallel"])
def test_a_huge_lam_gives_the_mean_and_uniform_weights(lam, driver, request):
    """Beyond the largest edge flow to the mean, the prox is each connected part's mean.
    TVmax at 1e308 raised ZeroDivisionError (its screening margin overflowed), and on the
    parallel driver (50 grids of 64 cells, two threads) a SystemError."""
    if driver == "parallel":
        request.getfixturevalue("two_numba_threads")
    z = torch.randn(50, 8, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mean = z.mean((-2, -1), keepdim=True).expand_as(z)
    torch.testing.assert_close(tv2d_prox(z, lam), mean, atol=1e-14, rtol=0)
    torch.testing.assert_close(tvmax(z, lam), torch.full_like(z, 1 / 64), atol=1e-15, rtol=0)
    # A masked column splits each grid in two parts, each at its own mean.
    mask = torch.ones(8, 8, dtype=torch.bool)
    mask[:, 3] = False
    parts = tv2d_prox(z, lam, mask=mask)
    for columns in (slice(0, 3), slice(4, 8)):
        torch.testing.assert_close(parts[:, :, columns], z[:, :, columns].mean(
            (-2, -1), keepdim=True).expand_as(z[:, :, columns]), atol=1e-14, rtol=0)
    zg = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64,
                     requires_grad=True)
    lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tv2d_prox, (zg, lam_t))
    assert torch.autograd.gradcheck(tvmax, (zg, lam_t))


def test_leading_dims_and_batch_independence():
    z = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(10))
    out = tvmax(z, 0.2)
    assert out.shape == z.shape
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(tvmax(z[i, j], 0.2), out[i, j], atol=0, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tvmax(torch.randn(5), 0.1), "dimension"),
        (lambda: tv2d_prox(torch.randn(5), 0.1), "dimension"),
        (lambda: tvmax(torch.tensor([[0.0, float("nan")]]), 0.1), "NaN"),
        (lambda: tv2d_prox(torch.tensor([[0.0, float("inf")]]), 0.1), "inf"),
        (lambda: tvmax(torch.randn(2, 3), -0.1), "lam"),
        (lambda: tv2d_prox(torch.randn(2, 3), float("nan")), "lam"),
        (lambda: tvmax(torch.randn(2, 3), 0.1, torch.zeros(2, 3, dtype=torch.bool)), "masked"),
        (lambda: tvmax(torch.randn(2, 3), 0.1, torch.ones(3, 2, dtype=torch.bool)), "mask"),
        (lambda: TVMax(lam=-1.0), "lam"),
        (lambda: TVMax(lam=0.0, learn_lam=True), "lam"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_module_fixed_and_learnable_lam():
    z = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    fixed = TVMax(lam=0.2)
    assert fixed.is_sparse and "lam=0.2" in repr(fixed) and not list(fixed.parameters())
    torch.testing.assert_close(fixed(z), tvmax(z, 0.2), atol=0, rtol=0)

    learned = TVMax(lam=0.2, learn_lam=True)
    lam = float(learned.lam.detach())
    assert lam == pytest.approx(0.2)
    torch.testing.assert_close(learned(z), tvmax(z, lam), atol=1e-12, rtol=0)
    learned(z).pow(2).sum().backward()
    assert learned.raw_lam.grad is not None and learned.raw_lam.grad.item() != 0
    # Softplus keeps lam positive even after a huge step.
    with torch.no_grad():
        learned.raw_lam -= 1000.0
    assert float(learned.lam.detach()) >= 0


def eq8_slopes(ref: np.ndarray, labels: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """d w / d lam by Eq. 8 from a reference solution: signed boundary count over |G|."""
    flat = ref.ravel()
    count = np.zeros(labels.max() + 1)
    size = np.bincount(labels).astype(np.float64)
    for a, b in pairs:
        if labels[a] != labels[b]:
            sign = np.sign(flat[b] - flat[a])
            count[labels[a]] += sign
            count[labels[b]] -= sign
    return (count / size)[labels]


@pytest.mark.parametrize("merge_rounds", [0, 2, 40])
@pytest.mark.parametrize("driver", ["serial", "parallel"])
def test_kernel_paths_give_values_groups_and_slopes_of_the_reference(merge_rounds, driver):
    """Both solver paths (divide and conquer alone, fast path with early fallback, fast path)."""
    from captioner.attention import _tv2d_prox

    tv2d_prox_rows = getattr(_tv2d_prox, f"tv2d_prox_rows_{driver}")

    rng = np.random.default_rng(12)
    tested = 0
    for (height, width), lam in [((8, 8), 0.1), ((7, 9), 0.3), ((6, 6), 1.0), ((14, 14), 0.05)]:
        z = rng.normal(size=(4, height * width))
        x, dlam, sign = np.empty_like(z), np.empty_like(z), np.empty_like(z)
        group = np.empty(z.shape, dtype=np.int64)
        tv2d_prox_rows(z, lam, x, group, sign, dlam, height, width, 2, merge_rounds)
        assert np.all(sign == 1.0)
        for b in range(4):
            ref = reference_prox(z[b].reshape(height, width), lam)
            np.testing.assert_allclose(x[b], ref.ravel(), atol=1e-6, rtol=0)
            if not well_separated(ref):
                continue
            labels, pairs = reference_groups(ref)
            same_ref = labels[:, None] == labels[None, :]
            np.testing.assert_array_equal(group[b][:, None] == group[b][None, :], same_ref)
            np.testing.assert_allclose(dlam[b], eq8_slopes(ref, labels, pairs), atol=1e-12)
            tested += 1
    assert tested >= 10


def test_tied_and_plateau_scores_match_prox_tv():
    """Exact ties (integer scores) and near-binary images stress the group detection."""
    rng = np.random.default_rng(13)
    for trial in range(12):
        height, width = rng.integers(2, 12, size=2)
        if trial % 2:
            z = rng.integers(0, 3, size=(height, width)).astype(np.float64)
        else:
            z = (rng.random((height, width)) < 0.5) + rng.normal(size=(height, width)) * 1e-3
        lam = float(rng.choice([0.05, 0.25, 0.6]))
        out = tv2d_prox(torch.from_numpy(z), lam).numpy()
        np.testing.assert_allclose(out, reference_prox(z, lam), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_kernel_matches_sparsemax_of_prox(dtype):
    """The one-kernel tvmax against entmax's sparsemax applied to our tv2d_prox, with masks."""
    gen = torch.Generator().manual_seed(14)
    z = torch.randn(40, 7, 9, generator=gen, dtype=torch.float64) * 2
    mask = torch.rand(40, 7, 9, generator=gen) > 0.15
    mask[:, 3, 4] = True
    g = torch.randn(40, 7, 9, generator=gen, dtype=torch.float64)
    for lam in [0.01, 0.1, 0.5]:
        zf = z.to(dtype, copy=True).requires_grad_()
        lam_f = torch.tensor(lam, dtype=dtype, requires_grad=True)
        out = tvmax(zf, lam_f, mask)
        out.backward(g.to(dtype))

        zr = z.clone().requires_grad_()
        lam_r = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
        prox = tv2d_prox(zr, lam_r, mask).flatten(-2)
        ref = entmax.sparsemax(prox.masked_fill(prox == -np.inf, -1e30), dim=-1).view_as(z)
        ref.backward(g)
        tol = 1e-6 if dtype == torch.float32 else 1e-12
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=0)
        assert torch.all(out[~mask] == 0) and torch.all(zf.grad[~mask] == 0)
        torch.testing.assert_close(zf.grad.double(), zr.grad, atol=10 * tol, rtol=0)
        torch.testing.assert_close(lam_f.grad.double(), lam_r.grad, atol=100 * tol, rtol=1e-6)


@pytest.mark.slow
def test_fused_kernel_drivers_agree_and_report_bad_rows():
    """Serial and parallel TVmax drivers give identical results; bad rows are reported."""
    from captioner.attention import _tv2d_prox
    from captioner.attention import _tvmax_kernels as kernels

    rng = np.random.default_rng(15)
    z = rng.normal(size=(9, 30)).astype(np.float32)
    z[4, :7] = -np.inf
    outputs = []
    for driver in (kernels.tvmax_rows_serial, kernels.tvmax_rows_parallel):
        p, dlam = np.empty_like(z), np.empty(z.shape)
        group = np.empty(z.shape, dtype=np.int32)
        assert driver(z, 0.2, p, group, dlam, 5, 6, 3, _tv2d_prox.MAX_MERGE_ROUNDS) == -1
        outputs.append((p, group, dlam))
    for a, b in zip(*outputs, strict=True):
        np.testing.assert_array_equal(a, b)
    p, group, _ = outputs[0]
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-6)
    assert np.all(group[4, :7] == -1) and np.all(p[4, :7] == 0)

    for row, value, kind in [(2, np.nan, kernels.NAN), (7, np.inf, kernels.POS_INF)]:
        bad = z.copy()
        bad[row, 3] = value
        code = kernels.tvmax_rows_serial(bad, 0.2, p, group, dlam, 5, 6, 1, 40)
        assert code == 3 * row + kind
    bad = z.copy()
    bad[5] = -np.inf
    code = kernels.tvmax_rows_parallel(bad, 0.2, p, group, dlam, 5, 6, 3, 40)
    assert code == 3 * 5 + kernels.EMPTY


def test_the_device_solver_without_triton_is_an_error_not_a_silent_fallback(monkeypatch):
    import sys

    module = sys.modules["captioner.attention.tvmax"]
    monkeypatch.setattr(module, "SOLVER_OVERRIDE", "device")
    monkeypatch.setattr(module, "triton_installed", lambda: False)
    with pytest.raises(RuntimeError, match="the device solver needs Triton"):
        module.TVmaxDeviceFunction.apply(torch.randn(2, 6), 0.1, torch.Size((2, 2, 3)))


def _tvmax_module():
    import sys

    return sys.modules["captioner.attention.tvmax"]


def test_forward_kernels_release_the_gil():
    """Without it a background solve (tvmax_start) would hold up the caller's thread."""
    from captioner.attention import _tvmax_kernels as kernels

    for kernel in (kernels.tvmax_rows_serial, kernels.tvmax_rows_parallel):
        assert kernel.targetoptions.get("nogil") is True


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("learn_lam", [False, True])
def test_a_background_solve_gives_what_tvmax_gives(monkeypatch, dtype, learn_lam):
    import threading

    import numba

    module = _tvmax_module()
    monkeypatch.setattr(module, "OVERLAP_OVERRIDE", True)
    solved_in, threads = [], []
    kernel = module._tvmax_rows

    def recording(*args):
        solved_in.append(threading.get_ident())
        threads.append(numba.get_num_threads())
        return kernel(*args)

    monkeypatch.setattr(module, "_tvmax_rows", recording)
    generator = torch.Generator().manual_seed(3)
    z = (torch.randn(2, 3, 5, 6, generator=generator) * 0.4).to(dtype)
    grad = torch.randn(2, 3, 5, 6, generator=generator).to(dtype)
    results = []
    for start in (False, True):
        attention = TVMax(lam=0.1, learn_lam=learn_lam).to(dtype)
        scores = z.clone().requires_grad_()
        weights = attention.start(scores)() if start else attention(scores)
        weights.backward(grad)
        lam_grad = attention.raw_lam.grad if learn_lam else None
        results.append((weights.detach(), scores.grad, lam_grad))
    assert solved_in[0] == threading.get_ident() != solved_in[1]
    assert threads == [numba.get_num_threads()] * 2  # the caller's (conftest's 1), not the default
    assert results[1][0].dtype == dtype
    for start, plain in zip(results[1], results[0], strict=True):
        assert (start is None and plain is None) or torch.equal(start, plain)


def test_a_background_solve_raises_what_tvmax_raises(monkeypatch):
    monkeypatch.setattr(_tvmax_module(), "OVERLAP_OVERRIDE", True)
    z = torch.randn(3, 4, 4)
    z[2, 1, 1] = float("nan")
    finish = TVMax(lam=0.1).start(z)  # the scores are checked when the solve is waited for
    with pytest.raises(ValueError, match="tvmax: scores contain NaN"):
        finish()
    with pytest.raises(ValueError, match="scores must have at least 2 dimension"):
        TVMax(lam=0.1).start(torch.randn(4))


def test_the_solver_and_overlap_are_the_modules_settings(monkeypatch):
    """The forward solver and the background solve are TVMax's own settings, which a model's
    config (output_attention_kwargs) and checkpoint record; the environment variables only
    override them, for benchmarks."""
    from captioner.attention import build

    module = _tvmax_module()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(module, "OVERLAP_OVERRIDE", None)
    monkeypatch.setattr(module, "SOLVER_OVERRIDE", None)
    assert not TVMax().starts_in_background(cpu)
    assert TVMax(overlap=True).starts_in_background(cpu)
    assert TVMax(overlap=True).starts_in_background(cuda)
    device = build("tvmax", lam=0.1, solver="device", overlap=True)
    assert (device.solver, device.overlap) == ("device", True)
    assert device.starts_in_background(cpu) and not device.starts_in_background(cuda)
    assert "solver=device, overlap=True" in repr(device)
    with pytest.raises(ValueError, match=r"TVMax: solver must be one of \('host', 'device'\), "
                                         "got 'gpu'"):
        build("tvmax", solver="gpu")
    # CPU scores take the CPU solver whatever the setting: the same weights.
    z = torch.randn(3, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(device(z), TVMax(lam=0.1)(z), rtol=0, atol=0)
    monkeypatch.setattr(module, "OVERLAP_OVERRIDE", False)
    assert not device.starts_in_background(cpu)


def test_what_solves_in_the_background(monkeypatch):
    module = _tvmax_module()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(module, "OVERLAP_OVERRIDE", False)
    assert not TVMax().starts_in_background(cpu)
    assert not TVMax().starts_in_background(cuda)
    monkeypatch.setattr(module, "OVERLAP_OVERRIDE", True)
    assert TVMax().starts_in_background(cpu) and TVMax().starts_in_background(cuda)
    monkeypatch.setattr(module, "SOLVER_OVERRIDE", "device")  # the device solver needs no host
    assert TVMax().starts_in_background(cpu) and not TVMax().starts_in_background(cuda)
