"""The fused GPU sparsemax kernels (``_sparsemax_triton``) run by Triton's interpreter on the
CPU: the same kernel code as on a GPU, checked against the entmax package's sparsemax and
against the sort-based path. The interpreter is chosen when Triton is imported, so the kernels
run in a child process (``TRITON_INTERPRET=1``) that writes its results as JSON; in it,
``sparsemax()`` is made to take the fused path for CPU tensors, so that its reshaping around
the kernels (any ``dim``, masks, non-contiguous scores) is checked too."""

from __future__ import annotations

import importlib
import textwrap

import pytest
import torch
from triton_interpreter import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("entmax")

# The kernels run once, in the fixture `results`' child: its tests share a worker.
INTERPRETED = pytest.mark.xdist_group("sparsemax_interpreted")

CHILD = textwrap.dedent(
    """
    import importlib, json, sys
    import torch
    import entmax
    import captioner.attention as att
    S = importlib.import_module("captioner.attention.sparsemax")
    kernels = importlib.import_module("captioner.attention._sparsemax_triton")
    sort_path = S._use_fused_kernels
    S._use_fused_kernels = lambda z, dim: True  # CPU tensors through the kernels
    out = {}

    def compare(name, z, dim=-1, mask=None):
        grad = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=z.dtype)
        results = []
        for fused in (True, False):
            S._use_fused_kernels = (lambda z, dim: True) if fused else sort_path
            zz = z.detach().clone().requires_grad_()
            p = att.sparsemax(zz, dim=dim, mask=mask)
            p.backward(grad)
            results.append((p.detach(), zz.grad))
        masked = z if mask is None else z.masked_fill(~mask, -float("inf"))
        zz = masked.detach().clone().requires_grad_()
        p = entmax.sparsemax(zz, dim=dim)
        p.backward(grad)
        (p_fused, g_fused), (p_sort, g_sort) = results
        off = torch.zeros_like(p_fused, dtype=torch.bool) if mask is None else ~mask.expand_as(z)
        out[name] = {
            "dtype": str(p_fused.dtype), "shape": list(p_fused.shape),
            "vs_entmax": (p_fused - p.detach()).abs().max().item(),
            "vs_sort": (p_fused - p_sort).abs().max().item(),
            "grad_vs_entmax": (g_fused.nan_to_num() - zz.grad.nan_to_num()).abs().max().item(),
            "grad_vs_sort": (g_fused - g_sort).abs().max().item(),
            "support_equal": bool(torch.equal(p_fused > 0, p_sort > 0)),
            "sum_error": (p_fused.sum(dim) - 1).abs().max().item(),
            "masked_weight": p_fused[off].abs().sum().item(),
            "masked_grad": g_fused[off].abs().sum().item(),
        }

    g = torch.Generator().manual_seed(0)
    for n in (1, 5, 64, 256, 300, 10000):
        for dtype in (torch.float32, torch.float64):
            for scale in (0.01, 3.0):  # wide supports and narrow ones
                z = torch.randn(6, n, generator=g, dtype=dtype) * scale
                compare(f"n{n}_{dtype}_x{scale}", z)
    z = torch.randn(4, 5, 8, 8, generator=g)
    compare("grid_dim1_noncontiguous", z.transpose(1, 3), dim=1)
    mask = torch.rand(4, 1, 64, generator=g) > 0.5
    mask[..., 0] = True
    compare("mask_broadcast", torch.randn(4, 3, 64, generator=g), mask=mask)
    ties = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.5, 0.5, -0.5, -0.5], [2.0, 1.0, 1.0, 1.0]])
    compare("ties", ties)
    compare("huge_scores", torch.randn(3, 64, generator=g, dtype=torch.float64) * 1e12)
    S._use_fused_kernels = lambda z, dim: True
    half = att.sparsemax(torch.randn(2, 64, generator=g).half())
    out["half"] = {"dtype": str(half.dtype),
                   "sum_error": (half.float().sum(-1) - 1).abs().max().item()}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(CHILD)


@pytest.mark.triton_interpreter
@INTERPRETED
def test_every_case_ran(results):
    assert len([name for name in results if name.startswith("n")]) == 6 * 2 * 2
    assert {"grid_dim1_noncontiguous", "mask_broadcast", "ties", "huge_scores", "half"} <= set(
        results)


@pytest.mark.triton_interpreter
@INTERPRETED
def test_fused_sparsemax_equals_entmax_and_the_sort_path(results):
    for name, case in results.items():
        if name == "half":
            continue
        wide = case["dtype"] == "torch.float64"
        tol = 1e-12 if wide else 1e-6
        assert case["vs_entmax"] <= tol, (name, case)
        assert case["vs_sort"] <= tol, (name, case)
        assert case["grad_vs_entmax"] <= 10 * tol, (name, case)
        assert case["grad_vs_sort"] <= 10 * tol, (name, case)
        assert case["sum_error"] <= 10 * tol, (name, case)


@pytest.mark.triton_interpreter
@INTERPRETED
def test_fused_sparsemax_keeps_the_support_and_the_mask(results):
    for name, case in results.items():
        if name != "half":
            assert case["support_equal"], name
    assert results["mask_broadcast"]["masked_weight"] == 0.0
    assert results["mask_broadcast"]["masked_grad"] == 0.0
    assert results["grid_dim1_noncontiguous"]["shape"] == [4, 8, 8, 5]


@pytest.mark.triton_interpreter
@INTERPRETED
def test_fused_sparsemax_of_half_scores_is_half(results):
    assert results["half"]["dtype"] == "torch.float16"
    assert results["half"]["sum_error"] <= 2e-3


def test_cpu_scores_take_the_sort_path():
    module = importlib.import_module("captioner.attention.sparsemax")
    assert not module._use_fused_kernels(torch.randn(2, 8), -1)
