"""Attention statistics on hand-made maps; fused groups against a flood-fill reference."""

import math
from collections import deque

import numpy as np
import pytest
import torch

from eval.attention_stats import attention_statistics, entropy, fused_groups, js_divergence


def _flood_fill_groups(grid: np.ndarray) -> int:
    """Reference: breadth-first search over equal, non-zero 4-neighbours."""
    h, w = grid.shape
    seen = np.zeros_like(grid, dtype=bool)
    groups = 0
    for i in range(h):
        for j in range(w):
            if grid[i, j] == 0 or seen[i, j]:
                continue
            groups += 1
            queue = deque([(i, j)])
            seen[i, j] = True
            while queue:
                y, x = queue.popleft()
                for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                    ny, nx = y + dy, x + dx
                    if 0 <= ny < h and 0 <= nx < w and not seen[ny, nx]:
                        if grid[ny, nx] == grid[y, x]:
                            seen[ny, nx] = True
                            queue.append((ny, nx))
    return groups


def test_statistics_of_hand_made_maps():
    first = torch.tensor([[[0.5, 0.5], [0.0, 0.0]], [[0.0, 0.0], [0.5, 0.5]]])
    second = torch.full((1, 2, 2), 0.25)
    stats = attention_statistics([first, second])
    assert stats["zero_attention"] == pytest.approx(4 / 12)
    assert stats["support_size"] == pytest.approx((2 + 2 + 4) / 3)
    assert stats["js_divergence"] == pytest.approx(math.log(2))  # disjoint supports
    assert stats["entropy"] == pytest.approx((math.log(2) * 2 + math.log(4)) / 3)
    assert stats["fused_groups"] == pytest.approx(1.0)
    assert stats["caption_length"] == pytest.approx(1.5)


def test_js_divergence_and_entropy_closed_forms():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]]).reshape(1, 2, 2)
    q = torch.tensor([[0.5, 0.0, 0.5, 0.0]]).reshape(1, 2, 2)
    m = [0.5, 0.25, 0.25]
    expected = -sum(v * math.log(v) for v in m) - math.log(2)
    assert js_divergence(p, q).item() == pytest.approx(expected)
    assert js_divergence(p, p).item() == pytest.approx(0.0)
    assert entropy(q).item() == pytest.approx(math.log(2))


def test_fused_groups_hand_made():
    maps = torch.tensor(
        [
            [[0.2, 0.2, 0.0], [0.0, 0.2, 0.0], [0.2, 0.0, 0.2]],  # L-shape + 2 isolated
            [[0.3, 0.0, 0.3], [0.0, 0.0, 0.0], [0.0, 0.0, 0.4]],  # equal but not adjacent
            [[0.1, 0.2, 0.1], [0.2, 0.2, 0.2], [0.0, 0.0, 0.0]],  # different values adjacent
        ]
    )
    assert fused_groups(maps).tolist() == [3, 3, 3]


def test_fused_groups_match_flood_fill_on_random_quantized_maps():
    rng = np.random.default_rng(0)
    grids = rng.choice([0.0, 0.1, 0.2], size=(50, 7, 7), p=[0.4, 0.3, 0.3])
    expected = [_flood_fill_groups(g) for g in grids]
    assert fused_groups(torch.from_numpy(grids)).tolist() == expected


def test_single_word_captions_give_nan_divergence_and_bad_shapes_are_named():
    stats = attention_statistics([torch.full((1, 2, 2), 0.25)])
    assert math.isnan(stats["js_divergence"])
    with pytest.raises(ValueError, match=r"caption 0: attention must be \(T, h, w\)"):
        attention_statistics([torch.ones(2, 2)])
    with pytest.raises(ValueError, match="at least one"):
        attention_statistics([])


def test_every_caption_empty_gives_nan_statistics_with_a_warning():
    with pytest.warns(UserWarning, match="every caption is empty"):
        stats = attention_statistics([torch.zeros(0, 3, 3), torch.zeros(0, 3, 3)])
    assert stats["caption_length"] == 0.0
    assert all(math.isnan(v) for k, v in stats.items() if k != "caption_length")
