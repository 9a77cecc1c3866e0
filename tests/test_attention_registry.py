"""The registry builds every mapping by name and rejects unknown names and keywords."""

import pytest
import torch

import captioner.attention as att

EXPECTED = {
    "softmax": (att.Softmax, {}, False),
    "sparsemax": (att.Sparsemax, {}, True),
    "entmax15": (att.Entmax15, {}, True),
    "entmax": (att.Entmax, {"alpha": 1.3, "learn_alpha": True}, True),
    "fusedmax": (att.Fusedmax, {"lam": 0.2}, True),
    "oscarmax": (att.Oscarmax, {"lam": 0.05}, True),
    "tvmax": (att.TVMax, {"lam": 0.1, "learn_lam": True}, True),
}


def test_mappings_are_the_contract_names():
    assert att.MAPPINGS == tuple(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_build_returns_module_with_the_shared_signature(name):
    cls, kwargs, sparse = EXPECTED[name]
    module = att.build(name, **kwargs)
    assert type(module) is cls and module.is_sparse is sparse
    assert type(att.build(name)) is cls  # defaults suffice
    scores = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[0, :3] = False
    weights = module(scores, mask)
    assert weights.shape == scores.shape and (weights >= 0).all()
    assert (weights[..., ~mask] == 0).all()
    torch.testing.assert_close(weights.sum((-2, -1)), torch.ones(2, 3))
    for key, value in kwargs.items():
        if not key.startswith("learn"):
            assert f"{key}={value}" in repr(module)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: softmax, sparsemax, entmax15, entmax"):
        att.build("sparsmax")


def test_unexpected_keyword_is_named():
    with pytest.raises(TypeError, match="unexpected keyword.*lam.*takes: no keywords"):
        att.build("sparsemax", lam=0.1)
    with pytest.raises(TypeError, match="unexpected keyword.*alpha.*takes: lam"):
        att.build("fusedmax", alpha=1.5)


@pytest.mark.parametrize("loss", ["linear", "squared"])
@pytest.mark.parametrize("name", ["entmax15", "entmax", "fusedmax", "oscarmax", "tvmax"])
def test_second_derivatives_are_refused_not_made_up(name, loss):
    # Their backward passes are closed forms of the solution (numba on the host for the
    # proxes), with no graph to differentiate again. Marked with torch's once_differentiable,
    # a gradient penalty through them had a second derivative of exactly 0 where finite
    # differences give 0.3-3.8, silently: the gradient of a loss linear in the weights had no
    # graph at all, and torch.autograd.grad(..., inputs=scores) never reached the node that
    # would raise. Now asking for a gradient that can be differentiated again is refused.
    cls, kwargs, _ = EXPECTED[name]
    # Seeded: about 1 draw in 200 fuses both TVmax grids into one group each, whose linear
    # loss then has an exact zero gradient, and the check below would fail by chance.
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 4, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weights = att.build(name, **kwargs)(scores, None)
    upstream = torch.randn(2, 4, 4, dtype=torch.float64, generator=g)
    objective = (weights * upstream).sum() if loss == "linear" else (weights**2 * upstream).sum()
    with pytest.raises(RuntimeError, match="differentiable once.*create_graph=True"):
        torch.autograd.grad(objective, scores, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        objective.backward(create_graph=True)
    # A first derivative is what it was.
    (grad,) = torch.autograd.grad(objective, scores)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_half_precision_scores_give_the_float32_weights_and_gradients_rounded(name, dtype):
    # float16 / bfloat16 scores are computed in float32 and the result rounded to their dtype
    # (computed in bfloat16, oscarmax's weights summed to 1.195 and entmax15's were 10 epsilons
    # off): within half an epsilon of the float64 mapping of the same scores, each weight and
    # their sum, and each gradient relative to its size (the model computes in float32).
    cls, kwargs, _ = EXPECTED[name]
    module = att.build(name, **{k: v for k, v in kwargs.items() if not k.startswith("learn")})
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(16, 8, 8, generator=generator).to(dtype).double()
    upstream = torch.randn(16, 8, 8, generator=generator).to(dtype).double()
    grads = []
    for precision in (torch.float64, dtype):
        given = scores.to(precision).detach().requires_grad_()
        weights = module(given, None)
        assert weights.dtype == precision
        (weights * upstream.to(precision)).sum().backward()
        assert given.grad.dtype == precision
        grads.append((weights.detach().double(), given.grad.double()))
    eps = torch.finfo(dtype).eps
    (exact, exact_grad), (half, half_grad) = grads
    assert (half - exact).abs().max() <= eps / 2
    assert (half.sum((-2, -1)) - 1).abs().max() <= eps / 2
    assert ((half_grad - exact_grad).abs() <= eps / 2 * exact_grad.abs() + 1e-5).all()
