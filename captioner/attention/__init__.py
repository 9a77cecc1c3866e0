"""Attention mappings: scores -> probability weights, dense, sparse or structured.

Functional API (``z`` scores, ``mask`` bool with True = may attend):

* :func:`softmax`, :func:`sparsemax` (Martins & Astudillo, 2016)
* :func:`entmax15` (exact) and :func:`entmax_bisect` (any alpha > 1, differentiable in
  alpha) (Peters et al., 2019; Correia et al., 2019)

Every mapping validates its input (ValueError on NaN, ``+inf`` or fully masked rows).
Modules share ``forward(scores (..., H, W), mask=None) -> weights (..., H, W)``;
:func:`build` constructs them by name (:data:`MAPPINGS`).
"""

from .entmax import Entmax, Entmax15, entmax15, entmax_bisect
from .registry import MAPPINGS, build
from .softmax import Softmax, softmax
from .sparsemax import Sparsemax, sparsemax

__all__ = [
    "MAPPINGS",
    "Entmax",
    "Entmax15",
    "Softmax",
    "Sparsemax",
    "build",
    "entmax15",
    "entmax_bisect",
    "softmax",
    "sparsemax",
]
