"""The marking of closed-form backward passes as the only derivative the mappings have."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def first_order_only(backward: Callable) -> Callable:
    """Wraps ``backward`` of a torch.autograd.Function whose gradient is a closed form of the
    solution (entmax's support, the fused groups of a prox): it has no graph to differentiate
    again. A gradient asked for with ``create_graph=True`` (grad mode is on in the backward
    pass then, and only then) raises RuntimeError, naming the Function.

    torch's ``once_differentiable`` raises only if the differentiated gradient reaches its
    node; ``torch.autograd.grad(..., inputs=z)`` and losses linear in the weights never do,
    so a second derivative through it came out as 0, silently.
    """
    function = backward.__qualname__.rsplit(".", 1)[0]

    @functools.wraps(backward)
    def first_order(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(
                f"{function} is differentiable once: its gradient is a closed form of the "
                "solution, so no gradient through it can be taken with create_graph=True")
        return backward(ctx, *grads)

    return first_order
