"""Statistics of per-word output attention maps (paper section 4, "attention analysis").

Input: one tensor per decoded caption, shape (T, h, w), float, each map summing to 1 (the
output attention of every generated word, end token excluded, as in
``captioner.inference.pipeline.Caption.attention``). Statistics, averaged over all maps (all words
of
all captions) unless noted:

- ``zero_attention``: share of cells with weight exactly 0.
- ``support_size``: number of cells with non-zero weight per map.
- ``js_divergence``: Jensen-Shannon divergence (natural log, in [0, ln 2]) between the maps of
  consecutive words, averaged over all consecutive pairs.
- ``entropy``: Shannon entropy (natural log) per map.
- ``fused_groups``: number of groups per map, a group being a 4-neighbour connected component
  of non-zero cells holding exactly the same value. TVmax gives every cell of a group the same
  closed-form value, bitwise, so exact equality recovers its groups; for unstructured mappings
  this counts (mostly) single cells.
- ``caption_length``: number of words per caption (averaged over captions).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def _xlogx(p: Tensor) -> Tensor:
    return torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """JS(p, q) over the last two dims of (..., h, w) probability maps, natural log."""
    m = 0.5 * (p + q)
    return (0.5 * (_xlogx(p) + _xlogx(q)) - _xlogx(m)).sum(dim=(-2, -1))


def entropy(p: Tensor) -> Tensor:
    """Shannon entropy over the last two dims of (..., h, w) probability maps, natural log."""
    return -_xlogx(p).sum(dim=(-2, -1))


def fused_groups(maps: Tensor) -> Tensor:
    """Number of groups in each (h, w) map of ``maps`` (N, h, w): 4-neighbour connected
    components of non-zero cells with exactly equal values. Returns int64 (N,).

    Union-find over all maps at once: every cell starts as its own root and is repeatedly
    relabelled with the smallest label among its equal, non-zero 4-neighbours until stable."""
    n, h, w = maps.shape
    values = maps.detach().cpu().numpy()
    nonzero = values != 0
    labels = np.arange(n * h * w, dtype=np.int64).reshape(n, h, w)
    big = np.iinfo(np.int64).max
    labels = np.where(nonzero, labels, big)
    same_right = nonzero[:, :, 1:] & nonzero[:, :, :-1] & (values[:, :, 1:] == values[:, :, :-1])
    same_down = nonzero[:, 1:, :] & nonzero[:, :-1, :] & (values[:, 1:, :] == values[:, :-1, :])
    while True:
        new = labels.copy()
        np.minimum(new[:, :, 1:], np.where(same_right, labels[:, :, :-1], big), out=new[:, :, 1:])
        np.minimum(new[:, :, :-1], np.where(same_right, labels[:, :, 1:], big), out=new[:, :, :-1])
        np.minimum(new[:, 1:, :], np.where(same_down, labels[:, :-1, :], big), out=new[:, 1:, :])
        np.minimum(new[:, :-1, :], np.where(same_down, labels[:, 1:, :], big), out=new[:, :-1, :])
        if np.array_equal(new, labels):
            break
        labels = new
    # Labels converge to the smallest flat index of each group: its root keeps its own index.
    roots = nonzero & (labels == np.arange(n * h * w, dtype=np.int64).reshape(n, h, w))
    return torch.from_numpy(roots.sum(axis=(1, 2)).astype(np.int64))


MAP_STATISTICS = ("zero_attention", "support_size", "js_divergence", "entropy", "fused_groups")


def attention_statistics(maps: Sequence[Tensor]) -> dict[str, float]:
    """Mean statistics (see the module docstring) of a sequence of (T, h, w) attention maps,
    one tensor per caption. Captions with T = 0 count for ``caption_length`` only; when every
    caption is empty (an untrained model) the map statistics are NaN, with a warning."""
    if len(maps) == 0:
        raise ValueError("attention_statistics needs at least one caption's maps")
    for index, m in enumerate(maps):
        if m.dim() != 3:
            raise ValueError(f"caption {index}: attention must be (T, h, w), got {tuple(m.shape)}")
    nonempty = [m.detach().to(torch.float64) for m in maps if m.shape[0] > 0]
    lengths = torch.tensor([m.shape[0] for m in maps], dtype=torch.float64)
    if not nonempty:
        warnings.warn("every caption is empty: attention statistics are NaN", stacklevel=2)
        return {**dict.fromkeys(MAP_STATISTICS, float("nan")), "caption_length": 0.0}
    words = torch.cat(nonempty)
    pairs = [js_divergence(m[1:], m[:-1]) for m in nonempty if m.shape[0] > 1]
    js = torch.cat(pairs).mean().item() if pairs else float("nan")
    return {
        "zero_attention": (words == 0).double().mean().item(),
        "support_size": (words != 0).sum(dim=(-2, -1)).double().mean().item(),
        "js_divergence": js,
        "entropy": entropy(words).mean().item(),
        "fused_groups": fused_groups(words).double().mean().item(),
        "caption_length": lengths.mean().item(),
    }
