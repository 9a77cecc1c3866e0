"""The training optimizer: Adam (TVmax paper, Sec. 4), as ``captioner fit`` and the benchmarks
build it."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adam(parameters: Iterable[torch.nn.Parameter], *, lr: float,
         betas: tuple[float, float]) -> torch.optim.Adam:
    """Adam over those of ``parameters`` that require grad.

    Where they all lie on a GPU it is torch's fused implementation, which updates all tensors in
    a few kernels: a training step there is bound by launching kernels, and the default
    (foreach) launches several per operation of the update. Elsewhere it is torch's default.
    """
    trainable = [parameter for parameter in parameters if parameter.requires_grad]
    on_gpu = bool(trainable) and all(parameter.is_cuda for parameter in trainable)
    return torch.optim.Adam(trainable, lr=lr, betas=tuple(betas), fused=True if on_gpu else None)
