"""The registry builds every mapping by name and rejects unknown names and keywords."""

import pytest
import torch

import captioner.attention as att


def test_mappings_list_is_the_contract():
    assert set(att.MAPPINGS) >= {"softmax", "sparsemax"}


@pytest.mark.parametrize(("name", "cls"), [("softmax", att.Softmax), ("sparsemax", att.Sparsemax)])
def test_build_returns_module_with_shared_signature(name, cls):
    module = att.build(name)
    assert type(module) is cls and isinstance(module, torch.nn.Module)
    weights = module(torch.randn(2, 3, 4), torch.ones(2, 3, 4, dtype=torch.bool))
    torch.testing.assert_close(weights.sum((-2, -1)), torch.ones(2))


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: softmax, sparsemax"):
        att.build("sparsmax")


def test_unexpected_keyword_is_named():
    with pytest.raises(TypeError, match="unexpected keyword.*lam"):
        att.build("sparsemax", lam=0.1)
