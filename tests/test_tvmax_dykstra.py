"""The GPU TVmax solver (certified proximal Dykstra, ``_tv2d_dykstra``) run by Triton's
interpreter on the CPU: the same kernel code as on a GPU, checked against the exact CPU solver
and prox_tv. The interpreter is chosen when Triton is imported, so the kernels run in a child
process (``TRITON_INTERPRET=1``) that writes its results as JSON."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from triton_interpreter import run_interpreted

pytest.importorskip("triton")

# The kernels run once, in the module fixture's child: its tests share a worker.
pytestmark = [pytest.mark.triton_interpreter, pytest.mark.xdist_group("tvmax_dykstra_interpreted")]

import captioner.attention as att  # noqa: E402

CASES = [  # (name, H, W, lam, batch, seed)
    ("n01_8x8_lam0.01", 8, 8, 0.01, 6, 0),
    ("n01_8x8_lam0.1", 8, 8, 0.1, 6, 1),
    ("n01_5x7_lam0.3", 5, 7, 0.3, 4, 2),
    ("n01_16x16_lam0.1", 16, 16, 0.1, 2, 3),
    ("n01_6x6_lam0.5", 6, 6, 0.5, 4, 4),
    ("row_1x6", 1, 6, 0.3, 2, 4),
    ("column_6x1", 6, 1, 0.3, 2, 5),
    ("single_1x1", 1, 1, 0.3, 2, 6),
]

# Relative distances of a 1x2 grid's gap from 2 lam, where its cells stop fusing.
NEAR_TIES = (0.25e-9, 0.45e-9, 1e-9, -0.25e-9, -0.5, 0.5)
NEAR_TIE_LAMS = (1.0, 1e3, 1e6)

CHILD = textwrap.dedent(
    """
    import importlib, json, sys
    import torch
    D = importlib.import_module("captioner.attention._tv2d_dykstra")
    T = importlib.import_module("captioner.attention.tvmax")
    cases, out = json.loads(sys.argv[1]), {}
    near_ties, near_tie_lams = json.loads(sys.argv[2])

    def run(name, z, lam, h, w):
        weights, group, dlam, status, rounds = D.tvmax_rows_dykstra(z.reshape(len(z), -1),
                                                                    lam, h, w)
        out[name] = {"z": z.tolist(), "lam": lam, "weights": weights.tolist(),
                     "group": group.tolist(), "dlam": dlam.tolist(),
                     "status": status.tolist(), "rounds": rounds.tolist()}

    for name, h, w, lam, batch, seed in cases:
        g = torch.Generator().manual_seed(seed)
        run(name, torch.randn(batch, h, w, generator=g, dtype=torch.float64), lam, h, w)
    ties = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 2.0, 1.0, 1.0], [3.0, 3.0, 3.0, 0.0]])
    run("ties", torch.stack([ties, torch.zeros(3, 4)]).double(), 0.2, 3, 4)
    # Two halves of 4x4 whose prox values differ by 1e-7 (left and right, then top and bottom).
    halves = torch.tensor([[0.0, 0.0, 0.1 + 1e-7, 0.1 + 1e-7]] * 4, dtype=torch.float64)
    run("close_groups", torch.stack([halves, halves.T.contiguous()]), 0.1, 4, 4)
    g = torch.Generator().manual_seed(7)
    run("float32", torch.randn(4, 8, 8, generator=g), 0.05, 8, 8)
    # 1x2 grids whose cells fuse iff their gap is at most 2 lam: gaps a hair above it (whose
    # edge dual exceeds 1 by at most 1e-9), just below it, and far from it.
    for lam in near_tie_lams:
        gaps = [2 * lam * (1 + t) for t in near_ties]
        run(f"near_tie_lam{lam:g}", torch.tensor([[[0.0, gap]] for gap in gaps],
                                                dtype=torch.float64), lam, 1, 2)
    # One Dykstra iteration and one check: a guess far from converged, which the certificate
    # must reject rather than accept wrong groups.
    schedule = D.CHECK_EVERY, D.MAX_ROUNDS
    D.CHECK_EVERY, D.MAX_ROUNDS = 1, 1
    g = torch.Generator().manual_seed(8)
    run("one_iteration_lam1", torch.randn(8, 6, 6, generator=g, dtype=torch.float64), 1.0, 6, 6)
    D.CHECK_EVERY, D.MAX_ROUNDS = schedule

    # The autograd Function on CPU tensors: device solver, host fallback, device backward.
    T.SOLVER_OVERRIDE = "device"
    g = torch.Generator().manual_seed(9)
    z = torch.randn(5, 4 * 5, generator=g, dtype=torch.float64)
    z[2, 3] = -float("inf")  # a masked cell: that grid goes to the CPU solver
    lam = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(5, 4 * 5, generator=g, dtype=torch.float64)
    results = {}
    runs = (("device", T.TVmaxDeviceFunction, True), ("host", T.TVmaxDeviceFunction, False),
            ("cpu", T.TVmaxFunction, True))
    for name, function, device_solver in runs:
        T.SOLVER_OVERRIDE = "device" if device_solver else "host"
        zz = z.clone().requires_grad_()
        lam.grad = None
        weights = function.apply(zz, lam, torch.Size((5, 4, 5)))
        weights.backward(grad)
        results[name] = [weights.tolist(), zz.grad.tolist(), lam.grad.item()]
    T.SOLVER_OVERRIDE = "device"
    out["function"] = {**results, "stats": dict(T.DEVICE_STATS)}
    bad = torch.randn(3, 4 * 5, dtype=torch.float64)
    bad[1, 2] = float("nan")
    try:
        T.TVmaxDeviceFunction.apply(bad, 0.2, torch.Size((3, 4, 5)))
    except ValueError as error:
        out["nan_error"] = str(error)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(CHILD, json.dumps(CASES), json.dumps([NEAR_TIES, NEAR_TIE_LAMS]))


def _exact(result):
    z = torch.tensor(result["z"], dtype=torch.float64)
    return att.tvmax(z, result["lam"]).reshape(len(z), -1)


def _partition(labels) -> set[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for cell, label in enumerate(labels):
        groups.setdefault(label, set()).add(cell)
    return {frozenset(cells) for cells in groups.values()}


def _exact_groups(z: torch.Tensor, lam: float) -> list[set[frozenset[int]]]:
    """The fused groups of each grid's prox by the exact CPU solver (its own labels)."""
    from captioner.attention._tv2d_prox import MAX_MERGE_ROUNDS, tv2d_prox_rows_serial

    rows = z.reshape(len(z), -1).numpy().copy()
    x, sign, dlam = np.empty_like(rows), np.empty_like(rows), np.empty_like(rows)
    group = np.empty(rows.shape, dtype=np.int64)
    tv2d_prox_rows_serial(rows, lam, x, group, sign, dlam, z.shape[-2], z.shape[-1], 1,
                          MAX_MERGE_ROUNDS)
    return [_partition(row) for row in group.tolist()]


@pytest.mark.parametrize("name", [case[0] for case in CASES] + ["ties", "close_groups"])
def test_certified_grids_equal_the_exact_solver(interpreted, name):
    result = interpreted[name]
    # The first grid of ties has a prox whose inner duals must be exactly +-1 (the 1 beside the
    # 2 passes 2 lam through its two edges inside the group of 1s): no float certificate can
    # tell that from a dual just beyond 1, so that grid goes to the CPU solver.
    expected_status = [1, 0] if name == "ties" else [0] * len(result["status"])
    assert result["status"] == expected_status
    certified = [row for row, status in enumerate(result["status"]) if status == 0]
    weights = torch.tensor(result["weights"], dtype=torch.float64)[certified]
    torch.testing.assert_close(weights, _exact(result)[certified], atol=1e-12, rtol=0)
    z = torch.tensor(result["z"], dtype=torch.float64)
    exact_groups = _exact_groups(z, result["lam"])
    for row in certified:
        labels = result["group"][row]
        assert _partition(labels) == exact_groups[row]
        # Each group is labelled by its first cell and holds bitwise equal weights.
        for cells in _partition(labels):
            assert min(cells) == labels[min(cells)]
            assert len({result["weights"][row][cell] for cell in cells}) == 1


def test_groups_closer_than_any_tolerance_are_certified(interpreted):
    """The guess of groups is the 1-D proxes' segments, not a tolerance on the iterate's
    values: neighbouring groups whose values differ by 1e-7 are two groups, at once."""
    result = interpreted["close_groups"]
    assert result["status"] == [0, 0] and result["rounds"] == [1, 1]
    left_right, top_bottom = (_partition(labels) for labels in result["group"])
    assert left_right == {frozenset({0, 1, 4, 5, 8, 9, 12, 13}),
                          frozenset({2, 3, 6, 7, 10, 11, 14, 15})}
    assert top_bottom == {frozenset(range(8)), frozenset(range(8, 16))}
    weights = result["weights"][0]
    assert weights[2] - weights[0] == pytest.approx(1e-7, rel=1e-6)


def test_certified_grids_equal_prox_tv(interpreted):
    ptv = pytest.importorskip("prox_tv")
    result = interpreted["n01_8x8_lam0.1"]
    for row, grid in enumerate(result["z"]):
        prox = ptv.tv1_2d(np.array(grid), result["lam"], n_threads=1, max_iters=10000)
        expected = att.sparsemax(torch.tensor(prox).reshape(-1), dim=-1)
        weights = torch.tensor(result["weights"][row], dtype=torch.float64)
        torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)


def test_lam_derivative_is_eq8(interpreted):
    result = interpreted["n01_8x8_lam0.1"]
    z = torch.tensor(result["z"], dtype=torch.float64)
    lam = torch.tensor(result["lam"], dtype=torch.float64, requires_grad=True)
    prox = att.tv2d_prox(z, lam)
    (jacobian,) = torch.autograd.grad(prox.sum(), lam)
    # Eq. 8: d prox_i / d lam is the group's signed boundary count over its size; the sum over
    # cells of the CPU solver's derivative must equal the sum of the kernel's.
    assert float(jacobian) == pytest.approx(float(np.sum(result["dlam"])), abs=1e-9)


def test_float32_scores_match_to_1e6(interpreted):
    result = interpreted["float32"]
    assert result["status"] == [0] * len(result["status"])
    weights = torch.tensor(result["weights"], dtype=torch.float64)
    torch.testing.assert_close(weights, _exact(result), atol=1e-6, rtol=0)


def test_certificate_rejects_an_unconverged_guess(interpreted):
    result = interpreted["one_iteration_lam1"]
    status = torch.tensor(result["status"])
    assert bool((status != 0).any()), "one iteration at lam 1 should leave grids uncertified"
    done = status == 0
    weights = torch.tensor(result["weights"], dtype=torch.float64)
    torch.testing.assert_close(weights[done], _exact(result)[done], atol=1e-12, rtol=0)


@pytest.mark.parametrize("lam", NEAR_TIE_LAMS)
def test_the_certificate_leaves_to_rounding_no_group(interpreted, lam):
    """A gap above 2 lam by less than 1e-9 lam was certified as one group (the dual bound had a
    slack of 1e-9): weights off by up to 4.5e-4 at lam 1e6, and gradients by O(1), since the
    backward pass follows the groups. Rounding may now only leave a grid to the CPU solver."""
    result = interpreted[f"near_tie_lam{lam:g}"]
    status = result["status"]
    assert status[:3] == [1, 1, 1]  # above 2 lam by a hair: exact groups differ from a fused guess
    assert status[3:] == [0, 0, 0]  # fused just inside, and far from the edge either way
    weights = torch.tensor(result["weights"], dtype=torch.float64)[3:]
    torch.testing.assert_close(weights, _exact(result)[3:], atol=1e-12, rtol=0)
    z = torch.tensor(result["z"], dtype=torch.float64)
    for labels, groups in zip(result["group"][3:], _exact_groups(z, result["lam"])[3:],
                              strict=True):
        assert _partition(labels) == groups


@pytest.mark.parametrize("solver", ["device", "host"])
def test_function_with_either_solver_and_device_backward_matches_cpu(interpreted, solver):
    """The CUDA autograd Function, forward by either solver, backward by scatter."""
    result = interpreted["function"]
    for got, expected in zip(result[solver], result["cpu"], strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-12, rtol=0)
    assert result["stats"] == {"grids": 5, "fallback": 1}  # the host solver counts no grids


def test_invalid_scores_raise_through_the_fallback(interpreted):
    assert interpreted["nan_error"] == "tvmax: scores contain NaN"
