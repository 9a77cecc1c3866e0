"""TVmax's one-kernel GPU backward pass (``_tvmax_backward_triton``) run by Triton's interpreter
on the CPU: the same kernel code as on a GPU, through ``TVmaxDeviceFunction`` with its forward
host round trip, checked against the CPU backward (``TVmaxFunction``'s numba kernel, itself
checked against prox_tv, the entmax package and finite differences in ``test_tvmax.py``) and
against the PyTorch-operations path the kernel replaces. The interpreter is chosen when Triton
is imported, so the kernels run in a child process (``TRITON_INTERPRET=1``) that writes its
results as JSON."""

from __future__ import annotations

import json
import textwrap

import pytest
from triton_interpreter import run_interpreted

pytest.importorskip("triton")

# The kernels run once, in the module fixture's child: its tests share a worker.
pytestmark = [pytest.mark.triton_interpreter, pytest.mark.xdist_group("tvmax_backward_interpreted")]

CASES = [  # (name, H, W, lam, batch, dtype, masked share)
    ("8x8_lam0.01_float32", 8, 8, 0.01, 6, "float32", 0.0),
    ("8x8_lam0.1_float64_masked", 8, 8, 0.1, 6, "float64", 0.2),
    ("5x7_lam0.3_float64", 5, 7, 0.3, 4, "float64", 0.0),
    ("16x16_lam1_float32", 16, 16, 1.0, 3, "float32", 0.0),  # large fused groups
    ("32x32_lam0.1_float64", 32, 32, 0.1, 2, "float64", 0.1),  # MAX_CELLS, 32 label chunks
    ("1x1_float64", 1, 1, 0.3, 2, "float64", 0.0),
    ("half_input_8x8_lam0.1", 8, 8, 0.1, 3, "float16", 0.0),
]

CHILD = textwrap.dedent(
    """
    import importlib, json, sys
    import torch
    T = importlib.import_module("captioner.attention.tvmax")
    cases, out = json.loads(sys.argv[1]), {}

    def gradients(function, z, lam, grad, grid_shape, kernel):
        T._use_backward_kernel = lambda grad: kernel
        zz = z.clone().requires_grad_()
        lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
        weights = function.apply(zz, lam_t, grid_shape)
        weights.backward(grad)
        return weights.detach(), zz.grad, lam_t.grad

    for name, h, w, lam, batch, dtype, masked in cases:
        g = torch.Generator().manual_seed(len(out))
        z = torch.randn(batch, h * w, generator=g).to(getattr(torch, dtype))
        z[torch.rand(batch, h * w, generator=g) < masked] = -float("inf")
        z[:, 0] = 1.0  # every grid keeps a cell
        grad = torch.randn(batch, h * w, generator=g).to(z.dtype)
        shape = torch.Size((batch, h, w))
        kernel = gradients(T.TVmaxDeviceFunction, z, lam, grad, shape, True)
        torch_ops = gradients(T.TVmaxDeviceFunction, z, lam, grad, shape, False)
        cpu = gradients(T.TVmaxFunction, z, lam, grad, shape, False)
        # Cells of one fused group (equal weights, 4-connected) must get one gradient.
        _, group, _ = T._solve_on_device(z.double() if dtype == "float16" else z, lam, shape, True,
                                         "host")
        same = group.unsqueeze(2) == group.unsqueeze(1)
        spread = (kernel[1].double().unsqueeze(2) - kernel[1].double().unsqueeze(1)).abs()
        out[name] = {
            "dtype": str(kernel[1].dtype),
            "weights_vs_cpu": (kernel[0].double() - cpu[0].double()).abs().max().item(),
            "grad_vs_cpu": (kernel[1].double() - cpu[1].double()).abs().max().item(),
            "grad_vs_torch_ops": (kernel[1].double() - torch_ops[1].double()).abs().max().item(),
            "torch_ops_vs_cpu": (torch_ops[1].double() - cpu[1].double()).abs().max().item(),
            "lam_grad": [kernel[2].item(), torch_ops[2].item(), cpu[2].item()],
            "grad_scale": cpu[1].double().abs().max().item(),
            "within_group_spread": spread[same & (group >= 0).unsqueeze(2)].max().item(),
            "masked_grad": kernel[1][z == -float("inf")].abs().sum().item(),
        }
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(CHILD, json.dumps(CASES))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_backward_kernel_matches_the_cpu_backward(interpreted, case):
    name, dtype = case[0], case[5]
    result = interpreted[name]
    assert result["dtype"] == f"torch.{dtype}"  # dz in the incoming gradient's dtype
    tol = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3}[dtype]
    assert result["weights_vs_cpu"] <= tol
    if case[1] * case[2] > 1:  # one cell: its weight is 1 whatever the score, so dz = 0
        assert result["grad_scale"] > 0.1
    assert result["grad_vs_cpu"] <= tol
    assert result["grad_vs_torch_ops"] <= tol
    assert result["torch_ops_vs_cpu"] <= tol
    kernel, torch_ops, cpu = result["lam_grad"]
    assert abs(kernel - cpu) <= 1e-9 * max(1.0, abs(cpu))
    assert abs(torch_ops - cpu) <= 1e-9 * max(1.0, abs(cpu))
    assert result["within_group_spread"] == 0.0  # bitwise one gradient per fused group
    assert result["masked_grad"] == 0.0
