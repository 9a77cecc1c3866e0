"""Base classes of the 1-D mappings used as grid attention (shared module call signature)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ._checks import check_lam, check_mask, rows_are_grids


class FlatGridMapping(nn.Module):
    """Applies a 1-D mapping to the H*W cells of each grid, flattened in row-major order.

    Subclasses implement :meth:`map_flat` on scores of shape (..., H*W). The module call
    signature is the one every attention module shares (``captioner.attention``):
    ``forward(scores (..., H, W), mask=None) -> weights (..., H, W)`` summing to 1 over the
    last two dimensions.
    """

    is_sparse: bool = False

    def map_flat(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        name = type(self).__name__
        if not isinstance(scores, Tensor) or scores.dim() < 2:
            shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise ValueError(f"{name}: scores must have shape (..., H, W), got {shape}")
        grid = scores.shape[-2:]
        flat = scores.flatten(-2)
        if mask is not None:
            mask = check_mask(mask, scores.shape, name).flatten(-2)
        with rows_are_grids():
            weights = self.map_flat(flat, mask)
        return weights.unflatten(-1, grid)


class LamFlatGridMapping(FlatGridMapping):
    """A sparse 1-D mapping with a fixed strength lam >= 0 (fusedmax, oscarmax) over the
    flattened grid; subclasses set ``function(scores, lam, dim=, mask=)`` as a staticmethod."""

    is_sparse = True
    function: Callable[..., Tensor]

    def __init__(self, lam: float = 0.1):
        super().__init__()
        self.lam = float(check_lam(lam, type(self).__name__))

    def map_flat(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        return self.function(scores, self.lam, dim=-1, mask=mask)

    def extra_repr(self) -> str:
        return f"lam={self.lam:g}"
