"""Oscarmax: sparse attention clustered by the OSCAR penalty (Niculae & Blondel, 2017).

OSCAR(x) = sum_{i<j} max(|x_i|, |x_j|) is an ordered weighted l1 norm: with |x| sorted
decreasingly, the k-th largest entry (k = 1..n) has weight n - k. Its prox (Zeng & Figueiredo,
2014; Bogdan et al., 2015) sorts |z|, subtracts lam * (n - k), projects onto non-increasing
sequences by pool-adjacent-violators (isotonic regression), clips at 0 and restores signs and
order. Each pooled block is a cluster: the Jacobian (Niculae & Blondel, Prop. 3) is
sign(z_i) sign(z_j) / |G| within a cluster whose value is non-zero, 0 on the zero cluster, and
d|value|/d(lam) = -mean_{k in G}(n - k).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from torch import Tensor

from ._checks import half_in_float32
from ._flat import LamFlatGridMapping
from ._grouped import by_size, grouped_prox, sparsemax_of_prox


@njit(cache=True)
def _oscar_row(z, lam, x, group, sign, dlam, r):
    n = z.shape[1]
    cells = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        x[r, i] = -np.inf
        group[r, i] = -1
        sign[r, i] = 0.0
        dlam[r, i] = 0.0
        if z[r, i] > -np.inf:
            cells[m] = i
            m += 1
    magnitude = np.empty(m)
    for j in range(m):
        magnitude[j] = abs(z[r, cells[j]])
    order = np.argsort(-magnitude, kind="mergesort")
    # Pool adjacent violators: blocks of sorted positions with their sums of
    # (|z| - lam * weight) and of weights; ties are pooled, so block values decrease
    # strictly and every block is one cluster.
    block_sum = np.empty(m)
    block_weight = np.empty(m)
    block_size = np.empty(m, dtype=np.int64)
    blocks = 0
    for k in range(m):
        weight = m - 1 - k
        block_sum[blocks] = magnitude[order[k]] - lam * weight
        block_weight[blocks] = weight
        block_size[blocks] = 1
        blocks += 1
        while blocks > 1 and (
            block_sum[blocks - 2] * block_size[blocks - 1]
            <= block_sum[blocks - 1] * block_size[blocks - 2]
        ):
            block_sum[blocks - 2] += block_sum[blocks - 1]
            block_weight[blocks - 2] += block_weight[blocks - 1]
            block_size[blocks - 2] += block_size[blocks - 1]
            blocks -= 1
    k = 0
    for b in range(blocks):
        value = max(block_sum[b] / block_size[b], 0.0)
        for _ in range(block_size[b]):
            i = cells[order[k]]
            s = np.sign(z[r, i])
            x[r, i] = s * value
            if value > 0.0:
                group[r, i] = b
                sign[r, i] = s
                dlam[r, i] = -s * block_weight[b] / block_size[b]
            k += 1


@njit(cache=True)
def _oscar_serial(z, lam, x, group, sign, dlam):
    """Row-wise OSCAR prox over the finite entries of z (rows, n); see GroupedProxFunction."""
    for r in range(z.shape[0]):
        _oscar_row(z, lam, x, group, sign, dlam, r)


@njit(parallel=True, cache=True)
def _oscar_parallel(z, lam, x, group, sign, dlam):
    for r in prange(z.shape[0]):
        _oscar_row(z, lam, x, group, sign, dlam, r)


oscar_rows = by_size(_oscar_serial, _oscar_parallel)


def oscar_prox(
    z: Tensor, lam: float | Tensor, dim: int = -1, mask: Tensor | None = None
) -> Tensor:
    """Exact prox of lam * OSCAR along ``dim``, differentiable in z and lam (closed form).

    Args:
        z: scores, any shape, float32 or float64. The kernel runs on the CPU in float64
            (numba; rows in parallel when numba has several threads); CUDA tensors make a
            round trip to the host.
        lam: strength >= 0, a float or a 0-dim tensor.
        dim: the dimension holding the cells.
        mask: optional bool tensor broadcastable to ``z``. False cells and ``-inf`` scores
            take no part in the penalty (no pairs with them) and come out as ``-inf`` with
            zero gradient.

    Raises:
        ValueError: lam < 0, NaN or ``+inf`` scores, or a row with every cell masked.
    """
    return grouped_prox(z, lam, dim, mask, "oscar_prox", oscar_rows)


@half_in_float32
def oscarmax(
    z: Tensor, lam: float | Tensor, dim: int = -1, mask: Tensor | None = None
) -> Tensor:
    """oscarmax(z) = sparsemax(prox_{lam OSCAR}(z)) along ``dim`` (Niculae & Blondel, 2017).

    As in the paper, this composition is used as the mapping although it only approximates
    the OSCAR-regularized projection onto the simplex. OSCAR acts on |z|, so unlike the other
    mappings oscarmax is not invariant to adding a constant to the scores; it is invariant
    to permutations. Backward: sparsemax JVP, then the signed average over each cluster.

    Args:
        z: scores, any shape, float32 or float64 (float16 and bfloat16 in float32; CUDA:
            host round trip for the prox).
        lam: OSCAR strength >= 0 (float or 0-dim tensor); lam = 0 is exactly sparsemax.
            The paper's default for oscarmax is 0.01.
        dim: dimension to normalize over.
        mask: optional bool tensor broadcastable to ``z``; False cells (and ``-inf``
            scores) get exactly 0 weight and 0 gradient and take no part in the penalty.

    Raises:
        ValueError: lam < 0, NaN or ``+inf`` scores, or a row with every cell masked.
    """
    return sparsemax_of_prox(oscar_rows, z, lam, dim, mask, "oscarmax")


class Oscarmax(LamFlatGridMapping):
    """Oscarmax over the H*W cells of each grid (clusters need not be adjacent).

    Args:
        lam: OSCAR strength >= 0.
    """

    function = staticmethod(oscarmax)
